"""Speed of the analytic path (no torch), this tree against another commit in the same run.

    python benchmarks/speed.py                       # this tree alone
    python benchmarks/speed.py --against HEAD~1      # interleaved with HEAD~1's sources (min of N each)
    python benchmarks/speed.py --against HEAD~1 --callgrind   # + instructions per estimate (valgrind)

What it measures, each in fresh worker processes (``--worker``) that import one tree's ``src`` only:

* **repeat**: one request estimated again and again (``estimate_model(spec, setup)``, the same objects), µs per
  estimate (targets: 100 µs for llama-3.1-8b full / QLoRA, 150 µs for a 405B LoRA on an idle core). cabe keeps no
  cache of whole estimates: what is memoized depends on the model and the request's fields other than the batch and
  the sequence (model states, parameter tensors per run of layers, explanations of them).
* **sweep**: what ``cabe fit`` and the page do: one request whose batch, sequence and method vary. Every round uses
  sequence lengths no earlier round used, so no (spec, setup) is ever estimated twice in a process: µs per estimate,
  the best round.
* **cold**: the first estimate in a fresh process, after ``import cabe.analytic`` and the preset are loaded (what the
  first request pays for lazily built tables), and the imports themselves.
* **fit 70B**: ``cabe fit --model llama-3.1-70b --gpu h100-80gb`` in process, the first call and the best of later
  ones (target < 1 s); the whole command in a fresh interpreter is in the CLI rows.
* **CLI**: ``python -m cabe estimate --model llama-3.1-8b --method lora --json`` and the fit above in a fresh
  interpreter, median of 7 (target <= 0.3 s for the estimate), with bytecode compiled as an installed package has it
  (a private ``PYTHONPYCACHEPREFIX``; the first run writes it), and without (``PYTHONDONTWRITEBYTECODE``: every module
  compiled on each start).

Timings on a shared machine are noisy: the two trees' workers alternate and each figure is the minimum over the
workers. ``--callgrind`` counts instructions (valgrind's callgrind: N estimates minus none) for a ratio that does not
depend on the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

REPEAT = [
    ("llama-3.1-8b full", "llama-3.1-8b", {"method": "full", "batch": 4, "seq": 2048}, 100),
    ("llama-3.1-8b qlora", "llama-3.1-8b", {"method": "qlora", "batch": 4, "seq": 2048, "checkpointing": True}, 100),
    ("llama-3.1-405b lora", "llama-3.1-405b", {"method": "lora", "precision": "bf16", "batch": 1, "seq": 8192}, 150),
]
SWEEP_MODEL = "llama-3.1-8b"
SWEEP_METHODS = ("full", "lora", "qlora")
SWEEP_BATCHES = (1, 2, 4, 8)
FIT_ARGS = ["fit", "--model", "llama-3.1-70b", "--gpu", "h100-80gb"]
CLI_ESTIMATE = ["estimate", "--model", "llama-3.1-8b", "--method", "lora", "--json"]


# ---- the worker: runs in a fresh process on one tree's sources ----------------------------------------------------


def _sweep(rnd: int) -> list[dict]:
    """One round of the sweep: every method × batch, at sequence lengths that are new in this round."""
    return [
        {"method": m, "batch": b, "seq": 1024 + 64 * (rnd * len(SWEEP_BATCHES) + i), "checkpointing": m == "qlora"}
        for m in SWEEP_METHODS
        for i, b in enumerate(SWEEP_BATCHES)
    ]


def _worker(n: int) -> dict:
    t0 = time.perf_counter()
    from cabe.analytic import estimate_model
    from cabe.models import preset
    from cabe.training import TrainingSetup

    imports = time.perf_counter() - t0
    out: dict = {"imports_s": imports}
    spec = preset("llama-3.1-8b").spec
    setup = TrainingSetup(method="lora", batch=4, seq=2048)
    t0 = time.perf_counter()
    estimate_model(spec, setup)
    out["cold_us"] = (time.perf_counter() - t0) * 1e6
    for name, model, kw, _ in REPEAT:
        spec, setup = preset(model).spec, TrainingSetup(**kw)
        estimate_model(spec, setup)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                estimate_model(spec, setup)
            best = min(best, (time.perf_counter() - t0) / n)
        out[name] = best * 1e6
    spec = preset(SWEEP_MODEL).spec
    best = float("inf")
    for rnd in range(8):
        setups = [TrainingSetup(**kw) for kw in _sweep(rnd)]  # built outside the timing, as fit builds its own
        t0 = time.perf_counter()
        for s in setups:
            estimate_model(spec, s)
        best = min(best, (time.perf_counter() - t0) / len(setups))
    out["sweep"] = best * 1e6
    import contextlib
    import io

    from cabe.cli import main

    fits = []
    for _ in range(4):
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            main(FIT_ARGS)
        fits.append(time.perf_counter() - t0)
    out["fit_first_s"], out["fit_s"] = fits[0], min(fits[1:])
    return out


def _callgrind_worker(case: str, n: int) -> None:
    """``n`` estimates of one case (``sweep`` or a REPEAT name), after one warm-up: for callgrind's count."""
    from cabe.analytic import estimate_model
    from cabe.models import preset
    from cabe.training import TrainingSetup

    if case == "sweep":
        spec = preset(SWEEP_MODEL).spec
        for s in [TrainingSetup(**kw) for kw in _sweep(0)]:
            estimate_model(spec, s)
        setups = [TrainingSetup(**kw) for r in range(1, 1 + -(-n // len(_sweep(0)))) for kw in _sweep(r)][:n]
        for s in setups:
            estimate_model(spec, s)
        return
    _, model, kw, _ = next(c for c in REPEAT if c[0] == case)
    spec, setup = preset(model).spec, TrainingSetup(**kw)
    estimate_model(spec, setup)
    for _ in range(n):
        estimate_model(spec, setup)


# ---- the driver ---------------------------------------------------------------------------------------------------


def _tree(ref: str, tmp: Path) -> Path:
    """``ref``'s sources, unpacked under ``tmp`` (git archive: no worktree to clean up)."""
    dest = tmp / ref.replace("/", "_").replace("~", "-").replace("^", "-")
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _env(tree: Path, pyc: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPATH"] = str(tree / "src")
    if pyc is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = str(pyc)
    return env


def _run_worker(tree: Path, n: int, pyc: Path) -> dict:
    r = subprocess.run(
        [sys.executable, __file__, "--worker", str(n)], env=_env(tree, pyc), capture_output=True, text=True, check=True
    )
    return json.loads(r.stdout)


def _cli(tree: Path, argv: list[str], pyc: Path | None) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cabe", *argv], env=_env(tree, pyc), check=True, capture_output=True)
    return time.perf_counter() - t0


def _instructions(tree: Path, case: str, n: int, pyc: Path) -> float:
    """Instructions per estimate: callgrind's total for n estimates less that for none, over n."""
    totals = []
    for k in (0, n):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "cg.out"
            subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={out}",
                    sys.executable,
                    __file__,
                    "--callgrind-worker",
                    case,
                    str(k),
                ],
                env=_env(tree, pyc),
                check=True,
                capture_output=True,
            )
            line = next(x for x in out.read_text().splitlines() if x.startswith(("summary:", "totals:")))
            totals.append(int(line.split()[1]))
    return (totals[1] - totals[0]) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", metavar="REF", help="a git ref whose sources run beside this tree's, interleaved")
    ap.add_argument("--workers", type=int, default=5, help="worker processes per tree (min taken)")
    ap.add_argument("-n", type=int, default=1000, help="estimates per timed loop")
    ap.add_argument("--callgrind", action="store_true", help="also count instructions per estimate (valgrind)")
    ap.add_argument("--worker", type=int, metavar="N", help=argparse.SUPPRESS)
    ap.add_argument("--callgrind-worker", nargs=2, metavar=("CASE", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        print(json.dumps(_worker(args.worker)))
        return
    if args.callgrind_worker is not None:
        _callgrind_worker(args.callgrind_worker[0], int(args.callgrind_worker[1]))
        return
    with tempfile.TemporaryDirectory(prefix="cabe-speed-") as tmp_name:
        tmp = Path(tmp_name)
        trees = {"this tree": ROOT}
        if args.against:
            trees = {args.against: _tree(args.against, tmp), "this tree": ROOT}
        pyc = {name: tmp / f"pyc{i}" for i, name in enumerate(trees)}
        for name, tree in trees.items():  # compile once: an installed package has its bytecode
            _cli(tree, CLI_ESTIMATE, pyc[name])
        results: dict[str, list[dict]] = {name: [] for name in trees}
        cli: dict[str, dict[str, list[float]]] = {
            name: {"estimate": [], "estimate_nopyc": [], "fit": []} for name in trees
        }
        for _ in range(args.workers):  # interleaved: the two trees see the same load
            for name, tree in trees.items():
                results[name].append(_run_worker(tree, args.n, pyc[name]))
        for _ in range(7):
            for name, tree in trees.items():
                cli[name]["estimate"].append(_cli(tree, CLI_ESTIMATE, pyc[name]))
                cli[name]["estimate_nopyc"].append(_cli(tree, CLI_ESTIMATE, None))
                cli[name]["fit"].append(_cli(tree, FIT_ARGS, pyc[name]))
        cg: dict[str, dict[str, float]] = {}
        if args.callgrind:
            for name, tree in trees.items():
                cg[name] = {c[0]: _instructions(tree, c[0], 200, pyc[name]) for c in REPEAT}
                cg[name]["sweep"] = _instructions(tree, "sweep", 120, pyc[name])
    _print(trees, results, cli, cg)


def _print(trees: dict, results: dict, cli: dict, cg: dict) -> None:
    names = list(trees)
    head = "".join(f"{n:>16}" for n in names)
    ratio = len(names) == 2
    print(f"{'':44}{head}{'  new/old' if ratio else ''}   target")

    def row(label: str, vals: list[float], fmt: str, target: str) -> None:
        cells = "".join(f"{format(v, fmt):>16}" for v in vals)
        r = f"{vals[1] / vals[0]:9.2f}" if ratio and vals[0] else ""
        print(f"{label:<44}{cells}{r}   {target}")

    def best(name: str, key: str) -> float:
        return min(w[key] for w in results[name])

    for label, _, _, target in REPEAT:
        row(f"repeat {label} (µs/estimate)", [best(n, label) for n in names], ".1f", f"<= {target}")
    row("sweep llama-3.1-8b batch×seq×method (µs/est.)", [best(n, "sweep") for n in names], ".1f", "")
    row("cold: first estimate in a process (µs)", [best(n, "cold_us") for n in names], ".0f", "")
    row("cold: import cabe.analytic + models (s)", [best(n, "imports_s") for n in names], ".3f", "")
    row("fit 70B in process, first call (s)", [best(n, "fit_first_s") for n in names], ".3f", "< 1")
    row("fit 70B in process, later calls (s)", [best(n, "fit_s") for n in names], ".3f", "< 1")
    med = {n: {k: statistics.median(v) for k, v in cli[n].items()} for n in names}
    row("CLI estimate, fresh interpreter (s, median)", [med[n]["estimate"] for n in names], ".3f", "<= 0.3")
    row("CLI estimate, no bytecode cache (s, median)", [med[n]["estimate_nopyc"] for n in names], ".3f", "")
    row("CLI fit 70B, fresh interpreter (s, median)", [med[n]["fit"] for n in names], ".3f", "< 1")
    for case in cg.get(names[0], {}):
        row(f"callgrind {case} (k instr./estimate)", [cg[n][case] / 1e3 for n in names], ".0f", "")


if __name__ == "__main__":
    main()
