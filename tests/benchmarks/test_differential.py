"""A seeded sample of the random differential benchmark (benchmarks/differential/run.py): the analytic
estimate against the trace of the same request, on configurations a sampler drew — not chosen by us.

The seed is fixed here so a failure reproduces (``run.py -n 40 --small --seed 20261204``); the benchmark
itself draws a new seed on every run. Small models only, to keep the suite fast.
"""

from __future__ import annotations

import statistics

import pytest
from differential_modules import load

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

SEED = 20261204
N = 40


@pytest.fixture(scope="module")
def rows():
    mod = load("run")
    return mod.run(mod.draw(SEED, N, small=True), quiet=True)


def test_every_sampled_configuration_traces(rows):
    failed = [(r["model"], r["setup"], r["error"]) for r in rows if r["error"]]
    assert not failed, failed


def test_sampled_configurations_match_the_trace(rows):
    errs = [abs(r["relative_error"]) for r in rows if r["relative_error"] is not None]
    worst = max(rows, key=lambda r: abs(r["relative_error"] or 0))
    assert max(errs) <= 0.03, (worst["model"], worst["setup"], worst["relative_error"])
    assert statistics.median(errs) <= 0.003


def test_no_invariant_broken(rows):
    broken = [(r["model"], r["setup"], r["invariants_broken"]) for r in rows if r["invariants_broken"]]
    assert not broken, broken
