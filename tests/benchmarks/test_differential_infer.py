"""A seeded sample of the random differential benchmark of inference (benchmarks/differential/infer.py): ``cabe
infer``'s analytic peak of transformers' generate against that generate traced on fake CUDA tensors, on
configurations a sampler drew.

The seed is fixed here so a failure reproduces (``infer.py -n 6 --small --seed 20261207``); the benchmark itself
draws a new seed on every run. Small models only, to keep the suite fast.
"""

from __future__ import annotations

import pytest
from differential_modules import load

pytest.importorskip("torch")
pytest.importorskip("transformers")

SEED = 20261207
N = 6


@pytest.fixture(scope="module")
def rows():
    mod = load("infer")
    return mod.run(mod.draw(SEED, N, small=True), quiet=True)


def test_every_sampled_configuration_traces(rows):
    failed = [(r["model"], r["request"], r["error"]) for r in rows if r["error"]]
    assert not failed, failed


def test_sampled_configurations_match_the_trace(rows):
    worst = max(rows, key=lambda r: abs(r["relative_error"] or 0))
    assert abs(worst["relative_error"]) <= 0.03, (worst["model"], worst["request"], worst["relative_error"])
