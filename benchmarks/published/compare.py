"""cabe against the measurements others published (``published-dev.csv``), with a peer beside it.

    .venv/bin/python benchmarks/published/compare.py          # prints the table, writes compare.md

Each row of the CSV is mapped to a cabe request below (``MAPPING``), with what the mapping assumes;
a row cabe cannot express (an encoder model, sequence lengths only given as "variable") is counted as
100 % error, as issue 10 asks. cabe's figure is taken in the row's own metric: ``allocated`` → the peak,
``reserved`` / ``unstated`` → reserved (peak + allocator slack), ``nvidia-smi`` → reserved + CUDA context,
``reserved minus init`` → reserved − the 2 MiB segment PEFT's init left (see ``PEFT_INIT_BYTES``). Rows that are not measurements (the ZeRO paper's formula,
LLaMA-Factory's own estimates) are shown but not scored.

The peer: accelerate's ``estimate-memory`` (accelerate/commands/estimate.py), run here on the same model
built on the meta device: its "Training using Adam" figure, ``max(estimate_training_usage(...))`` —
model states only, batch 1, no activations, full fine-tuning (it has no LoRA / QLoRA / sharding), so it
is shown for full fine-tuning rows only. llm-analysis (0.2.2) pins huggingface-hub < 0.15 and
transformers 4.31; it cannot be installed beside transformers 5 and is not run (its method is described
in ``peers.md``).
"""

from __future__ import annotations

import contextlib
import csv
import statistics
import sys
from pathlib import Path
from typing import Any

from cabe import api
from cabe.models import preset
from cabe.units import GB, GiB

HERE = Path(__file__).parent
CSV = HERE / "published-dev.csv"

_TT = {"dtype": "bf16", "autocast": "none"}  # torchtune trains in bf16 without autocast
_TT_ALPACA = {"model": "llama-2-7b", **_TT, "batch": 2, "seq": 512, "checkpointing": True, "grad_accum": 64}
_PEFT = {"model": "llama-3.2-3b", "dtype": "bf16", "autocast": "none", "batch": 4, "seq": 768}
#: row id -> (cabe request, what the mapping assumes) or (None, why cabe cannot express it)
MAPPING: dict[str, tuple[dict[str, Any] | None, str]] = {
    "tt-l2-7b-qlora": (
        {
            "model": "llama-2-7b",
            "method": "qlora",
            "lora_rank": 8,
            "lora_targets": "all-linear",
            **_TT,
            "batch": 4,
            "seq": 2048,
            "checkpointing": True,
        },
        "torchtune's QLoRA (bf16 embeddings, torch.compile) modelled as HF + PEFT",
    ),
    "tt-l2-7b-lora": (
        {
            "model": "llama-2-7b",
            "method": "lora",
            "lora_rank": 8,
            "lora_targets": "q_proj,v_proj",
            **_TT,
            "batch": 4,
            "seq": 2048,
            "checkpointing": True,
        },
        "torchtune LoRA modelled as HF + PEFT",
    ),
    "tt-l2-7b-lora-fsdp2": (
        {
            "model": "llama-2-7b",
            "method": "lora",
            "lora_rank": 8,
            "lora_targets": "q_proj,v_proj",
            **_TT,
            "batch": 4,
            "seq": 2048,
            "gpus": 2,
            "shard": "fsdp",
        },
        "FSDP2 full sharding, per GPU",
    ),
    "tt-l2-7b-full-fsdp4": (
        {
            "model": "llama-2-7b",
            "method": "full",
            **_TT,
            "batch": 4,
            "seq": 2048,
            "checkpointing": True,
            "gpus": 4,
            "shard": "fsdp",
        },
        "FSDP2 full sharding, per GPU",
    ),
    "tt-l2-70b-lora-fsdp8": (
        {
            "model": "llama-2-70b",
            "method": "lora",
            "lora_rank": 16,
            "lora_targets": "q_proj,k_proj,v_proj",
            **_TT,
            "batch": 4,
            "seq": 4096,
            "checkpointing": True,
            "gpus": 8,
            "shard": "fsdp",
        },
        "FSDP2 full sharding, per GPU",
    ),
    # PEFT's method comparison (method_comparison/MetaMathQA, results/*.json, 2025-06): default_training_params.json
    # loads the model with dtype="bfloat16" and use_amp=false (pure bf16, no autocast), torch.optim.AdamW,
    # batch 4, attn_implementation None (transformers' default, sdpa), no checkpointing; get_peft_model with
    # autocast_adapter_dtype=True (fp32 adapters). The figure is ``cuda_memory_max`` = max_memory_reserved() at
    # the end of the run minus ``init``, and init (utils.py init_accelerator) is taken BEFORE the model is
    # loaded, after nn.Linear(1, 1).to(device): one 2 MiB segment. So the weights are in the figure. The max
    # also covers evaluation (generate with batch 50) and the wiki loss pass, which cabe does not model.
    # Samples are filtered to <= 1300 characters and truncated at 768 tokens (data.py): 768 is an upper bound
    # of the longest batch.
    "peft-mmqa-lora-r32": (
        {**_PEFT, "method": "lora", "lora_rank": 32, "lora_targets": "q_proj,v_proj"},
        "bf16 weights, no autocast; every sample at the 768-token cap: an upper bound",
    ),
    "peft-mmqa-lora-r64": (
        {**_PEFT, "method": "lora", "lora_rank": 64, "lora_targets": "q_proj,v_proj"},
        "bf16 weights, no autocast; every sample at the 768-token cap: an upper bound",
    ),
    "peft-mmqa-full": (
        {**_PEFT, "method": "full"},
        "bf16 weights and AdamW state, no autocast; 768-token cap: an upper bound",
    ),
    # torchtune's LoRA tutorial (docs/source/tutorials/lora_finetune.rst) and QLoRA tutorial: the config
    # llama2/7B_lora_single_device.yaml (batch_size 2, gradient_accumulation_steps 64, dtype bf16,
    # enable_activation_checkpointing True, torch.optim.AdamW, dataset alpaca_cleaned_dataset with no
    # max_seq_len): torchtune/datasets/_alpaca.py gives alpaca_dataset ``max_seq_len: int = 512`` and
    # train_on_input=True, and truncates every sample there. The peak is set by the longest batch, so 2 x 512
    # is an upper bound (reached when a batch holds a sample of >= 512 Llama-2 tokens; the docs do not say).
    # torchtune runs its own model code in pure bf16 with its own loss: cabe models it as HF + PEFT
    # (fp32 adapters) — the closest run it has. "all layers" in the tutorial is q, k, v, output_proj, the
    # MLP AND the output projection (apply_lora_to_output); cabe's all-linear leaves lm_head out.
    "tt-l2-7b-lora-r8qv": (
        {**_TT_ALPACA, "method": "lora", "lora_rank": 8, "lora_targets": "q_proj,v_proj"},
        "torchtune as HF + PEFT; alpaca max_seq_len 512 (upper bound)",
    ),
    "tt-l2-7b-lora-r8all": (
        {**_TT_ALPACA, "method": "lora", "lora_rank": 8, "lora_targets": "all-linear"},
        "torchtune as HF + PEFT; alpaca max_seq_len 512 (upper bound); no LoRA on the output layer",
    ),
    "tt-l2-7b-lora-r64qv": (
        {**_TT_ALPACA, "method": "lora", "lora_rank": 64, "lora_targets": "q_proj,v_proj"},
        "torchtune as HF + PEFT; alpaca max_seq_len 512 (upper bound)",
    ),
    "tt-l2-7b-lora-r64all": (
        {**_TT_ALPACA, "method": "lora", "lora_rank": 64, "lora_targets": "all-linear"},
        "torchtune as HF + PEFT; alpaca max_seq_len 512 (upper bound); no LoRA on the output layer",
    ),
    # qlora_finetune.rst: llama2/7B_qlora_single_device (LoRA on q, k, v, output_proj and the MLP, rank 8,
    # batch 2, checkpointing). The tutorial says 9.13 GB were reserved right after model init: reserved
    # memory keeps what loading and quantizing the bf16 checkpoint took, which a step model does not see.
    "tt-l2-7b-qlora-r8": (
        {**_TT_ALPACA, "method": "qlora", "lora_rank": 8, "lora_targets": "all-linear"},
        "torchtune NF4 as bitsandbytes NF4; 512 cap; reserved after init (9.13 GB) is not modelled",
    ),
    # PR #527: full fine-tuning with the optimizer step fused into backward (each gradient freed as soon as
    # its parameter is stepped) and a paged AdamW. cabe has no optimizer-in-backward knob.
    "tt-l2-7b-full-paged": (None, "optimizer-in-backward (gradients freed during backward): no cabe knob"),
}
for _id in (
    "hf-bert-fp32-b4",
    "hf-bert-fp32-b1ga4-gc",
    "hf-bert-fp16-b4",
    "hf-bert-adam8bit-b4",
    "hf-bert-adafactor-b4",
):
    MAPPING[_id] = (None, "BERT is an encoder: no family module reads it")

#: what PEFT's init_accelerator leaves reserved before the model loads: nn.Linear(1, 1).to(device) takes one
#: block of the small pool, a 2 MiB segment (c10/cuda/CUDACachingAllocator.cpp, kSmallBuffer)
PEFT_INIT_BYTES = 2 * 2**20


def cabe_figure(req: dict[str, Any], metric: str) -> int:
    r = api.build(req)
    if metric == "allocated":
        return r.total_bytes
    if metric == "nvidia-smi":
        return r.reserved_bytes + r.cuda_context_bytes
    if metric == "reserved minus init":
        return r.reserved_bytes - PEFT_INIT_BYTES
    return r.reserved_bytes  # reserved, or unstated (what nvidia-smi-like tools and torch report)


def accelerate_figure(model: str, precision: str) -> int | None:
    """accelerate estimate-memory's "Training using Adam" for the model (full fine-tuning only)."""
    try:
        from accelerate import init_empty_weights
        from accelerate.commands.estimate import estimate_training_usage
        from accelerate.utils import calculate_maximum_sizes
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        return None
    cfg = dict(preset(model).config)
    cfg.pop("_cabe", None)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with init_empty_weights():
        m = AutoModelForCausalLM.from_config(config)
    total, _ = calculate_maximum_sizes(m)  # fp32 bytes
    usage = estimate_training_usage(total, "float32" if precision == "fp32" else "bfloat16")
    return max(usage.values())


def _unit(unit: str) -> float:
    return {"GB": GB, "GiB": GiB, "MB": 1e6, "MiB": 2**20}[unit]


def main() -> int:
    rows = list(csv.DictReader(CSV.open()))
    out = []
    scored: list[float] = []
    expressed: list[float] = []
    for row in rows:
        rid, kind = row["id"], row["kind"]
        req, note = MAPPING.get(rid, (None, "not a measurement"))
        measured = None
        with contextlib.suppress(ValueError):  # "120 / 31.4 / ..." and other non-numbers: not scored
            measured = float(row["figure"]) * _unit(row["unit"])
        if kind != "measured" or measured is None:
            out.append((rid, row["figure"] + " " + row["unit"], "—", "—", "not scored", row["kind"]))
            continue
        if req is None:
            scored.append(1.0)
            out.append((rid, f"{measured / _unit(row['unit']):g} {row['unit']}", "cannot express", "—", "100%", note))
            continue
        mine = cabe_figure(req, row["metric"])
        err = (mine - measured) / measured
        scored.append(abs(err))
        expressed.append(abs(err))
        peer = (
            accelerate_figure(req["model"], str(req.get("precision") or req.get("dtype")))
            if req["method"] == "full"
            else None
        )
        peer_s = (
            f"{peer / _unit(row['unit']):.1f} ({100 * (peer - measured) / measured:+.0f}%)"
            if peer
            else "n/a (full only)"
        )
        out.append(
            (
                rid,
                f"{measured / _unit(row['unit']):g} {row['unit']}",
                f"{mine / _unit(row['unit']):.2f}",
                peer_s,
                f"{100 * err:+.1f}%",
                note,
            )
        )
    lines = [
        "| row | measured | cabe | accelerate estimate-memory | cabe error | mapping |",
        "|---|---:|---:|---:|---:|---|",
        *(f"| {a} | {b} | {c} | {d} | {e} | {f} |" for a, b, c, d, e, f in out),
        "",
        f"median |error| over {len(scored)} measured rows (rows cabe cannot express count as 100%): "
        f"{100 * statistics.median(scored):.1f}%; over the {len(expressed)} rows it expresses: "
        f"{100 * statistics.median(expressed):.1f}%",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    (HERE / "compare.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
