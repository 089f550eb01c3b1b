"""The random differential benchmark of TRL's preference trainers: cabe's DPO and KTO estimates against a step traced
with TRL's own code (``cabe.trace.preference``: ``DPOTrainer._compute_loss`` / ``KTOTrainer._compute_loss``, the
fused LM head, the KL rows' and the reference's no-grad forwards), on configurations nobody chose.

    PYTHONPATH=src .venv/bin/python benchmarks/differential/objectives.py -n 8 -j 1          # a new seed
    PYTHONPATH=src .venv/bin/python benchmarks/differential/objectives.py -n 8 --seed 7      # reproduce a run
    PYTHONPATH=src .venv/bin/python benchmarks/differential/objectives.py --rescore 7        # its traces, today's estimate

Each configuration is the single-GPU sampler's (``run.sample``, models up to 1.6B) made a DPO run: the methods TRL
trains a preference objective with (full, freeze, LoRA, QLoRA; prompt tuning, packing and images left out: TRL 1.16's
DPO collator neither packs nor is traced here with images), transformers' loss head replaced by TRL's (no ``loss``),
then the DPO knobs from the configuration's own generator: the prompt's share of each row, the reference (TRL's
default, a separate copy, precomputed log-probabilities) and WPO weighting. What cabe refuses is drawn again; what the
trace cannot run is recorded. The seed is printed first and is new on every run unless given.

A third of the draws are made KTO runs (``--objectives dpo`` keeps the DPO-only draws of the first runs).
Writes ``results/results-<seed>-preference.json`` (``-dpo`` for a DPO-only run) and ``.md`` and a row of the table of every run (``results/README.md``).
Target (issue 33): max |error| <= 3 %.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import run as single  # this directory's single-GPU benchmark: its sampler, runner and writers

from cabe.analytic import estimate_model
from cabe.errors import CabeError
from cabe.training import TrainingSetup

METHODS = ("full", "freeze", "lora", "qlora")
#: what the DPO step does not take from the SFT sampler
DROPPED = ("loss", "loss_chunks", "packing", "images", "image_size", "prompt_tokens")


def sample(rng: random.Random, objectives: tuple[str, ...] = ("dpo", "kto")) -> tuple[str, dict[str, Any]]:
    """One configuration: a model name and the setup's keyword arguments; a DPO one, made a KTO one a third of the
    time when ``objectives`` has kto (from its own generator: with ``("dpo",)`` the draws are the DPO-only
    sampler's, seeds 1163973539 and 609307977)."""
    while True:
        model, kw = single.sample(rng, small=True)
        if kw["method"] in METHODS:
            break
    for name in DROPPED:
        kw.pop(name, None)
    kw["objective"] = "dpo"
    drng = random.Random(f"dpo {model} {sorted(kw.items())}")
    kw["prompt_length"] = int(kw["seq"] * drng.choice([0.0, 0.25, 0.5, 0.75]))
    pick = drng.random()
    if pick < 0.25:
        kw["precompute_ref_log_probs"] = True
    elif pick < 0.45 and kw["method"] in ("lora",):
        kw["ref_model"] = "copy"
    if drng.random() < 0.2:
        kw["use_weighting"] = True
    krng = random.Random(f"kto {model} {sorted(kw.items())}")
    if "kto" in objectives and krng.random() < 1 / 3:  # KTOTrainer: the unpaired batch, its KL rows or not
        kw["objective"] = "kto"
        kw.pop("use_weighting", None)
        if krng.random() < 0.3:
            kw["loss_type"] = "apo_zero_unpaired"
    return model, kw


def draw(seed: int, n: int, objectives: tuple[str, ...] = ("dpo", "kto")) -> list[tuple[str, dict[str, Any]]]:
    """``n`` configurations cabe estimates, drawn from ``seed``."""
    rng = random.Random(seed)
    out: list[tuple[str, dict[str, Any]]] = []
    while len(out) < n:
        model, kw = sample(rng, objectives)
        try:
            estimate_model(single.source(model).spec, TrainingSetup(**kw))
        except CabeError:
            continue
        out.append((model, kw))
    return out


def rescore(seed: int, suffix: str = "-preference") -> int:
    """Each configuration of ``results-<seed><suffix>.json`` estimated again with today's analytic code against the
    trace recorded then (valid while the trace's code is unchanged: say so when quoting it)."""
    rows = json.loads((single.RESULTS / f"results-{seed}{suffix}.json").read_text())["rows"]
    errors = []
    for r in rows:
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in r["setup"].items()}
        if r.get("trace_bytes") is None:
            print(f"{r['model']:24s} not traced then")
            continue
        try:
            est = estimate_model(single.source(r["model"]).spec, TrainingSetup(**kw)).total_bytes
        except CabeError as e:
            print(f"{r['model']:24s} refused now: {e.code}")
            continue
        err = (est - r["trace_bytes"]) / r["trace_bytes"]
        errors.append(abs(err))
        then = r["relative_error"]
        was = f"{100 * then:+7.2f}% -> " if then is not None else ""
        print(f"{r['model']:24s} {was}{100 * err:+7.2f}%  {' '.join(f'{k}={v}' for k, v in kw.items())}")
    errors.sort()
    within = sum(e <= 0.03 for e in errors)
    print(
        f"seed {seed} rescored: {len(errors)} configurations, {within} within 3%, median "
        f"{100 * errors[len(errors) // 2]:.2f}%, max {100 * errors[-1]:.2f}%"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--seed", type=int)
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--objectives", default="dpo,kto", help="dpo: the DPO-only draws of the first seeds")
    ap.add_argument("--rescore", type=int, metavar="SEED", help="re-estimate a run's recorded traces with today's code")
    args = ap.parse_args(argv)
    if args.rescore is not None:
        return rescore(args.rescore, "-dpo" if args.objectives == "dpo" else "-preference")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    print(f"seed {seed}", flush=True)
    objectives = tuple(o for o in args.objectives.split(",") if o)
    rows = single.run(draw(seed, args.n, objectives), jobs=args.jobs)
    print(json.dumps({"seed": seed, **single.summary(rows)}))
    if not args.no_write:
        single._write(rows, seed, single.RESULTS, suffix="-dpo" if objectives == ("dpo",) else "-preference")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
