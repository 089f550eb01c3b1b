"""The accuracy grid: cabe's analytic estimate against the fake-tensor trace of the same step.

    .venv/bin/python benchmarks/accuracy/grid.py            # the whole grid (a few minutes)
    .venv/bin/python benchmarks/accuracy/grid.py --quick    # the small-model subset the tests use

Writes benchmarks/accuracy/results.json and results.md, prints each configuration's estimate,
trace peak and relative error, and the max and median error. Target: every configuration within
3% of the trace.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from cabe.analytic import estimate_model
from cabe.models import preset
from cabe.training import TrainingSetup

HERE = Path(__file__).parent

# (model, setup kwargs): >= 60 configurations over >= 6 families, full / LoRA / QLoRA, checkpointing on
# and off, eager and flash, fp32 / AMP / pure bf16, several batch and sequence sizes, 7B and 70B sizes.
GRID: list[tuple[str, dict]] = []


def _add(models, **kw):
    for m in models:
        GRID.append((m, kw))


SMALL = ["llama-3.2-1b", "qwen2.5-0.5b", "gemma-2-2b", "phi-3-mini", "gpt2", "pythia-1.4b"]
# full fine-tuning, three precisions, eager and flash, checkpointing on/off
_add(SMALL, method="full", precision="fp32", batch=2, seq=512, attention="sdpa")
_add(SMALL, method="full", precision="bf16-amp", optimizer_impl="fused", batch=4, seq=512)
_add(SMALL, method="full", precision="bf16", optimizer_impl="fused", batch=2, seq=1024, checkpointing=True)
_add(SMALL, method="full", precision="bf16", batch=1, seq=1024, attention="eager")
# LoRA and QLoRA
_add(SMALL, method="lora", precision="bf16", batch=4, seq=1024)
_add(SMALL, method="lora", precision="bf16", batch=4, seq=1024, checkpointing=True, lora_targets=("all-linear",))
_add(SMALL, method="qlora", batch=2, seq=1024)
_add(SMALL, method="qlora", batch=4, seq=2048, checkpointing=True)
# 7B-sized and larger
BIG = ["llama-2-7b", "llama-3.1-8b", "mistral-7b-v0.3", "qwen2.5-7b", "gemma-2-9b"]
_add(BIG, method="full", precision="bf16", optimizer_impl="fused", batch=1, seq=2048, checkpointing=True)
_add(BIG, method="lora", precision="bf16", batch=4, seq=512)
_add(BIG, method="qlora", batch=1, seq=4096, checkpointing=True)
_add(
    ["mixtral-8x7b"],
    method="lora",
    precision="bf16",
    batch=1,
    seq=1024,
    checkpointing=True,
    lora_targets=("q_proj", "v_proj"),
)
_add(["mixtral-8x7b"], method="full", precision="bf16", batch=1, seq=512, checkpointing=True)
_add(["llama-2-7b"], method="full", precision="fp32", batch=4, seq=512)
_add(["llama-2-7b"], method="full", precision="bf16-amp", batch=4, seq=512)
_add(["llama-3.1-70b"], method="lora", precision="bf16", batch=1, seq=2048, checkpointing=True)
_add(["llama-3.1-70b"], method="qlora", batch=1, seq=2048, checkpointing=True)
_add(["llama-3.1-70b"], method="full", precision="bf16", optimizer_impl="fused", batch=1, seq=1024, checkpointing=True)

# methods and optimizers beyond AdamW, and three more families
_add(["llama-3.2-1b"], method="freeze", trainable_layers=2, precision="bf16", batch=2, seq=512)
_add(["llama-3.2-1b"], method="prompt-tuning", precision="bf16", batch=2, seq=512)
_add(["llama-3.2-1b"], method="full", precision="bf16-amp", optimizer="adamw-8bit", batch=2, seq=512)
_add(["llama-3.2-1b"], method="full", precision="bf16", grad_accum=4, batch=2, seq=512)
_add(["llama-3.2-1b"], method="full", precision="bf16", optimizer="adafactor", batch=2, seq=512)
_add(["llama-3.2-1b"], method="full", precision="bf16", optimizer="lion", batch=2, seq=512)
_add(["llama-3.2-1b"], method="full", precision="bf16", optimizer="sgd-momentum", batch=2, seq=512)
_add(["llama-3.2-1b"], method="full", precision="bf16", optimizer="paged-adamw", batch=2, seq=512)
_add(["llama-3.2-1b"], method="lora", precision="bf16", optimizer="paged-adamw-8bit", batch=2, seq=512)
_add(["gemma-3-1b"], method="lora", precision="bf16", batch=2, seq=1024)
_add(["qwen3-8b"], method="lora", precision="bf16", batch=1, seq=1024)
_add(["olmo-2-7b"], method="lora", precision="bf16", batch=1, seq=1024)
_add(["falcon-7b"], method="lora", precision="bf16", batch=1, seq=1024)  # SDPA takes the math kernel here
_add(["falcon-7b"], method="full", precision="bf16", optimizer_impl="fused", batch=1, seq=1024, checkpointing=True)

QUICK = [(m, kw) for m, kw in GRID if m in ("llama-3.2-1b", "qwen2.5-0.5b", "gpt2")]


def run(grid, *, out: Path | None = None) -> list[dict]:
    from cabe.trace import trace_step

    rows = []
    for model, kw in grid:
        src = preset(model)
        setup = TrainingSetup(**kw)
        t0 = time.perf_counter()
        try:
            tr = trace_step(dict(src.config), setup)
            traced = tr.peak_bytes
            reserved = tr.reserved_bytes
            trace_components = dict(tr.components)
            trace_phase = tr.peak_phase
            err = None
        except Exception as exc:  # recorded, not hidden: a row the trace could not run
            traced, trace_components, trace_phase, err = None, {}, None, f"{type(exc).__name__}: {exc}"[:300]
            reserved = None
        seconds = time.perf_counter() - t0
        est = estimate_model(src.spec, setup)
        rel = (est.total_bytes - traced) / traced if traced else None
        row = {
            "model": model,
            "setup": kw,
            "estimate_bytes": est.total_bytes,
            "trace_bytes": traced,
            "relative_error": rel,
            "estimate_phase": est.peak_phase,
            "trace_phase": trace_phase,
            "trace_reserved_bytes": reserved,
            "estimate_reserved_bytes": est.reserved_bytes,
            "estimate_components": est.components,
            "trace_components": trace_components,
            "trace_seconds": round(seconds, 2),
            "error": err,
        }
        rows.append(row)
        label = " ".join(f"{k}={v}" for k, v in kw.items())
        rel_s = f"{100 * rel:+6.2f}%" if rel is not None else "  n/a "
        print(
            f"{model:<16} {label:<80} est {est.total_bytes / 2**30:8.2f} GiB  trace "
            f"{(traced or 0) / 2**30:8.2f} GiB  {rel_s}  ({seconds:.1f} s){'  ' + err if err else ''}",
            flush=True,
        )
    errs = [abs(r["relative_error"]) for r in rows if r["relative_error"] is not None]
    if errs:
        print(
            f"\n{len(errs)} of {len(rows)} configurations traced; max |error| {100 * max(errs):.2f}%, "
            f"median {100 * statistics.median(errs):.2f}%, within 3%: {sum(e <= 0.03 for e in errs)}"
        )
        slack = [r["trace_reserved_bytes"] / r["trace_bytes"] - 1 for r in rows if r["trace_reserved_bytes"]]
        if slack:
            print(
                f"allocator replay: reserved / allocated - 1: median {100 * statistics.median(slack):.1f}%, "
                f"min {100 * min(slack):.1f}%, max {100 * max(slack):.1f}%"
            )
    if out is not None:
        out.write_text(json.dumps(rows, indent=1))
        _write_md(rows, out.with_suffix(".md"))
    return rows


def _write_md(rows, path: Path) -> None:
    lines = ["| model | setup | cabe (GiB) | trace (GiB) | error |", "|---|---|---:|---:|---:|"]
    for r in rows:
        label = ", ".join(f"{k}={v}" for k, v in r["setup"].items())
        tr = f"{r['trace_bytes'] / 2**30:.2f}" if r["trace_bytes"] else "n/a"
        e = f"{100 * r['relative_error']:+.2f}%" if r["relative_error"] is not None else (r["error"] or "n/a")
        lines.append(f"| {r['model']} | {label} | {r['estimate_bytes'] / 2**30:.2f} | {tr} | {e} |")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", help="substring of the model name")
    a = ap.parse_args()
    grid = QUICK if a.quick else GRID
    if a.only:
        grid = [(m, kw) for m, kw in grid if a.only in m]
    print(f"{len(grid)} configurations", file=sys.stderr)
    run(grid, out=None if (a.quick or a.only) else HERE / "results.json")
