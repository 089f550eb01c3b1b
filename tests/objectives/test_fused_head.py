"""TRL's fused LM head (cabe.objectives.fused_head), its bytes worked out by hand from trl 1.16.0's source."""

from cabe import models
from cabe.objectives.fused_head import fused_head
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
