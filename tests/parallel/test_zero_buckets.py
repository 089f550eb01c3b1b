"""DeepSpeed ZeRO-2's bucket reduces in backward (cabe.parallel.zero ``_stage2_flushes``), golden figures against rank 0
of DeepSpeed 0.19.8 traced on a fake group (``cabe trace ... --shard zero2``), with their arithmetic."""

from __future__ import annotations

import pytest

from cabe import api
from cabe.models import preset

#: llama-3.1-8b cut to 4 layers (the ZeRO sampler's llama-3.1-8b-4l): embedding and lm_head 128,256 × 4,096 =
#: 525,336,576 elements each, over ``reduce_bucket_size`` (5e8)
LLAMA8_4L = {**preset("llama-3.1-8b").config, "num_hidden_layers": 4}
HEAD = 128_256 * 4_096


def _moments(report) -> dict[str, int]:
    return {m["where"]: m["total_bytes"] for m in report.extra["moments"]}


def test_oversized_head_gradient_reduced_whole_beside_its_cat():
    """Full fp32 on 16 GPUs: the lm_head's gradient is over ``reduce_bucket_size``, so it is not copied into the bucket
    (stage_1_and_2.py:1449-1453) but reduced alone at the final norm's hook, still in the loss head's backward: its
    rank slices (five partitions of 1.92e9 / 16) flattened into one fp32 ``cat`` (allreduce_and_scatter, 1546-1588:
    groups of just over 5e8 elements) beside the whole gradient and the fp32 bucket (5e8 × 4 B). Rank 0's partition
    lies in the embedding, reduced last: no ``grads_in_partition`` before the end of backward. Traced: 15,607,090,176 B
    at that moment (the lm_head's mm and its cat, 2,101,346,304 B each, and the 2e9 B bucket live)."""
    r = api.build(
        {"config": LLAMA8_4L, "method": "full", "dtype": "fp32", "autocast": "none", "param_dtype": "none"}
        | {"optimizer_impl": "fused", "shard": "zero2", "gpus": 16, "checkpointing": True, "batch": 2, "seq": 1024}
    )
    assert r.extra["peak_at"] == "head.flush"
    comps = r.components
    assert comps["reduce_flat"] == comps["whole_grad_reduced"] == 4 * HEAD  # (a multiple of 512 already)
    assert comps["ipg_buckets"] == 4 * 500_000_000
    assert "grads_in_partition" not in comps
    assert r.total_bytes == pytest.approx(15_607_090_176, rel=0.005)


def test_lora_bucket_in_the_adapters_dtype():
    """LoRA on a plain bf16 module keeps its adapters fp32 (peft), the optimizer's first parameter's dtype: stage 2's
    bucket is that dtype (``self.dtype``, stage_1_and_2.py:394; ``setup_buckets``, 3256-3279): 5e8 × 4 B. Traced on
    qwen2.5-0.5b, 64 GPUs: 3,655,014,912 B with the 2e9 B bucket (-27% with a bf16 one)."""
    r = api.build(
        {"model": "qwen2.5-0.5b", "method": "lora", "lora_rank": 64, "dtype": "bf16", "autocast": "none"}
        | {"optimizer_impl": "foreach", "shard": "zero2", "gpus": 64, "batch": 1, "seq": 512}
    )
    assert r.components["ipg_buckets"] == 4 * 500_000_000
    assert r.total_bytes == pytest.approx(3_655_014_912, rel=0.01)


@pytest.mark.parametrize(("model", "gpus", "in_layers"), [("llama-2-7b", 2, True), ("llama-3.2-1b", 16, False)])
def test_partition_made_at_the_reduce_that_holds_rank0s_gradients(model, gpus, in_layers):
    """``grads_in_partition`` is made at the first reduce holding one of rank 0's parameters (copy_grads_in_partition,
    stage_1_and_2.py:2184-2196): the flat order's first (the embedding, the bottom layers), the last reduced. llama-2-7b
    on 2 GPUs: rank 0's 3.37e9 elements reach its 16th layer from the bottom (131e6 + 16 × 202.4e6), whose gradients
    the bucket reduced at the 18th layer from the top (the 14th from the bottom) holds: from that moment on (and at the bottom layer's) the partition,
    half the model whole in bf16, is live. llama-3.2-1b on 16 GPUs: rank 0's 1.24e9 / 16 elements lie in the tied
    embedding's 262,668,288, reduced at the end: no layer's moment holds it."""
    r = api.build(
        {"model": model, "dtype": "fp32", "autocast": "none", "param_dtype": "bf16"}
        | {"shard": "zero2", "gpus": gpus, "batch": 1, "seq": 256}
    )
    m = _moments(r)
    gip = r.extra["distributed"]["per_gpu"]["gradients_bytes"]
    assert gip > 0
    assert ("bottom_layer.flush" in m) is in_layers
    if in_layers:
        assert m["layer_18_from_top.flush"] - m["layer_16_from_top.flush"] > 0.95 * gip


@pytest.mark.parametrize(
    ("dtype", "gpus", "batch", "traced"), [("fp32", 16, 4, 20_995_812_352), ("bf16", 64, 1, 16_129_968_128)]
)
def test_zero1_oversized_embedding_cat_beside_every_whole_gradient(dtype, gpus, batch, traced):
    """Stage 1 reduces after the backward, in the module's order (stage_1_and_2.py:958-978): the embedding first, over
    ``reduce_bucket_size``, so not copied into the bucket but flattened whole (its 525,336,576 elements in fp32:
    2,101,346,304 B) while every gradient is still whole beside the fp32 bucket (5e8 × 4 B): fp32, 7,692,500,992 B of
    ``.grad``; a plain bf16 module, the same in fp32 ``grad_accum`` (stage_1_and_2.py:1234-1240). A bucket copied
    into would have freed what it holds (one bucket: its cat in their place). On 64 GPUs the embedding's rank slices
    (partitions of 1.923e9 / 64 elements) are flattened 17 at a time, just over 5e8 (allreduce_and_scatter,
    stage_1_and_2.py:1546-1588): 510.8e6 elements, 2,043,320,832 B. Traced on rank 0, to the KiB."""
    r = api.build(
        {"config": LLAMA8_4L, "method": "full", "dtype": dtype, "autocast": "none", "param_dtype": "none"}
        | {"shard": "zero1", "gpus": gpus, "batch": batch, "seq": 128, "attention": "eager"}
        | ({"checkpointing": True, "optimizer_impl": "fused"} if dtype == "fp32" else {"optimizer_impl": "foreach"})
    )
    assert r.extra["peak_at"] == "end_of_backward"
    assert r.components["reduce_flat"] == (4 * HEAD if gpus == 16 else 2_043_320_832)
    assert r.components["gradients"] == 7_692_500_992
    assert r.total_bytes == pytest.approx(traced, rel=1e-4)


def test_zero3_fp32_master_cloned_and_step_gradient_flattened():
    """A plain fp32 module under stage 3: the optimizer's fp32 partition is a clone (stage3.py:1162-1171: the branch
    that would share the module's own fp32 partition compares a torch.device with the string ``"cuda:0"``, never
    equal), and step() flattens each sub-group's gradients into a new fp32 tensor (``_prepare_fp32_grad_for_sub_group``,
    stage3.py:2686-2687: a ``cat`` even in fp32). llama-3.2-1b on 4 GPUs: 1,235,814,400 B each (its 1.236e9 parameters
    / 4 in fp32, the partitions padded); traced on rank 0: the clone in setup, the optimizer phase 10,717,813,248 B."""
    r = api.build(
        {
            "model": "llama-3.2-1b",
            "dtype": "fp32",
            "autocast": "none",
            "param_dtype": "none",
            "optimizer_impl": "foreach",
        }
        | {"shard": "zero3", "gpus": 4, "batch": 4, "seq": 1024, "checkpointing": True}
    )
    assert r.components["master_weights"] == 1_235_814_400
    assert r.phase_peaks["optimizer"] == pytest.approx(10_717_813_248, rel=1e-4)


def test_zero3_lone_oversized_gradient_reduced_in_place_when_the_world_divides_it():
    """ZeRO-3: qwen2.5-7b's lm_head gradient (152,064 × 3,584 = 544,997,376 elements, over ``reduce_bucket_size``) is
    not copied into the bucket (stage3.py:1626) and is reduced alone at the final norm's hook, in the loss head's
    backward, beside its whole self (1,089,994,752 B in bf16). ``reduce_scatter_coalesced`` reduces a lone tensor the
    world divides in place (coalesced_collectives.py:101-104: 28 divides it) and otherwise concatenates its padded
    partitions (29: ceil(544,997,376 / 29) × 29 × 2 B = 1,089,995,264 B, rounded as allocated). By then the lm_head's
    backward has released its weight and two fetches have prefetched a bucket each: 602e6 elements gathered (traced,
    1011e6 at the lm_head). Traced on 29 GPUs: 9,464,024,576 B at that moment."""
    rise = {}
    for gpus in (28, 29):
        r = api.build(
            {"model": "qwen2.5-7b", "dtype": "fp32", "autocast": "none", "param_dtype": "bf16"}
            | {"shard": "zero3", "gpus": gpus, "batch": 1, "seq": 128}
        )
        m = _moments(r)
        rise[gpus] = m["head.flush"] - m["head"]
    assert r.extra["peak_at"] == "head.flush"
    assert r.components["whole_grad_reduced"] == 1_089_994_752
    assert r.components["reduce_scatter_input"] == 1_089_995_264
    assert r.components["gathered_params"] == pytest.approx(2 * 601.9e6, rel=0.001)
    assert r.total_bytes == pytest.approx(9_464_024_576, rel=0.001)
    # the cat alone tells 29 GPUs from 28 at that moment (the rest scales by 1/N: within 0.2 GB)
    assert rise[29] - rise[28] == pytest.approx(1_089_995_264, abs=0.2e9)


def test_zero1_single_bucket_cat_takes_the_gradients_place():
    """ZeRO-1 whose gradients fit one bucket: each whole fp32 ``grad_accum`` is freed as it is copied into the bucket
    (stage_1_and_2.py:1455-1461), so the bucket's ``cat`` (allreduce_bucket, 2367) replaces them rather than sitting
    beside them. gpt2 bf16, its top 9 layers trained on 64 GPUs (63.8e6 elements, one 5e8 bucket): at the reduce the
    cat and no whole gradient. Traced on rank 0: 2,593,736,704 B (+9.6% with both counted)."""
    r = api.build(
        {"model": "gpt2", "method": "freeze", "trainable_layers": 9, "dtype": "bf16", "autocast": "none"}
        | {"optimizer_impl": "fused", "shard": "zero1", "gpus": 64, "batch": 4, "seq": 128}
    )
    assert r.total_bytes == pytest.approx(2_593_736_704, rel=0.01)
    # the reduce's moment: the weights, states, bucket and cat (= the gradients, 4 B × 63.8e6), rank 0's partition
    end = _moments(r)["end_of_backward"]
    assert end == pytest.approx(2_587_100_160, rel=1e-6)
    assert end < 2_593_736_704 + 0.5 * 255_163_392  # (both counted: 2,842,263,552)


def test_zero2_step_moments_one_after_the_other():
    """Stages 1/2's step: the fp64 norm of each partition piece beside ``grads_in_partition`` (get_grad_norm_direct,
    stage_1_and_2.py:2684), then the flat partition and its fp32 cast, then -- ``grads_in_partition`` freed
    (3118-3122) -- the optimizer's temporaries beside the fp32 partition: the largest of the three, not their sum.
    llama-3.1-8b at 4 layers, DeepSpeed's bf16 mode, 4 GPUs: rank 0's 480.8e6-element partition lies in the embedding
    (whole in grads_in_partition: 525,336,576 × 2 B), its fp64 norm 8 B × 480.8e6; traced 14,579,660,800 B at the norm
    (+13.2% with the optimizer's temporaries added)."""
    r = api.build(
        {"config": LLAMA8_4L, "method": "full", "dtype": "fp32", "autocast": "none", "param_dtype": "bf16"}
        | {"optimizer_impl": "foreach", "shard": "zero2", "gpus": 4, "batch": 2, "seq": 256}
    )
    assert r.peak_phase == "optimizer"
    assert r.components["gradients"] == 2 * HEAD
    assert r.total_bytes == pytest.approx(14_579_660_800, rel=1e-5)


@pytest.mark.parametrize(
    ("kw", "traced"),
    [
        ({"param_dtype": "none", "gpus": 4, "batch": 4, "seq": 1024, "checkpointing": True}, 19_225_659_392),
        (
            {"param_dtype": "none", "gpus": 32, "seq": 128, "attention": "eager", "optimizer_impl": "fused"},
            9_136_681_984,
        ),
        ({"param_dtype": "bf16", "gpus": 64, "seq": 128, "optimizer_impl": "fused"}, 4_518_513_152),
    ],
)
def test_zero3_prefetch_window_fills_to_max_live_parameters(kw, traced):
    """ZeRO-3's prefetcher runs at every module's fetch (a dozen per decoder layer, containers included) and tops the
    gathered parameters up to ``max_live_parameters`` (1e9 elements) each time (partitioned_param_coordinator.py:450-
    488); what it pops is marked fetched for its later use and not released (466-468, 634-664). llama-3.2-1b (1.24e9
    parameters): about 1e9 elements gathered at the loss head and, at a flush in the layers, what is left of the
    backward up to 1e9. Traced on rank 0 (one prefetch bucket instead: -15.9%, -8.5%, -8.6%)."""
    r = api.build(
        {"model": "llama-3.2-1b", "dtype": "fp32", "autocast": "none", "optimizer_impl": "foreach", "shard": "zero3"}
        | {"batch": 1, "attention": "sdpa"}
        | kw
    )
    per = 4 if kw["param_dtype"] == "none" else 2
    assert r.components["gathered_params"] <= per * (1e9 + 2048 * 8192)  # (the crossing module included)
    assert r.total_bytes == pytest.approx(traced, rel=0.003)
