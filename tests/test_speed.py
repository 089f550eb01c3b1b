"""The serving speed bounds (cabe.speed): golden figures from the catalog's spec-sheet figures."""

from __future__ import annotations

import pytest

from cabe import gpus, models, speed
from cabe import serving_parallel as sp

LLAMA70 = models.preset("llama-3.1-70b").spec
H100 = gpus.gpu("h100-sxm")  # 3,350 GB/s, 989.4 dense bf16 TFLOPS


def test_decode_upper_bound_llama_70b():
    """One H100, batch 1, 4,096 tokens: 141,107,412,992 B of bf16 weights + 2 × 80 × 8 × 128 × 2 B × 4,096 =
    1,342,177,280 B of KV read per step, at 3.35e12 B/s: 42.52 ms, 23.52 tokens/s at best."""
    d = speed.decode_bound(LLAMA70, H100, sp.layout(LLAMA70), context=4096, batch=1, weights="bf16")
    assert d["bound"] == "upper"
    assert d["stages"][0]["bytes"] == 141_107_412_992 + 1_342_177_280
    assert d["tokens_per_second"] == pytest.approx(3.35e12 / (141_107_412_992 + 1_342_177_280))
    # tp 8: each GPU reads 17,640,734,720 B of weights and 167,772,160 B of KV at once: 188.1 tokens/s
    d8 = speed.decode_bound(LLAMA70, H100, sp.layout(LLAMA70, tp=8), context=4096, batch=1, weights="bf16")
    assert d8["tokens_per_second"] == pytest.approx(3.35e12 / (17_640_734_720 + 167_772_160))
    # batch 32: the weights once, every sequence's KV: 32 / ((w + 32 × kv) / bw)
    d32 = speed.decode_bound(LLAMA70, H100, sp.layout(LLAMA70, tp=8), context=4096, batch=32, weights="bf16")
    assert d32["tokens_per_second"] == pytest.approx(32 * 3.35e12 / (17_640_734_720 + 32 * 167_772_160))


def test_pipeline_rounds():
    """pp 2, batch 1: one micro-batch passes both stages in turn (the per-sequence latency); batch 2: two in flight,
    a round lasts the busier stage reading its weights twice (or one pass, whichever is longer)."""
    lay = sp.layout(LLAMA70, pp=2)
    one = speed.decode_bound(LLAMA70, H100, lay, context=1024, batch=1, weights="bf16")
    assert one["micro_batches"] == 1
    assert one["tokens_per_second"] == pytest.approx(one["tokens_per_second_per_sequence"])
    two = speed.decode_bound(LLAMA70, H100, lay, context=1024, batch=2, weights="bf16")
    st = two["stages"]
    busiest = max(2 * s["weights_read_bytes"] + s["kv_read_bytes"] for s in st)
    one_pass = sum(s["weights_read_bytes"] + s["kv_read_bytes"] / 2 for s in st)
    assert two["tokens_per_second"] == pytest.approx(2 * 3.35e12 / max(busiest, one_pass))


def test_moe_reads_the_experts_picked():
    """Mixtral: 2 of 8 experts per token. Batch 1 reads 2; batch 32 the expected distinct 8 × (1 − 0.75^32)."""
    assert speed.distinct_experts(8, 2, 1) == pytest.approx(2.0)
    assert speed.distinct_experts(8, 2, 32) == pytest.approx(8 * (1 - 0.75**32))
    spec = models.preset("mixtral-8x7b").spec
    lay = sp.layout(spec)
    w = sp.weights_per_rank(spec, lay, 0, "bf16")["total_bytes"]
    e = sp.expert_bytes_per_rank(spec, lay, 0, "bf16")
    d = speed.decode_bound(spec, H100, lay, context=1, batch=1, weights="bf16")
    assert d["stages"][0]["weights_read_bytes"] == round(w - e + e * 2 / 8)


def test_prefill_lower_bound_llama_70b():
    """4,096 tokens: 2 × 69,501,714,432 active weights (80 layers' matrices + the lm_head 128,256 × 8192) per token,
    plus QKᵀ and A·V: 2 × 2·8192 × 80 layers × 4,096 keys per token, over the causal half, at 989.4 TFLOPS."""
    p = speed.prefill_bound(LLAMA70, H100, sp.layout(LLAMA70), context=4096, batch=1, weights_format="bf16")
    n = 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672) + 128_256 * 8192
    assert n == 69_501_714_432
    flops = 2 * n * 4096 + 2 * 16384 * 80 * 4096 * 4096 / 2
    assert p["bound"] == "lower" and p["flops"] == pytest.approx(flops)
    assert p["seconds"] == pytest.approx(flops / 989.4e12)
    # on 8 GPUs, an eighth; fp8 weights on a card with fp8 tensor cores: W8A8 at twice the 16-bit peak
    p8 = speed.prefill_bound(LLAMA70, H100, sp.layout(LLAMA70, tp=8), context=4096, batch=1, weights_format="fp8")
    assert p8["seconds"] == pytest.approx(flops / (2 * 989.4e12 * 8))
    a100 = speed.prefill_bound(
        LLAMA70, gpus.gpu("a100-80gb-sxm"), sp.layout(LLAMA70), context=4096, batch=1, weights_format="fp8"
    )
    assert a100["tflops_peak"] == 312.0  # no fp8 tensor cores on Ampere
