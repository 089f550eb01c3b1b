"""Per-GPU memory of a tensor- / pipeline-parallel serving replica (cabe.serving_parallel), golden figures worked
from vLLM's sharding rules (sources in the module's docstring)."""

from __future__ import annotations

import pytest

from cabe import families, models
from cabe import serving_parallel as sp
from cabe.errors import InvalidValueError
from cabe.inference import estimate_inference

LLAMA70 = models.preset("llama-3.1-70b").spec
#: one Llama-3.1-70B decoder layer's matrices: q and o 8192², k and v 8192 × 1024, gate, up, down 8192 × 28672
LAYER = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672  # 855,638,016
NORMS = 80 * 2 * 8192 + 8192  # two RMSNorms per layer and the final one: 1,318,912


def test_llama_70b_tp8_weights_per_gpu():
    lay = sp.layout(LLAMA70, tp=8)
    w = sp.weights_per_rank(LLAMA70, lay, 0, "bf16")
    # vocab 128,256 is 2,004 × 64 (no padding): 16,032 rows per rank for the embedding and the untied lm_head
    assert w["vocab_rows"] == 128_256 // 8 == 16_032
    assert w["total_bytes"] == 2 * (80 * LAYER // 8 + 2 * 16_032 * 8192 + NORMS) == 17_640_734_720


def test_tp1_is_the_single_gpu_weights():
    est = estimate_inference(LLAMA70, weights="bf16", context=4096)
    assert sp.weights_per_rank(LLAMA70, sp.layout(LLAMA70), 0, "bf16")["total_bytes"] == est["weights"]["total_bytes"]
    par = sp.per_gpu(LLAMA70, est, sp.layout(LLAMA70, tp=1, gpus=2), weights="bf16")
    assert par["dp"] == 2 and par["stages"][0]["components"] == est["components"]  # dp changes nothing per GPU


@pytest.mark.parametrize("fmt", ["fp8", "awq-4bit", "nf4", "gguf-q4_k_m"])
def test_quantized_formats_split_like_their_matrices(fmt):
    """At tp 1 every format is the single-GPU figure of cabe.weights; at tp 2 the matrices halve, the rest stays."""
    from cabe.weights import weights_bytes

    one = sp.weights_per_rank(LLAMA70, sp.layout(LLAMA70), 0, fmt)
    assert abs(one["total_bytes"] - weights_bytes(LLAMA70, fmt)["total_bytes"]) <= 1
    two = sp.weights_per_rank(LLAMA70, sp.layout(LLAMA70, tp=2), 0, fmt)
    assert two["layer_bytes"] == pytest.approx(one["layer_bytes"] / 2, abs=2)


def test_kv_heads_replicated_below_tp():
    """8 KV heads: tp 8 keeps one per GPU (1/8 of the cache), tp 16 still one (replicated twice), so 1/8 too."""
    full = 2 * 80 * 8 * 128 * 2 * 8192  # 2,684,354,560 B at 8,192 tokens, fp16
    for tp in (8, 16):
        kv = sp.kv_per_rank(LLAMA70, sp.layout(LLAMA70, tp=tp), 0, 8192, 1, "fp16")
        assert kv["kv_heads"] == 1 and kv["kv_bytes"] == full // 8 == 335_544_320
    w16 = sp.weights_per_rank(LLAMA70, sp.layout(LLAMA70, tp=16), 0, "bf16")
    # k and v: 1/8 each (one whole head of the 8) where every other matrix is 1/16
    other = 2 * 8192 * 8192 + 3 * 8192 * 28672
    assert w16["layer_bytes"] == 2 * 80 * (other // 16 + 2 * 8192 * 1024 // 8)


def test_latent_attention_cache_is_whole_on_every_rank():
    spec = models.preset("deepseek-v3").spec
    assert sp.kv_share(spec, 8) == 1.0


@pytest.mark.parametrize(
    "layers,pp,parts",
    [
        (80, 3, (27, 27, 26)),  # 26 each, the remainder 2 on the stages before the last: partitions[-2], [-3]
        (30, 4, (7, 8, 8, 7)),
        (32, 4, (8, 8, 8, 8)),
        (5, 2, (3, 2)),
    ],
)
def test_get_pp_indices(layers, pp, parts):
    assert sp.pp_partition(layers, pp) == parts


def test_pipeline_stages_hold_their_layers_and_ends():
    lay = sp.layout(LLAMA70, tp=4, pp=2)
    first, last = (sp.weights_per_rank(LLAMA70, lay, s, "bf16") for s in (0, 1))
    assert first["embedding_bytes"] == last["lm_head_bytes"] == 2 * 32_064 * 8192
    assert first["lm_head_bytes"] == last["embedding_bytes"] == 0
    assert first["layer_bytes"] == last["layer_bytes"] == 2 * 40 * LAYER // 4
    given = sp.layout(LLAMA70, pp=2, partition="50,30")
    assert given.partition == (50, 30)
    assert sp.weights_per_rank(LLAMA70, given, 1, "bf16")["layer_bytes"] == 2 * 30 * LAYER


def test_communication_buffers():
    """NCCL: 24 channels × (Simple 4 MiB + LL128 4,915,200 B + LL 524,288 B); vLLM's custom all-reduce for 2, 4, 6 or
    8 GPUs: the IPC input buffer and the signal + scratch buffer (8 MiB each, + 2,560 B), 8 MiB of rank data."""
    c = sp.comm_buffers(sp.Layout(tp=8, partition=(80,)), 0)
    assert c["nccl_tp"] == 24 * (4_194_304 + 4_915_200 + 524_288) == 231_211_008
    assert c["custom_all_reduce"] == 2 * 8_388_608 + 2_560 and c["custom_all_reduce_torch"] == 8_388_608
    three = sp.comm_buffers(sp.Layout(tp=3, partition=(80,)), 0)
    assert three["custom_all_reduce"] == 0 and three["nccl_tp"] == 231_211_008
    middle = sp.comm_buffers(sp.Layout(pp=3, partition=(27, 27, 26)), 1)
    assert middle["nccl_pp"] == 2 * 2 * 4_194_304 and middle["nccl_tp"] == 0


def _spec(**kw):
    base = dict(
        model_type="llama",
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=4,
        num_attention_heads=12,
        num_key_value_heads=3,
        vocab_size=1000,
    )
    return families.from_config({**base, **kw}, name="t")


@pytest.mark.parametrize(
    "kw,code",
    [
        ({"tp": 8}, "tp_not_divisor"),  # 12 heads
        ({"tp": 2}, "tp_kv_heads"),  # 3 KV heads: neither a multiple of 2 nor a divisor of it
        ({"pp": 5}, "out_of_range"),  # 4 layers
        ({"tp": 2, "gpus": 3}, "gpus_not_divisible"),
        ({"ep": 2}, "ep_without_experts"),
        ({"pp": 2, "partition": "1,2"}, "pp_partition"),
        ({"pp": 2, "partition": "a,b"}, "pp_partition"),
        ({"pp": 2, "partition": [2.5, 1.5]}, "pp_partition"),
        ({"tp": "2"}, "not_integer"),
        ({"gpus": 0}, "out_of_range"),
    ],
)
def test_impossible_splits_are_typed_errors(kw, code):
    with pytest.raises(InvalidValueError) as err:
        sp.layout(_spec(), **kw)
    assert err.value.code == code


def test_vocab_padding():
    """1,000 pads to 1,024 (16 × 64); tp 3 does not divide 64: SGLang pads to 64 × 3 = 192, 1,152 rows."""
    assert sp.padded_vocab(_spec(), 4) == 1024 and sp.padded_vocab(_spec(), 3) == 1152


def test_moe_expert_parallel():
    spec = models.preset("mixtral-8x7b").spec
    with pytest.raises(InvalidValueError) as err:
        sp.layout(spec, tp=2, ep=4)
    assert err.value.code == "ep_serving"
    tp = sp.weights_per_rank(spec, sp.layout(spec, tp=4), 0, "bf16")
    ep = sp.weights_per_rank(spec, sp.layout(spec, tp=4, ep=4), 0, "bf16")
    # 8 experts over 4 ranks whole, or every expert at a quarter of its width: the same bytes per GPU
    assert ep["total_bytes"] == tp["total_bytes"]


def test_fit_and_pool_per_gpu():
    from cabe import gpus

    est = estimate_inference(LLAMA70, weights="bf16", context=8192)
    par = sp.per_gpu(LLAMA70, est, sp.layout(LLAMA70, tp=8), weights="bf16")
    f = sp.fit(par, gpus.gpu("h100-sxm"))
    st = par["stages"][0]
    assert f["fits"] and f["needed_bytes"] == st["reserved_bytes"] + st["non_torch_bytes"] + 603_979_776
    # the sequences the pool holds are vLLM's answer on this GPU (tests/test_infer_parallel.py), not fit's
    assert "sequences_per_replica" not in f
