"""cabe.trace.generate: transformers' generate on fake CUDA tensors (``cabe infer --trace``), tiny models of real
families: what it runs (forwards, kernels, the cache's growth), what it refuses, and the analytic peak beside it
(cabe.generation; the random sample of real widths is tests/benchmarks/test_differential_infer.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe.errors import ConfigError
from cabe.inference import estimate_inference
from cabe.models import from_mapping
from cabe.trace.generate import trace_generate

#: a Llama of 2 layers at widths where the working memory is not lost beside cuBLAS's 32 MiB workspace
LLAMA = dict(
    model_type="llama",
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    vocab_size=4096,
    max_position_embeddings=4096,
)


def _both(config, **kw):
    spec = from_mapping(config, config["model_type"]).spec
    tr = trace_generate(config, **kw)
    est = estimate_inference(
        spec,
        weights=kw["weights"],
        kv_dtype=kw["kv_dtype"],
        context=kw["prompt"] + kw["new_tokens"],
        new_tokens=kw["new_tokens"],
        batch=kw["batch"],
        prefill_chunk=kw.get("prefill_chunk"),
        cache=kw.get("cache", "dynamic"),
    )
    return tr, est


def test_prefill_then_decode_steps_and_flash():
    """One prefill forward, then new_tokens - 1 decode forwards (the last token is never fed back); bf16 without a
    mask: FlashAttention at every layer of every forward."""
    tr, est = _both(LLAMA, weights="bf16", kv_dtype="bf16", prompt=1024, new_tokens=6, batch=4)
    assert tr["trace_forwards"] == 6
    assert tr["trace_attention_kernels"] == {"flash": 2 * 6}
    assert tr["trace_peak_stage"] == "prefill"
    # every layer's cache at the prompt: 2 layers × 2 (k, v) × 2 heads × 64 × 2 B × 1024 tokens × 4
    assert tr["trace_components"]["kv_cache"] == 2 * 2 * 2 * 64 * 2 * 1024 * 4
    assert abs(est["total_bytes"] - tr["trace_peak_bytes"]) / tr["trace_peak_bytes"] < 0.03
    assert tr["trace_reserved_bytes"] >= tr["trace_peak_bytes"]


def test_static_cache_and_chunked_prefill():
    """StaticCache: zeros of prompt + new - 1 tokens per layer from the first write; a chunked prefill: one forward per
    chunk, the chunks after the first under a mask (the memory-efficient kernel)."""
    tr, est = _both(
        LLAMA, weights="fp16", kv_dtype="fp16", prompt=1000, new_tokens=4, batch=2, cache="static", prefill_chunk=256
    )
    assert tr["trace_forwards"] == 4 + 3  # ceil(1000 / 256) chunks, then 3 decode steps
    assert tr["trace_components"]["kv_cache"] == 2 * 2 * 2 * 64 * 2 * 1003 * 2
    assert "efficient" in tr["trace_attention_kernels"]
    assert abs(est["total_bytes"] - tr["trace_peak_bytes"]) / tr["trace_peak_bytes"] < 0.03


def test_fp32_grouped_heads_run_the_math_kernel():
    tr, est = _both(LLAMA, weights="fp32", kv_dtype="fp32", prompt=512, new_tokens=3, batch=2)
    assert set(tr["trace_attention_kernels"]) == {"math"}
    assert abs(est["total_bytes"] - tr["trace_peak_bytes"]) / tr["trace_peak_bytes"] < 0.03


@pytest.mark.parametrize(
    "kw, code, field",
    [
        ({"weights": "nf4", "kv_dtype": "nf4"}, "trace_weights_format", "weights"),
        ({"weights": "bf16", "kv_dtype": "fp8"}, "trace_kv_dtype", "kv_dtype"),
        ({"weights": "bf16", "kv_dtype": "bf16", "images": 1}, "trace_images", "images"),
        ({"weights": "bf16", "kv_dtype": "bf16", "new_tokens": 0}, "trace_tokens", "new_tokens"),
    ],
)
def test_what_fake_tensors_cannot_run_is_refused(kw, code, field):
    args = {"prompt": 64, "new_tokens": 2, "batch": 1, **kw}
    with pytest.raises(ConfigError) as e:
        trace_generate(LLAMA, **args)
    assert (e.value.code, e.value.field) == (code, field)


def test_mamba2_hybrids_are_refused():
    """Granite-4.0-H's Mamba-2 layers run mamba-ssm's inference kernels; transformers' PyTorch fallback would be
    traced in their place, so the trace refuses."""
    granite = dict(
        model_type="granitemoehybrid",
        hidden_size=128,
        intermediate_size=256,
        shared_intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        layer_types=["mamba", "attention"],
        mamba_n_heads=8,
        mamba_d_head=32,
        mamba_d_state=16,
        mamba_n_groups=1,
        mamba_expand=2,
        num_local_experts=0,
        max_position_embeddings=512,
    )
    with pytest.raises(ConfigError) as e:
        trace_generate(granite, weights="bf16", kv_dtype="bf16", prompt=32, new_tokens=2, batch=1)
    assert e.value.code == "trace_generate_kernels"


def test_cli_infer_trace_json(tmp_path, capsys):
    """``cabe infer --trace --json``: the estimate's total beside the traced peak, allocated and reserved."""
    import json

    from cabe.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    args = ["infer", "--model", str(path), "--weights", "bf16", "--kv-dtype", "bf16", "--context", "520"]
    assert main([*args, "--new-tokens", "8", "--batch", "2", "--trace", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["prompt_tokens"], out["new_tokens"], out["trace"]["forwards"]) == (512, 8, 8)
    assert out["trace_reserved_bytes"] >= out["trace_peak_bytes"] > 0
    assert out["estimate_relative_error"] == round(
        (out["total_bytes"] - out["trace_peak_bytes"]) / out["trace_peak_bytes"], 5
    )
    assert abs(out["estimate_relative_error"]) < 0.03
    # a quantized format is refused in one sentence, exit code 2
    assert main([*args, "--weights", "nf4", "--trace"]) == 2
    assert "the nf4 format's CUDA-only kernels cannot run" in capsys.readouterr().err
