"""Measure a grid of training setups on a real GPU and put the trace's prediction beside each.

One prepared run for a device session (an H200: about 139 GiB; the grid stays below ~110 GiB
and 8 minutes). For every configuration it runs, in a fresh subprocess each (clean allocator
and context), ``cabe.trace.measure.measure_step`` (3 real steps; peak of the last); then, in
this process, ``cabe.trace.trace_step`` on fake tensors for each; it writes ``grid.json`` and
``grid.csv`` to ``--out`` (``$OUT`` on the device machine).

    python benchmarks/gpu/run_grid.py --out $OUT            # on the GPU machine
    python benchmarks/gpu/run_grid.py --dry-run             # anywhere: build every config, stop
    python benchmarks/gpu/run_grid.py --predict-only        # anywhere: traces only (no GPU)

Needs torch (a CUDA build on the GPU machine), transformers, peft, bitsandbytes; the
``src`` directory is put on ``sys.path`` so the package need not be installed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import cabe.trace  # noqa: E402,F401  (before torch: the fake-CUDA shim on CPU-only builds)

LLAMA_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
MISTRAL_7B = {
    "model_type": "mistral",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
}
TINYLLAMA_1B = {
    "model_type": "llama",
    "hidden_size": 2048,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "intermediate_size": 5632,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
QWEN2_05B = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}

LORA_QV = {"method": "lora", "lora_targets": ["q_proj", "v_proj"]}
QLORA_QV = {"method": "qlora", "lora_targets": ["q_proj", "v_proj"]}

#: (name, config, setup fields). Sized for one H200 (~139 GiB): the largest is ~102 GiB.
GRID: list[tuple[str, dict, dict]] = [
    ("llama7b-amp-fused-b2s512", LLAMA_7B, dict(precision="bf16-amp", optimizer_impl="fused", batch=2, seq=512)),
    (
        "llama7b-bf16-flash-fused-b4s512",
        LLAMA_7B,
        dict(precision="bf16", attention="flash", optimizer_impl="fused", batch=4, seq=512),
    ),
    ("llama7b-lora-bf16-b4s512", LLAMA_7B, dict(LORA_QV, precision="bf16", batch=4, seq=512)),
    ("llama7b-lora-bf16-ckpt-b4s512", LLAMA_7B, dict(LORA_QV, precision="bf16", batch=4, seq=512, checkpointing=True)),
    ("llama7b-qlora-b4s512", LLAMA_7B, dict(QLORA_QV, precision="bf16-amp", batch=4, seq=512)),
    ("llama7b-qlora-ckpt-b4s512", LLAMA_7B, dict(QLORA_QV, precision="bf16-amp", batch=4, seq=512, checkpointing=True)),
    ("mistral7b-lora-bf16-b2s1024", MISTRAL_7B, dict(LORA_QV, precision="bf16", batch=2, seq=1024)),
    (
        "tinyllama1b-fp32-foreach-b4s1024",
        TINYLLAMA_1B,
        dict(precision="fp32", optimizer_impl="foreach", batch=4, seq=1024),
    ),
    ("tinyllama1b-amp-b8s1024", TINYLLAMA_1B, dict(precision="bf16-amp", batch=8, seq=1024)),
    ("tinyllama1b-amp-ckpt-b8s1024", TINYLLAMA_1B, dict(precision="bf16-amp", batch=8, seq=1024, checkpointing=True)),
    ("qwen05b-amp-b8s1024", QWEN2_05B, dict(precision="bf16-amp", batch=8, seq=1024)),
    (
        "qwen05b-lora-ckpt-b8s2048",
        QWEN2_05B,
        dict(method="lora", precision="bf16", batch=8, seq=2048, checkpointing=True, lora_targets=["q_proj", "v_proj"]),
    ),
    ("gpt2-fp32-eager-b16s1024", GPT2, dict(precision="fp32", attention="eager", batch=16, seq=1024)),
    (
        "llama7b-adamw8bit-bf16-ckpt-b4s512",
        LLAMA_7B,
        dict(precision="bf16", optimizer="adamw-8bit", batch=4, seq=512, checkpointing=True),
    ),
    # bf16 weights under bf16 autocast: what Trainer(bf16=True) does with a model loaded by transformers 5
    # defaults (dtype="auto" -> the checkpoint's bf16), cabe's default since issue 10.
    ("llama7b-lora-bf16mixed-b4s512", LLAMA_7B, dict(LORA_QV, precision="bf16-mixed", batch=4, seq=512)),
    (
        "llama7b-lora-bf16mixed-ckpt-b4s1024",
        LLAMA_7B,
        dict(LORA_QV, precision="bf16-mixed", batch=4, seq=1024, checkpointing=True),
    ),
    (
        "tinyllama1b-bf16mixed-adamw-b8s1024",
        TINYLLAMA_1B,
        dict(precision="bf16-mixed", optimizer_impl="fused", batch=8, seq=1024),
    ),
    (
        "qwen05b-bf16mixed-chunked-b8s2048",
        QWEN2_05B,
        dict(precision="bf16-mixed", loss="chunked", batch=8, seq=2048, checkpointing=True),
    ),
    (
        "mistral7b-qlora-bf16mixed-ckpt-b4s1024",
        MISTRAL_7B,
        dict(QLORA_QV, precision="bf16-mixed", batch=4, seq=1024, checkpointing=True),
    ),
]


def make_setup(fields: dict):
    from cabe.training import TrainingSetup

    f = dict(fields)
    if isinstance(f.get("lora_targets"), list):
        f["lora_targets"] = tuple(f["lora_targets"])
    return TrainingSetup(**f)


def dry_run() -> int:
    """Build every configuration on the meta device (no GPU, no data) and stop."""
    from cabe.trace.engine import build_model, import_deps

    for name, cfg, fields in GRID:
        setup = make_setup(fields)
        import_deps(setup)
        notes: list[str] = []
        t = time.perf_counter()
        model, _ = build_model(cfg, setup, notes)
        n = sum(p.numel() for p in model.parameters())
        k = sum(p.numel() for p in model.parameters() if p.requires_grad)
        print(
            f"{name:<40} built: {n / 1e9:6.2f} B parameters stored, {k / 1e6:9.2f} M trainable "
            f"({time.perf_counter() - t:.1f} s){'  ' + '; '.join(notes) if notes else ''}",
            flush=True,
        )
        del model
    print(f"dry run: {len(GRID)} configurations built; stopping before CUDA.")
    return 0


def predict(cfg: dict, fields: dict) -> dict:
    from cabe.trace import trace_step

    r = trace_step(cfg, make_setup(fields))
    return {
        "predicted_allocated_bytes": r.peak_bytes,
        "predicted_allocator_allocated_bytes": r.allocator_allocated_bytes,
        "predicted_reserved_bytes": r.reserved_bytes,
        "predicted_peak_phase": r.peak_phase,
        "predicted_components": r.components,
        "trace_seconds": round(r.seconds, 2),
        "trace_mode": r.mode,
    }


def measure_in_subprocess(cfg: dict, fields: dict, timeout: float) -> dict:
    code = (
        f"import sys, json; sys.path.insert(0, {str(ROOT / 'src')!r}); import cabe.trace; "
        "from cabe.trace.measure import measure_step; "
        f"sys.path.insert(0, {str(Path(__file__).parent)!r}); from run_grid import make_setup; "
        "d = json.loads(sys.stdin.read()); "
        "print('\\n' + json.dumps(measure_step(d['cfg'], make_setup(d['fields']))))"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps({"cfg": cfg, "fields": fields}),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "artifacts/gpu-grid"))
    ap.add_argument("--dry-run", action="store_true", help="build every config on meta and stop (no GPU)")
    ap.add_argument("--predict-only", action="store_true", help="run the traces only (no GPU)")
    ap.add_argument("--measure-only", action="store_true", help="measure only (predict later here with --merge)")
    ap.add_argument("--merge", help="a grid.json of measurements: add this machine's predictions to it")
    ap.add_argument("--only", help="comma list of configuration names")
    ap.add_argument("--budget", type=float, default=460.0, help="seconds; later configs are skipped past it")
    args = ap.parse_args(argv)
    if args.dry_run:
        return dry_run()
    grid = [g for g in GRID if not args.only or g[0] in args.only.split(",")]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = [{"name": name, "setup": fields} for name, _, fields in grid]
    t_start = time.perf_counter()
    # 1) measurements, each in its own process -- before this process touches CUDA (the fake
    #    trace may create a context here, which would show in the children's mem_get_info)
    if args.merge:
        measured = {r["name"]: r for r in json.loads(Path(args.merge).read_text())}
        for row in rows:
            row.update({k: v for k, v in measured.get(row["name"], {}).items() if k != "setup"})
        args.predict_only = True
    if not args.predict_only:
        for row, (_name, cfg, fields) in zip(rows, grid):
            elapsed = time.perf_counter() - t_start
            if elapsed > args.budget:
                row["skipped"] = f"time budget ({elapsed:.0f} s)"
                continue
            remaining = max(30.0, args.budget + 60 - elapsed)
            row.update(measure_in_subprocess(cfg, fields, timeout=min(240.0, remaining)))
            print(json.dumps({k: v for k, v in row.items() if not isinstance(v, (dict, list))}), flush=True)
            (out_dir / "grid.json").write_text(json.dumps(rows, indent=1))
    # 2) predictions on fake tensors
    for row, (_name, cfg, fields) in zip(rows, grid):
        if "skipped" in row or args.measure_only:
            continue
        try:
            row.update(predict(cfg, fields))
        except Exception as exc:  # keep going: one bad row must not lose the others
            row["predict_error"] = f"{type(exc).__name__}: {exc}"[:400]
        if "max_memory_allocated_bytes" in row and "predicted_allocated_bytes" in row:
            row["allocated_error_pct"] = round(
                100 * (row["predicted_allocated_bytes"] / row["max_memory_allocated_bytes"] - 1), 3
            )
            row["reserved_error_pct"] = round(
                100 * (row["predicted_reserved_bytes"] / row["max_memory_reserved_bytes"] - 1), 3
            )
        print(json.dumps({k: v for k, v in row.items() if not isinstance(v, (dict, list))}), flush=True)
        (out_dir / "grid.json").write_text(json.dumps(rows, indent=1))
    (out_dir / "grid.json").write_text(json.dumps(rows, indent=1))
    cols = [
        "name",
        "max_memory_allocated_bytes",
        "predicted_allocated_bytes",
        "allocated_error_pct",
        "tracked_peak_bytes",
        "max_memory_reserved_bytes",
        "predicted_reserved_bytes",
        "reserved_error_pct",
        "device_used_bytes",
        "cuda_context_bytes",
        "predicted_peak_phase",
        "seconds",
        "trace_seconds",
        "oom",
        "error",
        "predict_error",
        "skipped",
        "device",
        "torch",
        "cuda",
    ]
    with open(out_dir / "grid.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    print(f"wrote {out_dir / 'grid.json'} and {out_dir / 'grid.csv'} ({time.perf_counter() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
