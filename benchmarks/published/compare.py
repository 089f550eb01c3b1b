"""cabe against the measurements others published (``published-dev.csv``), with a peer beside it.

    .venv/bin/python benchmarks/published/compare.py          # prints the table, writes compare.md

Each row of the CSV is mapped to a cabe request below (``MAPPING``), with what the mapping assumes;
a row cabe cannot express (an encoder model, sequence lengths only given as "variable") is counted as
100 % error, as issue 10 asks. cabe's figure is taken in the row's own metric: ``allocated`` → the peak,
``reserved`` / ``unstated`` → reserved (peak + allocator slack), ``nvidia-smi`` → reserved + CUDA context,
``reserved minus init`` → reserved − weights. Rows that are not measurements (the ZeRO paper's formula,
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
    "peft-mmqa-lora-r32": (
        {
            "model": "llama-3.2-3b",
            "method": "lora",
            "lora_rank": 32,
            "lora_targets": "q_proj,v_proj",
            "precision": "bf16-amp",
            "batch": 4,
            "seq": 768,
        },
        "every sample at the longest length (768): an upper bound",
    ),
    "peft-mmqa-lora-r64": (
        {
            "model": "llama-3.2-3b",
            "method": "lora",
            "lora_rank": 64,
            "lora_targets": "q_proj,v_proj",
            "precision": "bf16-amp",
            "batch": 4,
            "seq": 768,
        },
        "every sample at the longest length (768): an upper bound",
    ),
    "peft-mmqa-full": (
        {"model": "llama-3.2-3b", "method": "full", "precision": "bf16-amp", "batch": 4, "seq": 768},
        "every sample at the longest length (768): an upper bound",
    ),
}
for _id in (
    "tt-l2-7b-full-paged",
    "tt-l2-7b-lora-r8qv",
    "tt-l2-7b-lora-r8all",
    "tt-l2-7b-lora-r64qv",
    "tt-l2-7b-lora-r64all",
    "tt-l2-7b-qlora-r8",
):
    MAPPING[_id] = (None, "sequence length given only as 'variable (alpaca)'")
for _id in (
    "hf-bert-fp32-b4",
    "hf-bert-fp32-b1ga4-gc",
    "hf-bert-fp16-b4",
    "hf-bert-adam8bit-b4",
    "hf-bert-adafactor-b4",
):
    MAPPING[_id] = (None, "BERT is an encoder: no family module reads it")


def cabe_figure(req: dict[str, Any], metric: str) -> int:
    r = api.build(req)
    if metric == "allocated":
        return r.total_bytes
    if metric == "nvidia-smi":
        return r.reserved_bytes + r.cuda_context_bytes
    if metric == "reserved minus init":
        return r.reserved_bytes - r.components.get("weights", 0)
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
    return {"GB": GB, "GiB": GiB, "MB": 1e6}[unit]


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
