"""Inference: weights by format, KV cache (GQA, sliding windows, fp8), serving pool, solver, CLI, bad input."""

from __future__ import annotations

import json

import pytest

from cabe import generation, gpus
from cabe.cli import main
from cabe.errors import InvalidValueError
from cabe.inference import estimate_inference, fit_inference, infer_json, max_batch, max_context, serving
from cabe.kv_cache import kv_bytes_per_token, kv_cache_bytes
from cabe.models import preset
from cabe.weights import weights_bytes

L2 = preset("llama-2-7b").spec
L3 = preset("llama-3.1-8b").spec
MISTRAL = preset("mistral-7b-v0.1").spec


def test_llama2_7b_fp16_weights_13_48_gb():
    assert round(weights_bytes(L2, "fp16")["total_bytes"] / 1e9, 2) == 13.48


@pytest.mark.parametrize(
    "fmt,gb",
    [
        ("gguf-q4_k_m", 4.08),  # TheBloke's llama-2-7b.Q4_K_M.gguf: 4.08 GB
        ("gguf-q8_0", 7.16),  # llama-2-7b.Q8_0.gguf: 7.16 GB
        ("gptq-4bit", 3.90),  # TheBloke/Llama-2-7B-GPTQ main (g128): 3.90 GB
    ],
)
def test_quantized_file_sizes(fmt, gb):
    assert weights_bytes(L2, fmt)["total_bytes"] / 1e9 == pytest.approx(gb, abs=0.03)


def test_format_order():
    sizes = [
        weights_bytes(L2, f)["total_bytes"]
        for f in ("fp32", "fp16", "int8", "gguf-q6_k", "gguf-q4_k_m", "nf4", "gguf-q3_k_m", "gguf-q2_k")
    ]
    assert sizes == sorted(sizes, reverse=True)


def test_kv_cache_per_token_llama31_8b():
    assert kv_bytes_per_token(L3, "fp16") == 2 * 32 * 8 * 128 * 2 == 131_072
    assert kv_bytes_per_token(L3, "fp8") == 65_536
    assert kv_cache_bytes(L3, 8192, 4) == 4 * 8192 * 131_072


def test_sliding_window_caps_the_cache():
    # Mistral-7B-v0.1: every layer has a 4096-token window
    assert kv_cache_bytes(MISTRAL, 32768) == kv_cache_bytes(MISTRAL, 4096)
    assert kv_cache_bytes(MISTRAL, 32768, cap_sliding=False) == 8 * kv_cache_bytes(MISTRAL, 4096)
    g2 = preset("gemma-2-9b").spec  # half the layers slide (4096), half are global
    grow = kv_cache_bytes(g2, 8192) - kv_cache_bytes(g2, 4096)
    assert grow == 4096 * 21 * 2 * 8 * 256 * 2


def test_generation_keeps_last_token_logits_only():
    """generate keeps the last position's logits (logits_to_keep=1, transformers 5.25 generation/utils.py:2958-2959)
    and their fp32 copy (l.3251): at the last decode step the previous step's fp32 copy beside the new 16-bit logits,
    2 × 128256 × (4 + 2) B; at the prefill the 16-bit logits beside the larger of the final hidden states and their
    fp32 copy. Scoring (mode prefill) keeps every position's."""
    m = generation.moments(
        L3, prompt=3840, new_tokens=256, batch=2, chunk=3840, act_dtype="bf16", kv_per_token=131_072 / 32
    )
    assert m["decode"]["logits"] == 2 * 128256 * 6
    assert m["prefill_logits"]["logits"] == 2 * 128256 * 2 + max(2 * 3840 * 4096 * 2, 2 * 128256 * 4)
    pre = estimate_inference(L3, context=4096, batch=2, mode="prefill")
    assert pre["components"]["logits"] == 2 * 4096 * 128256 * 6
    # the default: 256 tokens generated after a prompt of 3840, whose prefill peaks at the top layer's MLP
    gen = estimate_inference(L3, context=4096, batch=2)
    assert (gen["new_tokens"], gen["prompt_tokens"], gen["peak_moment"]) == (256, 3840, "prefill")
    # a chunked prefill (3840 = 7 × 512 + 256) peaks at its last chunk: 256 queries over 3840 cached keys under a mask,
    # so transformers expands the 8 KV heads to 32 with repeat_kv (integrations/sdpa_attention.py:127-128). Per query
    # token: 4 hidden copies and cos/sin, 2 × (4 × 4096 + 2 × 128) B, the bool mask's 3840 B and its bf16 copy
    # 2 × 3840 B, the expanded keys and values 2 × 32 × 128 × 2 × 3840 / 256 B, the output 32 × 128 × 2 B
    chunked = estimate_inference(L3, context=4096, batch=2, prefill_chunk=512)
    per_token = 2 * (4 * 4096 + 2 * 128) + 3840 + 2 * 3840 + 2 * 32 * 128 * 2 * 3840 // 256 + 32 * 128 * 2
    assert chunked["components"]["activations"] == 2 * 256 * per_token == 152_961_024
    assert per_token * 256 > 512 * 2 * (4 * 4096 + 2 * 128 + 3 * 14336)  # more than a 512-token chunk's MLP


def test_serving_pool_and_solver():
    card = gpus.gpu("a100-80gb")
    s = serving(L3, card, context=8192)
    per_seq = 8192 * 131_072  # 512 blocks of 16 tokens
    assert s["max_concurrent_sequences"] == s["kv_pool_bytes"] // per_seq
    assert s["kv_pool_bytes"] == int(
        0.9 * card.memory_bytes - s["weights_bytes"] - s["activation_profile_bytes"] - card.cuda_context_bytes
    )
    lower = serving(L3, card, context=8192, gpu_memory_utilization=0.5)
    assert lower["max_concurrent_sequences"] < s["max_concurrent_sequences"]
    fp8 = serving(L3, card, context=8192, kv_dtype="fp8")
    assert fp8["max_concurrent_sequences"] >= 2 * s["max_concurrent_sequences"] - 1


@pytest.mark.parametrize("card_name", ["rtx-4090", "l4", "a100-80gb"])
def test_max_context_and_batch_fit_and_one_more_does_not(card_name):
    card = gpus.gpu(card_name)
    c = max_context(L3, card, batch=4, weights="nf4")
    assert fit_inference(estimate_inference(L3, context=c, batch=4, weights="nf4"), card)["fits"]
    if c < L3.max_positions:
        assert not fit_inference(estimate_inference(L3, context=c + 1, batch=4, weights="nf4"), card)["fits"]
    b = max_batch(L3, card, context=4096, weights="nf4")
    assert fit_inference(estimate_inference(L3, context=4096, batch=b, weights="nf4"), card)["fits"]
    assert not fit_inference(estimate_inference(L3, context=4096, batch=b + 1, weights="nf4"), card)["fits"]


def test_cli_infer(capsys):
    assert (
        main(
            [
                "infer",
                "--model",
                "llama-3.1-8b",
                "--weights",
                "gguf-q4_k_m",
                "--context",
                "8192",
                "--gpu",
                "rtx-4090",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["kv"]["bytes_per_token"] == 131_072 and out["serving"]["max_concurrent_sequences"] > 0
    assert main(["infer", "--model", "llama-3.1-8b", "--gpu", "l4", "--lang", "es"]) == 0
    assert "caché KV" in capsys.readouterr().out


@pytest.mark.parametrize(
    "body,code",
    [
        ({"model": "llama-3.1-8b", "weights": "int3"}, "bad_choice"),
        ({"model": "llama-3.1-8b", "kv_dtype": "fp7"}, "bad_choice"),
        ({"model": "llama-3.1-8b", "context": 0}, "out_of_range"),
        ({"model": "llama-3.1-8b", "context": "long"}, "not_integer"),
        ({"model": "llama-3.1-8b", "mode": "train"}, "bad_choice"),
        ({"model": "llama-3.1-8b", "gpu": "l4", "gpu_memory_utilization": 1.5}, "out_of_range"),
        ({"model": "llama-3.1-8b", "temperature": 1}, "unknown_field"),
        ({}, "missing_model"),
    ],
)
def test_bad_input(body, code):
    with pytest.raises(InvalidValueError) as e:
        infer_json(body)
    assert e.value.code == code


def test_cli_bad_input_exit_2(capsys):
    assert main(["infer", "--model", "llama-3.1-8b", "--weights", "q4"]) == 2
    assert main(["infer", "--model", "llama-3.1-8b", "--context", "abc"]) == 2


def test_auto_serves_the_checkpoint_as_shipped():
    """``--weights auto`` (the default): gpt-oss's experts in MXFP4 and DeepSeek-V3's weights in fp8, as their
    ``quantization_config`` says and as vLLM serves them; a bf16 checkpoint in bf16; a config without a dtype in
    fp16. gpt-oss-20b: 20,914,757,184 parameters, of which the 24 layers' 32 experts (2 × 2880 × 2880 gate_up +
    2880 × 2880 down = 24,883,200 each, 19,110,297,600 in all) at 0.5 + 1/32 B (9,555,148,800 + 597,196,800) and the
    rest (1,804,459,584) at 2 B:
    10,152,345,600 + 3,608,919,168 = 13,761,264,768 B ≈ 13.8 GB, not the 41.8 GB of fp16."""
    oss = preset("gpt-oss-20b").spec
    auto = weights_bytes(oss)
    assert auto["format"] == "mxfp4" and auto["shipped"]
    assert auto["total_bytes"] == weights_bytes(oss, "mxfp4")["total_bytes"] == 13_761_264_768
    assert weights_bytes(preset("deepseek-v3").spec)["format"] == "fp8"
    assert weights_bytes(preset("llama-3.1-8b").spec)["format"] == "bf16"
    explicit = weights_bytes(oss, "bf16")
    assert explicit["format"] == "bf16" and not explicit["shipped"]
    assert estimate_inference(oss)["weights_format"] == "mxfp4"
    assert infer_json({"model": "gpt-oss-20b"})["weights"]["format"] == "mxfp4"


@pytest.mark.parametrize(
    "qcfg, fmt",
    [
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "gptq-4bit"),
        ({"quant_method": "gptq", "bits": 8}, "gptq-8bit"),
        ({"quant_method": "awq", "bits": 4}, "awq-4bit"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "nf4"),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "int8"),
        ({"quant_method": "compressed-tensors"}, None),  # no format of cabe's: served in its dtype
    ],
)
def test_quantized_checkpoints_read_from_their_quantization_config(qcfg, fmt):
    from cabe.families import config_weights_format

    assert config_weights_format({"quantization_config": qcfg}) == fmt
