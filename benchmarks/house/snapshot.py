"""A snapshot of everything cabe prints, to prove a redesign changes no number.

    .venv/bin/python benchmarks/house/snapshot.py --write benchmarks/house/baseline.json
    .venv/bin/python benchmarks/house/snapshot.py --compare benchmarks/house/baseline.json

It runs, in one process, a fixed list of commands (the README's examples, every preset, every GPU)
and a few hundred random ones drawn by a seeded sampler over every flag of ``estimate``, ``fit``,
``infer`` and ``lora`` (the same seed each run: this is a regression set, not proof of accuracy;
the differential benchmark is that). Each is recorded with its exit code, stdout and stderr, in
JSON and in text, English and Spanish. It also records the analytic estimate of every
configuration of the accuracy grid, the whole report of every request the differential benchmark has
stored (its ``results*.json`` files), the HTTP API's answers to the same requests, and the trace
of tiny models of every traced family (``--no-trace`` skips those).

``--compare`` prints each command whose output changed (the first differing line) and exits 1
if any did.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "accuracy"))

METHODS = ["full", "lora", "qlora", "freeze", "prompt-tuning"]
PRECISIONS = ["fp32", "fp16-amp", "bf16-amp", "bf16", "fp16"]
OPTIMIZERS = ["adamw", "adamw-8bit", "paged-adamw", "paged-adamw-8bit", "sgd", "sgd-momentum", "adafactor", "lion"]
IMPLS = ["foreach", "fused", "for-loop"]
ATTN = ["eager", "sdpa", "flash"]
SHARDS = ["none", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-hybrid"]
OFFLOADS = ["none", "optimizer", "parameters", "both"]
TARGETS = ["q_proj,v_proj", "all-linear", "q_proj,k_proj,v_proj,o_proj", "c_attn", "query_key_value"]


def _run_cli(argv: list[str]) -> dict:
    from cabe.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 2
    return {"argv": argv, "rc": rc, "stdout": _untimed(out.getvalue()), "stderr": err.getvalue()}


_TIMED = re.compile(r'("elapsed_ms": )[0-9.]+|((?:Solved in|Resuelto en) )[0-9.,]+(?= ms)')


def _untimed(text: str) -> str:
    """Wall-clock figures (``cabe fit``'s solve time) are masked: they differ run to run."""
    return _TIMED.sub(lambda m: (m.group(1) or m.group(2)) + "<ms>", text)


def _fixed(presets: list[str], gpus: list[str]) -> list[list[str]]:
    cmds = [
        ["estimate", "--params", "7", "--bytes-per-param", "16"],
        ["estimate", "--params", "7", "--bytes-per-param", "16", "--activations-gb", "20"],
        ["estimate", "--params", "7", "--precision", "fp32", "--optimizer", "adamw"],
        ["estimate", "--params", "7", "--precision", "bf16-amp", "--units", "GiB"],
        [
            "estimate",
            "--model",
            "llama-3.1-8b",
            "--method",
            "qlora",
            "--batch",
            "4",
            "--seq",
            "2048",
            "--checkpointing",
            "--gpu",
            "rtx-4090",
        ],
        [
            "estimate",
            "--model",
            "llama-3.1-8b",
            "--method",
            "lora",
            "--batch",
            "4",
            "--seq",
            "1024",
            "--checkpointing",
            "--gpu",
            "rtx-4090",
            "--explain",
        ],
        [
            "estimate",
            "--model",
            "llama-2-7b",
            "--gpus",
            "8",
            "--shard",
            "zero3",
            "--offload",
            "optimizer",
            "--batch",
            "4",
            "--seq",
            "2048",
            "--checkpointing",
        ],
        ["estimate", "--model", "llama-3.1-8b", "--method", "lora", "--fits"],
        ["fit", "--model", "llama-3.1-8b", "--method", "lora", "--seq", "2048", "--gpu", "rtx-4090"],
        [
            "infer",
            "--model",
            "llama-3.1-8b",
            "--weights",
            "awq-4bit",
            "--kv-dtype",
            "fp8",
            "--context",
            "32768",
            "--gpu",
            "rtx-4090",
        ],
        ["lora", "--model", "llama-7b", "--rank", "8", "--targets", "q_proj,v_proj"],
        ["models"],
        ["gpus"],
        ["models", "--json"],
        ["gpus", "--json"],
        ["estimate", "--model", "nope"],
        ["estimate", "--batch", "0", "--model", "gpt2"],
        ["estimate", "--model", "gpt2", "--precision", "fp64"],
    ]
    for p in presets:
        cmds.append(["estimate", "--model", p, "--json"])
        cmds.append(["estimate", "--model", p, "--method", "lora", "--checkpointing", "--explain", "--lang", "es"])
        cmds.append(["infer", "--model", p, "--json"])
    for g in gpus:
        cmds.append(["estimate", "--model", "llama-3.1-8b", "--method", "qlora", "--gpu", g, "--json"])
    return cmds


def _random(rng: random.Random, presets: list[str], gpus: list[str], n: int) -> list[list[str]]:
    cmds = []
    for _ in range(n):
        kind = rng.choices(["estimate", "fit", "infer", "lora", "distributed"], [6, 1, 2, 1, 2])[0]
        model = rng.choice(presets)
        if kind == "lora":
            a = ["lora", "--model", model, "--rank", str(rng.choice([4, 8, 16, 64]))]
            if rng.random() < 0.6:
                a += ["--targets", rng.choice(TARGETS)]
        elif kind == "infer":
            a = [
                "infer",
                "--model",
                model,
                "--weights",
                rng.choice(["fp16", "bf16", "int8", "gptq-4bit", "awq-4bit", "nf4", "fp8", "fp32"]),
                "--kv-dtype",
                rng.choice(["fp16", "bf16", "fp8", "fp32"]),
                "--context",
                str(rng.choice([512, 2048, 8192, 32768])),
                "--batch",
                str(rng.choice([1, 4, 16, 64])),
            ]
            if rng.random() < 0.3:
                a += ["--mode", "prefill"]
            if rng.random() < 0.3:
                a += ["--prefill-chunk", str(rng.choice([256, 2048]))]
            if rng.random() < 0.5:
                a += ["--gpu", rng.choice(gpus)]
        else:
            method = rng.choice(METHODS)
            a = [
                "fit" if kind == "fit" else "estimate",
                "--model",
                model,
                "--method",
                method,
                "--precision",
                rng.choice(PRECISIONS),
                "--optimizer",
                rng.choice(OPTIMIZERS),
                "--batch",
                str(rng.choice([1, 2, 4, 8])),
                "--seq",
                str(rng.choice([128, 512, 1024, 2048, 4096])),
                "--attention",
                rng.choice(ATTN),
            ]
            if rng.random() < 0.3:
                a += ["--optimizer-impl", rng.choice(IMPLS)]
            if rng.random() < 0.5:
                a += ["--checkpointing"]
            if rng.random() < 0.3:
                a += ["--grad-accum", str(rng.choice([2, 8]))]
            if method in ("lora", "qlora"):
                a += ["--lora-rank", str(rng.choice([4, 8, 16, 64]))]
                if rng.random() < 0.5:
                    a += ["--lora-targets", rng.choice(TARGETS[:3])]
            if method == "qlora":
                a += ["--quant", rng.choice(["nf4", "fp4"]), "--compute-dtype", rng.choice(["bf16", "fp16", "fp32"])]
                if rng.random() < 0.3:
                    a += ["--no-double-quant"]
            if method == "freeze":
                a += ["--trainable-layers", str(rng.choice([1, 2, 4]))]
            if method == "prompt-tuning":
                a += ["--prompt-tokens", str(rng.choice([10, 20, 100]))]
            if kind == "distributed":
                a += [
                    "--gpus",
                    str(rng.choice([2, 4, 8, 16, 64])),
                    "--shard",
                    rng.choice(SHARDS),
                    "--offload",
                    rng.choice(OFFLOADS),
                ]
                if rng.random() < 0.3:
                    a += ["--tp", str(rng.choice([2, 4]))]
                if rng.random() < 0.2:
                    a += ["--pp", str(rng.choice([2, 4]))]
                if rng.random() < 0.2:
                    a += ["--ep", str(rng.choice([2, 8]))]
                if rng.random() < 0.2:
                    a += ["--gpus-per-node", str(rng.choice([4, 8]))]
            if kind == "fit":
                a += ["--gpu", rng.choice(gpus)]
                if rng.random() < 0.3:
                    a += ["--tokens", "1e9", "--mfu", "0.35"]
            elif rng.random() < 0.4:
                a += ["--gpu", rng.choice(gpus)]
        a += ["--json"] if rng.random() < 0.6 else (["--explain"] if kind == "estimate" and rng.random() < 0.3 else [])
        a += ["--lang", rng.choice(["en", "es"])]
        if rng.random() < 0.2:
            a += ["--units", "GiB"]
        cmds.append(a)
    return cmds


def _drop_elapsed(obj):
    if isinstance(obj, dict):
        return {k: _drop_elapsed(v) for k, v in obj.items() if k != "elapsed_ms"}
    if isinstance(obj, list):
        return [_drop_elapsed(v) for v in obj]
    return obj


def _grid() -> list[dict]:
    from grid import GRID  # benchmarks/accuracy/grid.py

    from cabe.analytic import estimate_model
    from cabe.models import preset
    from cabe.training import TrainingSetup

    out = []
    for model, kw in GRID:
        rep = estimate_model(preset(model).spec, TrainingSetup(**kw))
        out.append(
            {
                "model": model,
                "setup": {k: list(v) if isinstance(v, tuple) else v for k, v in kw.items()},
                "report": json.loads(json.dumps(rep.to_json(), default=str)),
            }
        )
    return out


def _stored(requests: list[tuple[str, dict]] | None = None) -> list[dict]:
    """Every request stored by the differential benchmark (each ``results*.json`` / ``.partial.jsonl`` under
    ``benchmarks/differential``, deduplicated), estimated anew: the whole report's JSON, or the error's code.
    ``requests``: the (model, setup) pairs to estimate instead (``--compare`` takes the baseline's own, so a
    result file removed or moved since does not shrink the comparison)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "differential"))
    from run import source  # benchmarks/differential/run.py

    from cabe.analytic import estimate_model
    from cabe.errors import CabeError
    from cabe.training import TrainingSetup

    seen: set[str] = set()
    reqs: list[tuple[str, dict]] = list(requests or [])
    base = ROOT / "benchmarks" / "differential"
    for path in (
        []
        if requests is not None
        else sorted(base.rglob("results*.json")) + sorted(base.rglob("results*.partial.jsonl"))
    ):
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        else:
            rows = json.loads(path.read_text()).get("rows", [])
        for r in rows:
            key = json.dumps([r["model"], r["setup"]], sort_keys=True)
            if key not in seen:
                seen.add(key)
                reqs.append((r["model"], r["setup"]))
    reqs.sort(key=lambda mr: json.dumps(mr, sort_keys=True))
    out = []
    for model, setup in reqs:
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in setup.items()}
        try:
            rep = json.loads(json.dumps(estimate_model(source(model).spec, TrainingSetup(**kw)).to_json(), default=str))
        except CabeError as e:
            rep = {"error": e.code}
        except FileNotFoundError as e:  # a config file a later commit moved
            rep = {"missing": str(e)}
        out.append({"model": model, "setup": setup, "report": rep})
    return out


def _http(cmds: list[list[str]]) -> list[dict]:
    """The same estimate / fit / infer requests through the HTTP API (JSON answers)."""
    from starlette.testclient import TestClient

    from cabe.web.app import create_app

    client = TestClient(create_app())
    out = []
    for argv in cmds:
        if argv[0] not in ("estimate", "fit", "infer") or "--json" not in argv:
            continue
        body: dict = {}
        i = 1
        while i < len(argv):
            flag = argv[i]
            if flag in ("--json", "--explain", "--checkpointing", "--no-double-quant"):
                if flag == "--checkpointing":
                    body["checkpointing"] = True
                if flag == "--no-double-quant":
                    body["double_quant"] = False
                i += 1
                continue
            key, val = flag[2:].replace("-", "_"), argv[i + 1]
            i += 2
            if key in ("lang", "units"):
                continue
            if key == "tokens" or key == "mfu":
                body[key] = float(val)
            elif val.lstrip("-").isdigit():
                body[key] = int(val)
            else:
                body[key] = val
        r = client.post(f"/api/{argv[0]}", json=body)
        out.append({"path": argv[0], "body": body, "status": r.status_code, "json": _drop_elapsed(r.json())})
    return out


def _traces() -> list[dict]:
    """Tiny models of every traced family through ``cabe.trace`` (fake tensors), timing fields dropped."""
    sys.path.insert(0, str(ROOT / "tests" / "trace"))
    import cabe.trace as trace  # before anything imports torch (the fake-CUDA shim)
    from cabe.training import TrainingSetup
    from configs import TINY  # tests/trace/configs.py

    setups = [
        dict(method="full", precision="bf16-amp", batch=2, seq=64),
        dict(method="lora", precision="bf16", batch=2, seq=64, checkpointing=True),
        dict(method="qlora", batch=1, seq=64, attention="eager"),
    ]
    out = []
    for fam, cfg in sorted(TINY.items()):
        for kw in setups:
            res = trace.trace_step(dict(cfg), TrainingSetup(**kw)).to_json()
            # NOTE: the timeline and the split of the peak into components vary from run to run by a few
            # allocations on some families (frees that wait for Python's cycle collector); the peak does not.
            keep = (
                "peak_bytes",
                "peak_phase",
                "phase_peaks",
                "parameters",
                "trainable_parameters",
                "paged_bytes",
                "first_step_peak_bytes",
                "mode",
                "attention_kernels",
                "notes",
                "events",
            )
            out.append({"family": fam, "setup": kw, "result": {k: res.get(k) for k in keep}})
    return out


def snapshot(n_random: int, seed: int, with_traces: bool = True, stored: list[tuple[str, dict]] | None = None) -> dict:
    traces = _traces() if with_traces else []
    from cabe import gpus as gpu_catalog
    from cabe.models import preset_names

    presets = sorted(preset_names())
    gpus = sorted(g.name for g in gpu_catalog.all_gpus())
    rng = random.Random(seed)
    fixed = _fixed(presets, gpus)
    rand = _random(rng, presets, gpus, n_random)
    cli = [_run_cli(a) for a in fixed + rand]
    return {
        "seed": seed,
        "cli": cli,
        "grid": _grid(),
        "stored": _stored(stored),
        "http": _http(rand),
        "trace": traces,
    }


def _first_diff(a: str, b: str) -> str:
    for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines())):
        if x != y:
            return f"line {i + 1}: {x!r} -> {y!r}"
    return f"lengths {len(a)} -> {len(b)}"


def compare(old: dict, new: dict) -> int:
    bad = 0
    for o, n in zip(old["cli"], new["cli"]):
        for k in ("rc", "stdout", "stderr"):
            if o[k] != n[k]:
                bad += 1
                print(f"cli {' '.join(o['argv'])}: {k} {_first_diff(str(o[k]), str(n[k]))}")
                break
    for o, n in zip(old["grid"], new["grid"]):
        if o != n:
            bad += 1
            print(f"grid {o['model']} {o['setup']}: {_first_diff(json.dumps(o, indent=1), json.dumps(n, indent=1))}")
    if len(old.get("stored", [])) != len(new.get("stored", [])):
        bad += 1
        print(f"stored requests: {len(old.get('stored', []))} -> {len(new.get('stored', []))}")
    for o, n in zip(old.get("stored", []), new.get("stored", [])):
        if o != n:
            bad += 1
            print(f"stored {o['model']} {o['setup']}: {_first_diff(json.dumps(o, indent=1), json.dumps(n, indent=1))}")
    for o, n in zip(old["http"], new["http"]):
        if o != n:
            bad += 1
            print(f"http {o['path']} {o['body']}: {_first_diff(json.dumps(o, indent=1), json.dumps(n, indent=1))}")
    for o, n in zip(old.get("trace", []), new.get("trace", [])):
        if o != n:
            bad += 1
            print(f"trace {o['family']} {o['setup']}: {_first_diff(json.dumps(o, indent=1), json.dumps(n, indent=1))}")
    if len(old["cli"]) != len(new["cli"]) or len(old["http"]) != len(new["http"]):
        bad += 1
        print("different number of commands")
    n_trace = len(new.get("trace", [])) and len(old.get("trace", []))
    n_stored = len(old.get("stored", []))
    total = len(old["cli"]) + len(old["grid"]) + n_stored + len(old["http"]) + n_trace
    print(
        f"{total - bad} of {total} outputs identical ({len(old['cli'])} CLI, {len(old['grid'])} grid, "
        f"{n_stored} stored requests, "
        f"{len(old['http'])} HTTP, {n_trace} traces)"
    )
    return 1 if bad else 0


def main() -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":  # set iteration order decides ties: make it repeatable
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", metavar="FILE")
    ap.add_argument("--compare", metavar="FILE")
    ap.add_argument("--random", type=int, default=400)
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--no-trace", action="store_true", help="skip the tiny traces (needs cabe[trace]; ~40 s)")
    args = ap.parse_args()
    old = json.loads(Path(args.compare).read_text()) if args.compare else None
    stored = [(r["model"], r["setup"]) for r in old.get("stored", [])] if old and "stored" in old else None
    snap = snapshot(args.random, args.seed, with_traces=not args.no_trace, stored=stored)
    if args.write:
        Path(args.write).write_text(json.dumps(snap, ensure_ascii=False, indent=0, sort_keys=True) + "\n")
        print(
            f"wrote {len(snap['cli'])} CLI, {len(snap['grid'])} grid, {len(snap['http'])} HTTP outputs "
            f"(seed {args.seed}) to {args.write}"
        )
    if old is not None:
        return compare(old, json.loads(json.dumps(snap, ensure_ascii=False, sort_keys=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
