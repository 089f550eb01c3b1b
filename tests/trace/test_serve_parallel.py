"""Rank 0 of a tensor-parallel prefill (cabe.trace.serve_parallel: transformers' tp_plan on PyTorch's fake process
group, a DynamicCache under no_grad) against the per-rank figures of cabe.serving_parallel."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe import families
from cabe import serving_parallel as sp
from cabe.trace.serve_parallel import trace_prefill
from cabe.units import CUBLAS_WORKSPACE
from configs import TINY

pytestmark = pytest.mark.trace

#: 4 layers of hidden 256, 4 heads (4 KV heads), ffn 688, vocab 2,048
CONFIG = dict(TINY["llama"], hidden_size=256, intermediate_size=688, num_hidden_layers=4, vocab_size=2048)
GQA = dict(CONFIG, intermediate_size=1024, num_key_value_heads=2)


@pytest.mark.parametrize("config,tp", [(CONFIG, 2), (CONFIG, 4), (GQA, 2)])
def test_tensor_parallel_prefill_rank0(config, tp):
    """Real CPU tensors, 2 prompts of 128 tokens. Measured 2026-12-07: the peak within 0.07% (tp 2: 5,829,120 B
    traced vs 5,833,216 B; tp 4: 3,328,512 vs 3,330,560; GQA at tp 2: 6,595,072 vs 6,599,168)."""
    traced = trace_prefill(config, tp=tp, context=128, batch=2, kind="cpu")
    spec = families.from_config(config, name="tiny")
    lay = sp.layout(spec, tp=tp)
    weights = sp.weights_per_rank(spec, lay, 0, "bf16")["total_bytes"]
    kv = sp.kv_per_rank(spec, lay, 0, 128, 2, "bf16")["kv_bytes"]
    # the weights: the plan's shards (q/k/v/gate/up by rows, o/down by columns, embedding and lm_head over the
    # vocabulary), the norms whole; up to the rotary inv_freq buffer (two 512-byte blocks)
    assert 0 <= traced["weights_bytes"] - weights <= 1024
    # the cache: this rank's KV heads (kv / tp) of every layer, keys and values, exactly
    assert traced["kv_bytes"] == kv == 2 * 4 * (spec.num_kv_heads // tp) * 64 * 2 * 128 * 2
    # the peak: weights + cache + transformers' TP working memory + the last position's logits gathered (16-bit)
    act = sp.activations_per_rank(spec, 2 * 128, tp, engine="hf", seq=128)
    assert traced["logits_bytes"] == 2 * 2048 * 2
    total = weights + kv + act + traced["logits_bytes"]
    assert abs(total - traced["peak_bytes"]) / traced["peak_bytes"] < 0.002


def test_fake_device_adds_the_cublas_workspace():
    """On the fake CUDA device the same rank holds one cuBLAS workspace more (the forward's: cabe.units)."""
    from cabe.trace import _native

    if not _native.available():  # another test module imported torch first in this worker (trace_prefill runs here)
        pytest.skip("the fake-CUDA shim is not loaded in this process")
    cpu = trace_prefill(CONFIG, tp=2, context=128, batch=2, kind="cpu")
    fake = trace_prefill(CONFIG, tp=2, context=128, batch=2, kind="fake")
    assert fake["peak_bytes"] - cpu["peak_bytes"] == CUBLAS_WORKSPACE
    assert (fake["weights_bytes"], fake["kv_bytes"]) == (cpu["weights_bytes"], cpu["kv_bytes"])


def test_llama_3_1_70b_tp8_on_fake_tensors():
    """The real shapes, rank 0 of 8 on the fake CUDA device, one prompt of 2,048 tokens. Measured 2026-12-07 (2.4 s):
    weights 17,640,735,744 B (the analytic 17,640,734,720 + the rotary buffer), KV 83,886,080 B (one KV head of 8),
    peak 17,994,155,008 B vs 17,994,361,344 analytic (+0.001%); at tp 4 35,716,137,984 vs 35,716,344,320."""
    from cabe import models
    from cabe.trace import _native

    if not _native.available():
        pytest.skip("the fake-CUDA shim is not loaded in this process")
    src = models.preset("llama-3.1-70b")
    config = {k: v for k, v in dict(src.config).items() if k != "_cabe"}
    traced = trace_prefill(config, tp=8, context=2048, batch=1, kind="fake")
    lay = sp.layout(src.spec, tp=8)
    weights = sp.weights_per_rank(src.spec, lay, 0, "bf16")["total_bytes"]
    assert weights == 17_640_734_720 and 0 <= traced["weights_bytes"] - weights <= 1024
    assert traced["kv_bytes"] == sp.kv_per_rank(src.spec, lay, 0, 2048, 1, "bf16")["kv_bytes"] == 83_886_080
    act = sp.activations_per_rank(src.spec, 2048, 8, engine="hf", seq=2048)
    total = weights + traced["kv_bytes"] + act + traced["logits_bytes"] + CUBLAS_WORKSPACE
    assert abs(total - traced["peak_bytes"]) / traced["peak_bytes"] < 0.001
