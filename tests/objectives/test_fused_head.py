"""TRL's fused LM head (cabe.objectives.fused_head), its bytes worked out by hand from trl 1.16.0's source."""

from cabe import models
from cabe.objectives.fused_head import fused_head, policy_outputs, scored_tokens
from cabe.precision import dtypes_for, resolve
from cabe.training import TrainingSetup

QWEN = models.preset("qwen2.5-0.5b").spec  # h = 896, V = 151,936


def _head(**kw):
    setup = resolve(TrainingSetup(**kw), QWEN.dtype)
    return fused_head(QWEN, setup, dtypes_for(setup), 3, top1=True)


def test_policy_head_of_a_lora_dpo_step():
    """4 rows (2 pairs) of 512 tokens, 128 of them prompt, bf16 under bf16 autocast (nothing cast):
    K = 4 × (512 - 128) = 1,536 scored positions, P = 4 × 511 = 2,044 shifted positions.
    Kept: the outputs over P (log-probs, entropy, mean logits: 3 × 8,176 B -> 3 × 8,192; is_top1 2,044 -> 2,048)
    and what the kernel saves: the mask (2,048), the compact hidden copy (1,536 × 896 × 2 = 2,752,512), the int64
    targets (12,288), log_z and entropy (2 × 6,144) = 2,805,760.
    Forward: the [1,536, 32,768] bf16 tile (100,663,296) beside the 7 fp32 statistics, then log_z, log-probs,
    entropy (and its temporary), mean logits (12 × 6,144) and three K-byte masks (3 × 1,536): 100,741,632, and CUDA's
    nonzero indices (1,536 × 2 × 8 = 24,576): 100,766,208."""
    f = _head(method="lora", dtype="bf16", autocast="bf16", batch=4, seq=512, objective="dpo", prompt_length=128)
    assert f.kept == 3 * 8192 + 2048 + 2048 + 2_752_512 + 12_288 + 2 * 6144 == 2_805_760
    assert f.forward_transient == 100_663_296 + 12 * 6144 + 3 * 1536 + 24_576 == 100_766_208


def test_full_head_backward_holds_the_fp32_weight_gradient():
    """A trained head: the fp32 grad_weight (V × h × 4 = 544,530,432) and its bf16 cast (272,265,216) at the tail of
    the backward, beside the fp32 grad_hidden (K × h × 4) and its cast."""
    lora = _head(method="lora", dtype="bf16", autocast="bf16", batch=4, seq=512, objective="dpo", prompt_length=128)
    full = _head(method="full", dtype="bf16", autocast="bf16", batch=4, seq=512, objective="dpo", prompt_length=128)
    assert full.backward_transient - lora.backward_transient == 151_936 * 896 * 4 + 151_936 * 896 * 2


def test_grpo_policy_head_scores_every_completion_token():
    """GRPO's policy asks for log-probs and entropy (grpo_trainer.py:1068-1073), no top-1; its rows are prompt +
    completion (96 + 32 = 128 tokens) with every completion token labelled (``labels[:, :-logits_to_keep] = -100``,
    grpo_trainer.py:1495-1496). 2 rows, LoRA, bf16 under bf16 autocast (nothing cast):
    K = 2 × 32 = 64 scored positions, P = 2 × 127 = 254 shifted positions.
    Kept: log-probs and entropy over P (2 × 1,016 B -> 2 × 1,024), the mask (254 -> 512), the compact hidden copy
    (64 × 896 × 2 = 114,688), the int64 targets (512), log_z and entropy (2 × 512) = 118,784.
    Forward: the [64, 32,768] bf16 tile (4,194,304) beside the 7 statistics, log_z, log-probs, entropy and its
    temporary (11 × 512), then CUDA's nonzero indices (64 × 16 = 1,024): 4,200,960.
    The final hidden states [2, 128, 896] bf16 (458,752) live beside it until the patched forward returns."""
    setup = resolve(
        TrainingSetup(
            method="lora",
            dtype="bf16",
            autocast="bf16",
            batch=2,
            seq=128,
            objective="grpo",
            prompt_length=96,
            max_completion_length=32,
        ),
        QWEN.dtype,
    )
    assert policy_outputs(setup) == (2, False)
    assert scored_tokens(setup) == 64
    f = fused_head(QWEN, setup, dtypes_for(setup), 2)
    assert f.kept == 2 * 1024 + 512 + 114_688 + 512 + 2 * 512 == 118_784
    assert f.forward_transient == 4_194_304 + 11 * 512 + 1024 == 4_200_960
    assert f.hidden_states == 2 * 128 * 896 * 2 == 458_752
    # under torch.no_grad (the old / reference log-probs): nothing saved, the mask returned (label_mask) kept;
    # the kernel's inputs (hidden copy and targets) live through its forward instead
    g = fused_head(QWEN, setup, dtypes_for(setup), 2, grad=False)
    assert g.kept == 2 * 1024 + 512
    assert g.forward_transient == f.forward_transient + 114_688 + 512
