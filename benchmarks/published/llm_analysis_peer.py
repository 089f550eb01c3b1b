"""llm-analysis (0.2.2) on the published rows it can express; writes ``llm_analysis.json`` for compare.py.

llm-analysis pins transformers 4.31 and huggingface-hub < 0.15, so it lives in its own virtualenv:

    python3 -m venv /work/venv-llma && /work/venv-llma/bin/pip install llm-analysis
    /work/venv-llma/bin/python benchmarks/published/llm_analysis_peer.py

Its figure is ``(weight+op_state+grad+act)_memory_per_gpu`` from ``llm_analysis.analysis.train``: mixed
precision with Adam (12 B of state + master weights per parameter), Korthikanti-style activations.
What it cannot express is listed in ``UNSUPPORTED`` with the reason: it ships dtype configs with 16-bit
weights and activations only (no fp32 training), Adam only (no Adafactor, no 8-bit state), no PEFT
(LoRA / QLoRA) and no optimizer-in-backward.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
OUT = HERE / "llm_analysis.json"

#: Llama-3.2-3B as llm-analysis's ModelConfig (the Hub config: 28 layers, 24 heads, 8 kv heads, hidden 3072,
#: MLP 8192, vocabulary 128256, tied embeddings); expansion_ratio given since 8192 / 3072 is not an integer
LLAMA_32_3B = {
    "name": "llama-3.2-3b",
    "num_layers": 28,
    "n_head": 24,
    "num_key_value_heads": 8,
    "hidden_dim": 3072,
    "ffn_embed_dim": 8192,
    "expansion_ratio": 8192 / 3072,
    "vocab_size": 128256,
    "max_seq_len": 131072,
    "model_type": "llama",
}

_LLAMA = {"flash_attn": True, "mlp_gated_linear_units": True}
#: row id -> keyword arguments of llm_analysis.analysis.train
RUNS: dict[str, dict[str, Any]] = {
    # fp16 autocast over fp32 weights: llm-analysis's mixed precision (16-bit weights and activations, fp32
    # master weights and Adam); eager attention with dropout on the softmax, as BERT runs it
    "hf-bert-fp16-b4": {
        "model_name": "bert-large",
        "dtype_name": "w16a16e16",
        "batch_size_per_gpu": 4,
        "seq_len": 512,
        "flash_attn": False,
        "softmax_dropout": True,
    },
    # the same with batch 1 x 4 accumulation steps and full recomputation (checkpointing)
    "hf-bert-fp16-b1ga4-gc": {
        "model_name": "bert-large",
        "dtype_name": "w16a16e16",
        "batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 4,
        "seq_len": 512,
        "activation_recomputation": 2,
        "flash_attn": False,
        "softmax_dropout": True,
    },
    # torchtune FSDP1 FULL_SHARD in pure bf16 (bf16 "master" weights and AdamW state): ZeRO-3 over 4 GPUs, full recompute
    "tt-l2-7b-full-fsdp4": {
        "model_name": "NousResearch_Llama-2-7b-hf",
        "dtype_name": "w16a16e16",
        "master_weights_dtype_bytes": 2,
        "batch_size_per_gpu": 4,
        "seq_len": 2048,
        "total_num_gpus": 4,
        "ds_zero": 3,
        "activation_recomputation": 2,
        **_LLAMA,
    },
    # PEFT's full fine-tuning: bf16 weights and AdamW state, no autocast, no recompute
    "peft-mmqa-full": {
        "model_name": "llama-3.2-3b",
        "dtype_name": "w16a16e16",
        "master_weights_dtype_bytes": 2,
        "batch_size_per_gpu": 4,
        "seq_len": 768,
        **_LLAMA,
    },
}
UNSUPPORTED = {
    "fp32": "no fp32 dtype config (16-bit weights and activations only)",
    "adamw-8bit": "Adam only",
    "adafactor": "Adam only",
    "peft": "no LoRA / QLoRA",
    "optimizer-in-backward": "no optimizer-in-backward",
}


def main() -> int:
    from llm_analysis import config
    from llm_analysis.analysis import train

    path = Path("/tmp/llm_analysis_llama-3.2-3b.json")
    path.write_text(json.dumps(LLAMA_32_3B))
    config.get_model_config_by_name(str(path))  # registers it under its name
    out: dict[str, Any] = {"unsupported": UNSUPPORTED, "figures": {}}
    for rid, kw in RUNS.items():
        summary = train(gpu_name="a100-sxm-80gb", log_level="ERROR", **kw)
        out["figures"][rid] = int(summary["(weight+op_state+grad+act)_memory_per_gpu"])
    OUT.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["figures"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
