"""llm-analysis (0.2.2) on the serving rows it can express; writes ``llm_analysis_serving.json`` for serving_compare.py.

llm-analysis pins transformers 4.31, so it lives in its own virtualenv (as for llm_analysis_peer.py):

    python3 -m venv /work/venv-llma && /work/venv-llma/bin/pip install llm-analysis
    /work/venv-llma/bin/python benchmarks/published/llm_analysis_serving.py

Its inference figure (``llm_analysis.analysis.infer``): ``weight_memory_per_gpu`` (each GPU's shard at ``tp_size``),
``kv_cache_memory_per_gpu`` for ``batch_size_per_gpu × (seq_len + num_tokens_to_generate)`` tokens and the larger of
``prefill_activation_memory_per_gpu`` / ``decode_activation_memory_per_gpu``; the row's metric picks the part (a
``peak_allocated`` row: their sum). It has no serving engine's pool (no budget, profile run or blocks), no MLA
(the cache of every head), no weight quantization formats but its ``w4`` / ``w8`` bit widths, it assumes tied
embeddings, and ``infer()`` has no gated-MLP switch (``mlp_gated_linear_units`` is ``train()``'s only), so a Llama
MLP is counted as two matrices, not three; ``UNSUPPORTED`` says which rows it cannot express and why.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
OUT = HERE / "llm_analysis_serving.json"

#: the Hub configs as llm-analysis's ModelConfig (registered from JSON files by name)
MODELS: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-3.1-8B: 32 layers, 32 heads, 8 kv heads, hidden 4096, MLP 14336, vocabulary 128256
    "llama-3.1-8b": {
        "num_layers": 32,
        "n_head": 32,
        "num_key_value_heads": 8,
        "hidden_dim": 4096,
        "ffn_embed_dim": 14336,
        "expansion_ratio": 14336 / 4096,
        "vocab_size": 128256,
        "max_seq_len": 131072,
        "model_type": "llama",
    },
    # meta-llama/Llama-3.1-70B: 80 layers, 64 heads, 8 kv heads, hidden 8192, MLP 28672
    "llama-3.1-70b": {
        "num_layers": 80,
        "n_head": 64,
        "num_key_value_heads": 8,
        "hidden_dim": 8192,
        "ffn_embed_dim": 28672,
        "expansion_ratio": 28672 / 8192,
        "vocab_size": 128256,
        "max_seq_len": 131072,
        "model_type": "llama",
    },
    # bigcode/octocoder (StarCoder 15.5B): 40 layers, 48 heads, multi-query (1 kv head), hidden 6144, MLP 24576
    "starcoder": {
        "num_layers": 40,
        "n_head": 48,
        "num_key_value_heads": 1,
        "hidden_dim": 6144,
        "ffn_embed_dim": 24576,
        "vocab_size": 49152,
        "max_seq_len": 8192,
        "model_type": "gpt2",
    },
}

#: row id -> (model, part of the summary, keyword arguments of llm_analysis.analysis.infer)
RUNS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "vllm-llama3-8b-tp1-weights": ("llama-3.1-8b", "weights", {"dtype_name": "w16a16e16"}),
    "vllm-llama3-8b-tp2-weights": ("llama-3.1-8b", "weights", {"dtype_name": "w16a16e16", "tp_size": 2}),
    "vllm064-llama31-8b-3090-20k-weights": ("llama-3.1-8b", "weights", {"dtype_name": "w16a16e16"}),
    # int8 weights, 16-bit activations (the w8a8 checkpoint's activations are int8 in the GEMMs only)
    "vllm-llama31-70b-w8a8-weights": ("llama-3.1-70b", "weights", {"dtype_name": "w8a16e16"}),
    # transformers' generate: 20 prompt tokens, 60 new, batch 1; eager attention (no flash) in 2023's GPTBigCode
    "hf-octocoder-bf16": (
        "starcoder",
        "peak",
        {"dtype_name": "w16a16e16", "seq_len": 20, "num_tokens_to_generate": 60},
    ),
    "hf-octocoder-int8": (
        "starcoder",
        "peak",
        {"dtype_name": "w8a16e16", "seq_len": 20, "num_tokens_to_generate": 60},
    ),
    "hf-octocoder-4bit": (
        "starcoder",
        "peak",
        {"dtype_name": "w4a16e16", "seq_len": 20, "num_tokens_to_generate": 60},
    ),
}
UNSUPPORTED = {
    "pool": "no serving engine's KV pool (gpu_memory_utilization, profile run, blocks): the kv_cache, tokens,"
    " activation_peak and non_torch rows of vLLM / SGLang, and llama.cpp's buffers",
    "mla": "no MLA: the DeepSeek-V2-Lite row's latent cache",
    "moe-fp8": "no fp8 weight format (Qwen3-235B-A22B-FP8)",
}


def main() -> int:
    from llm_analysis import config
    from llm_analysis.analysis import infer

    for name, cfg in MODELS.items():
        path = Path(f"/tmp/llm_analysis_{name}.json")
        path.write_text(json.dumps({"name": name, **cfg}))
        config.get_model_config_by_name(str(path))  # registers it under its name
    out: dict[str, Any] = {"unsupported": UNSUPPORTED, "figures": {}}
    for rid, (model, part, kw) in RUNS.items():
        s = infer(model_name=model, gpu_name="a100-sxm-80gb", log_level="ERROR", **kw)
        if part == "weights":
            figure = s["weight_memory_per_gpu"]
        else:
            act = max(s["prefill_activation_memory_per_gpu"], s["decode_activation_memory_per_gpu"])
            figure = s["weight_memory_per_gpu"] + s["kv_cache_memory_per_gpu"] + act
        out["figures"][rid] = int(figure)
    OUT.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["figures"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
