"""cabe.generation: transformers' generate moment by moment (the prefill's top layer, its logits, the last decode
step), each mechanism's golden figure with its arithmetic. The trace of the same requests is
tests/trace/test_generate.py; the random differential benchmarks/differential/infer.py."""

from __future__ import annotations

import pytest

from cabe import generation
from cabe.errors import InvalidValueError
from cabe.inference import estimate_inference
from cabe.models import preset
from cabe.units import CUBLAS_WORKSPACE

L1 = preset("llama-3.2-1b").spec  # hidden 2048, 32 / 8 heads of 64, ffn 8192, 16 layers, vocab 128256


def test_new_tokens_default_and_range():
    assert generation.resolve_new_tokens(4096, None) == 256
    assert generation.resolve_new_tokens(100, None) == 50  # at most half the context
    assert generation.resolve_new_tokens(2, None) == 1
    assert generation.resolve_new_tokens(4096, 7) == 7
    with pytest.raises(InvalidValueError) as e:
        generation.resolve_new_tokens(64, 64)  # no prompt left
    assert (e.value.code, e.value.field) == ("out_of_range", "new_tokens")
    with pytest.raises(InvalidValueError):
        estimate_inference(L1, context=64, new_tokens=100)


def test_prefill_top_layer_at_its_mlp():
    """b = 2 sequences of a 2040-token prompt: per token 4 hidden copies (the embedding output, the layer's input,
    the residual after attention, the MLP's normed input), the MLP's activation, up_proj's output and their product
    (3 × 8192), and cos / sin (2 × 64), in bf16; every layer's KV cache written: 16 × 2 × 8 × 64 × 2 B per token."""
    m = generation.moments(
        L1, prompt=2040, new_tokens=8, batch=2, chunk=2040, act_dtype="bf16", kv_per_token=2 * 8 * 64 * 2
    )
    assert m["prefill"]["activations"] == 2 * 2040 * 2 * (4 * 2048 + 3 * 8192 + 2 * 64) == 268_431_360
    assert m["prefill"]["kv_cache"] == 2 * 2040 * 16 * 2048 == 133_693_440
    # the last decode step: 2047 tokens cached, one layer's keys of the step before live at the cat
    assert m["decode"]["kv_cache"] == 2 * 2047 * 16 * 2048 + 2 * 1024 * 2046
    est = estimate_inference(L1, weights="bf16", kv_dtype="bf16", context=2048, new_tokens=8, batch=2)
    assert est["peak_moment"] == "prefill"
    assert est["components"]["cuda_workspaces"] == CUBLAS_WORKSPACE
    assert est["total_bytes"] == est["components"]["weights"] + 133_693_440 + 268_431_360 + CUBLAS_WORKSPACE


def test_sliding_layers_hold_the_whole_prompt_after_the_prefill():
    """DynamicSlidingWindowLayer keeps a view of the cat (cache_utils.py:236-242): after a 2000-token prefill a
    512-token layer of Gemma 3 1B holds all 2000; at the last decode step its cat holds the window."""
    g3 = preset("gemma-3-1b").spec  # 26 layers: 22 sliding (512), 4 full; 1 KV head of 256
    per = 2 * 1 * 256 * 2
    m = generation.moments(g3, prompt=2000, new_tokens=16, batch=1, chunk=2000, act_dtype="bf16", kv_per_token=per)
    assert m["prefill"]["kv_cache"] == 26 * 2000 * per
    assert m["decode"]["kv_cache"] == (4 * 2015 + 22 * 512) * per + per // 2 * 2014
    # a chunked prefill: the window before the last chunk (511 tokens) and the chunk
    c = generation.moments(g3, prompt=2000, new_tokens=16, batch=1, chunk=256, act_dtype="bf16", kv_per_token=per)
    last = 2000 - 256 * 7  # 208
    assert c["prefill"]["kv_cache"] == (4 * 2000 + 22 * (511 + last)) * per


def test_static_cache_preallocates_the_whole_length():
    """StaticCache: max_cache_len = prompt + new tokens - 1 per layer, zeros from the first write; no cat."""
    m = generation.moments(
        L1, prompt=1000, new_tokens=24, batch=4, chunk=1000, act_dtype="fp16", kv_per_token=2048, cache="static"
    )
    assert m["prefill"]["kv_cache"] == m["decode"]["kv_cache"] == 4 * 2048 * 16 * 1023
    with pytest.raises(InvalidValueError):
        generation.moments(L1, prompt=8, new_tokens=1, batch=1, chunk=8, act_dtype="bf16", kv_per_token=1, cache="x")


def test_decode_gathers_each_routed_experts_weights():
    """At a decode step generate switches the experts to batched_mm (generation/utils.py:2500-2519), which gathers
    gate_up and down of each (token, expert) pair (integrations/moe.py:143-165): Mixtral's 2 of 8 experts of
    14336 × 4096, b = 8 tokens: 8 × 2 × 3 × 14336 × 4096 × 2 B = 5.6 GB."""
    mx = preset("mixtral-8x7b").spec
    w = generation.layer_working(mx, 8, 1, 2, decode=True)
    assert w == 8 * 2 * (4 * 4096 + 2 * 3 * 14336 * 4096 + 2 * 128)
    # the prefill's grouped_mm: the gathered input, gate_up's output, the activation and the product per pair
    assert generation.layer_working(mx, 1, 100, 2) == 100 * 2 * (4 * 4096 + 2 * (4096 + 4 * 14336) + 2 * 128)


def test_fp32_grouped_heads_run_the_math_kernel():
    """fp32 rules FlashAttention out and the memory-efficient kernel takes no grouped heads, so a mask-free
    attention of Llama's 32 / 8 heads runs the math kernel: its expanded keys and values, the scaled keys and the
    scores beside their softmax. Per query token of a 1024-token prefill: (3 × 32 × 64 × 4 + 2 × 32 × 4 × 1024 + 4)
    B per key, the queries' copy 32 × 64 × 4 B."""
    w = generation.layer_working(L1, 1, 1024, 4, ((1024, False),))
    base = 4 * (4 * 2048 + 2 * 64)
    assert w == 1024 * (base + (3 * 32 * 64 * 4 + 2 * 32 * 4 * 1024 + 4) + 32 * 64 * 4)
    # bf16: FlashAttention, no scores: the MLP is the moment
    assert generation.layer_working(L1, 1, 1024, 2, ((1024, False),)) == 1024 * 2 * (4 * 2048 + 3 * 8192 + 128)
