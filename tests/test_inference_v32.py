"""DeepSeek-V3.2's lightning indexer at prefill in ``cabe infer``: its fp32 (b, s, H_I, t) scores, the broadcast copy
of its keys, and the layer's locals around it (:func:`cabe.inference.indexer_moments`). Hand-checked with the
arithmetic written out on the tiny config, then against a real forward of the transformers model (CPU, bf16, under
``torch.no_grad``) recorded by cabe's :class:`cabe.trace.tracker.AllocationTracker`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cabe import families
from cabe.inference import estimate_inference, forward_bytes, indexer_moments, indexer_prefill_bytes, prefill_chunks
from cabe.models import preset

TINY = json.loads((Path(__file__).resolve().parent / "configs/files/deepseek_v32_tiny_config.json").read_text())
SPEC = families.from_config(TINY)


def test_tiny_indexer_moments_by_hand():
    # h 256, 8 heads, q_lora_rank 96, kv_lora_rank 64, rope 32, nope 64, v 64 (a q / k head 96 wide);
    # indexer: H_I 4 heads of D_I 64, top-k 128; 2 sequences of 256 tokens in one prefill, 16-bit activations
    m = indexer_moments(SPEC, 2, 256, 256)
    bs = 2 * 2 * 256  # bytes × batch × tokens
    assert m["layer_inputs"] == bs * 2 * 256 == 524_288
    # q_resid 96, q_b_proj 8·96, kv_a_proj 64 + 32, rotated q_rot 8·32, query_states 8·96 per token; kv_b_proj's
    # output 8·(64 + 64) and key_states 8·96 per cached token
    assert m["attention_locals"] == bs * (96 + 768 + 96 + 256 + 768) + bs * 8 * (128 + 96) == 3_866_624
    # wq_b's output 4·64, rotated q_rot 4·32, the cat'd q 4·64, k_norm's output 64, rotated k_rot 32
    assert m["indexer_locals"] == bs * (256 + 128 + 256 + 64 + 32) == 753_664
    # q.float() 4·2·256·4·64, k.float() 4·2·256·64, k broadcast per query 4·2·256·64·256, scores 4·2·256·4·256
    assert m["matmul"] == 524_288 + 131_072 + 33_554_432 + 2_097_152 == 36_306_944
    assert m["scaled"] == 2 * 2_097_152
    # scores, weights_proj's output (2 B) with its fp32 cast and scaled copy (4 B each) per head, then topk's moment:
    # the (b, s, t) fp32 index scores, fp32 values + int64 indices + their int32 cast of 128 per query
    assert m["selection"] == 2_097_152 + 2 * 256 * 4 * (2 + 4 + 4) + 4 * 2 * 256 * 256 + 16 * 2 * 256 * 128
    assert indexer_prefill_bytes(SPEC, 2, 256, 256) == 524_288 + 3_866_624 + 753_664 + 36_306_944 == 41_451_520


def test_tiny_estimate_takes_the_indexer_when_it_is_the_larger():
    # a prompt of 256 tokens, one token generated (generate: the prompt is the context less the new tokens)
    est = estimate_inference(SPEC, context=257, new_tokens=1, batch=2)
    step = next(s for s in est["steps"] if s["key"] == "infer.indexer")
    assert step["bytes"] == 41_451_520 > forward_bytes(SPEC, 2 * 256)
    assert est["components"]["activations"] == 41_451_520
    # 2 × 256 × 256 pairs × (4·4 + 4·64) B (the scores and the broadcast key), the rest per token
    assert step["params"] == {
        "b": 2,
        "s": 256,
        "t": 256,
        "per_pair": 272,
        "rest": 41_451_520 - 131_072 * 272,
        "heads": 4,
        "topk": 128,
    }
    # one sequence: no broadcast copy (a view), the scaled scores beside the scores make the moment
    one = next(s for s in estimate_inference(SPEC, context=257, new_tokens=1)["steps"] if s["key"] == "infer.indexer")
    assert one["params"]["per_pair"] == 2 * 4 * 4


def test_chunked_prefill_peaks_at_the_last_chunk_or_the_full_one_before():
    # torch.split(prompt, 96) of 256 tokens: 96, 96, 64 new tokens over 96, 192, 256 cached
    assert prefill_chunks(256, 96) == ((64, 256), (96, 192))
    assert prefill_chunks(256, 256) == ((256, 256),)
    est = estimate_inference(SPEC, context=257, new_tokens=1, batch=2, prefill_chunk=96)
    step = next(s for s in est["steps"] if s["key"] == "infer.indexer")
    assert (step["params"]["s"], step["params"]["t"]) == (96, 192)
    assert step["bytes"] == max(indexer_prefill_bytes(SPEC, 2, 64, 256), indexer_prefill_bytes(SPEC, 2, 96, 192))


def test_v32_exp_indexer_dominates_a_long_prefill():
    spec = preset("deepseek-v3.2-exp").spec
    est = estimate_inference(spec, context=32769, new_tokens=1)  # a prompt of 32768
    # one sequence: 2 × 4 B × 64 index heads per (query, key) pair, 32768² pairs: 550 GB
    assert est["components"]["activations"] > 2 * 4 * 64 * 32768**2 == 549_755_813_888
    # 70 times the working memory without it, 190 times the KV cache; at 128k tokens (8.8 TB) 13 times the fp8 weights
    assert est["components"]["activations"] > 70 * forward_bytes(spec, 32768)
    assert est["components"]["activations"] > 190 * est["components"]["kv_cache"]
    long = estimate_inference(spec, context=131073, new_tokens=1)["components"]
    assert long["activations"] > 13 * long["weights"]
    # a model without an indexer has no such step
    assert not any(s["key"] == "infer.indexer" for s in estimate_inference(preset("deepseek-v3").spec)["steps"])


@pytest.mark.slow
@pytest.mark.trace
@pytest.mark.parametrize(("batch", "cached", "new"), [(2, 0, 256), (1, 0, 256), (2, 192, 64)])
def test_indexer_moment_matches_a_real_forward(batch, cached, new):
    """A bf16 tiny V3.2 on the CPU (SDPA, as transformers picks it), ``use_cache=True``: the live bytes of layer 1
    at the indexer's peak, over those at the layer's entry, the cache's tensors apart (the KV cache's component),
    against :func:`indexer_prefill_bytes` less the residual (alive before the layer); the indexer's own peak over
    its entry against its locals and largest moment."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from cabe.trace.tracker import AllocationTracker

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**TINY)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, TINY["vocab_size"], (batch, cached + new))
    cache = transformers.DynamicCache(config=config)
    with torch.no_grad():
        if cached:
            model(ids[:, :cached], cache=cache, use_cache=True, logits_to_keep=1)
        tracker = AllocationTracker(device_type="cpu")
        for p in (*model.parameters(), *model.buffers()):
            tracker.record(p, "weight")  # their views (a transposed weight) cost nothing
        marks: dict[str, int] = {}
        layer = model.model.layers[1]

        def mark(name):
            return lambda *_: marks.__setitem__(name, len(tracker.events))

        hooks = [
            layer.register_forward_pre_hook(mark("layer_in")),
            layer.self_attn.indexer.register_forward_pre_hook(mark("indexer_in")),
            layer.self_attn.indexer.register_forward_hook(mark("indexer_out")),
        ]
        with tracker:
            model(ids[:, cached:], cache=cache, use_cache=True, logits_to_keep=1)
        for hk in hooks:
            hk.remove()
        kept = cache.layers[1]
        cached_ids = {tracker.aid_of(t) for t in (kept.keys, kept.values, kept.indexer_keys)}
    live, curve = 0, []
    for e in tracker.events:
        aid = abs(e) - 1
        if aid not in cached_ids and tracker.op_of[aid] != "weight":
            live += tracker.raw_size[aid] if e > 0 else -tracker.raw_size[aid]
        curve.append(live)

    def before(name):
        return curve[marks[name] - 1] if marks[name] else 0

    peak = max(curve[marks["indexer_in"] : marks["indexer_out"]])
    m = indexer_moments(SPEC, batch, new, cached + new)
    layer_at_peak = indexer_prefill_bytes(SPEC, batch, new, cached + new) - m["layer_inputs"] // 2
    assert peak - before("layer_in") == pytest.approx(layer_at_peak, rel=0.03)
    own = m["indexer_locals"] + max(m["matmul"], m["scaled"], m["selection"])
    assert peak - before("indexer_in") == pytest.approx(own, rel=0.03)
