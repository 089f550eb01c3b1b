"""A seeded sample of the multi-GPU differential benchmark (benchmarks/differential/multigpu.py): the per-GPU
estimate against rank 0 of the real engine (FSDP2, HSDP, DDP) traced on PyTorch's fake process group, on
configurations a sampler drew — not chosen by us.

The seed is fixed here so a failure reproduces (``multigpu.py -n 8 --small --seed 20261207``); the benchmark itself
draws a new seed on every run. Small models only, to keep the suite fast.
"""

from __future__ import annotations

import pytest
from differential_modules import load

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

SEED = 20261207
N = 8

pytestmark = pytest.mark.trace


@pytest.fixture(scope="module")
def rows():
    # (no tensor parallelism here: the engines that meet the 3% target; the TP sample below says where TP stands)
    mod = load("multigpu")
    return mod.single.run(mod.draw(SEED, N, small=True, tp_share=0.0), quiet=True)


def test_the_sample_spans_the_engines(rows):
    assert {r["setup"]["shard"] for r in rows} >= {"fsdp", "ddp"}
    assert max(r["setup"]["gpus"] for r in rows) >= 16


def test_every_sampled_configuration_traces(rows):
    failed = [(r["model"], r["setup"], r["error"]) for r in rows if r["error"]]
    assert not failed, failed


def test_sampled_configurations_match_rank_0(rows):
    worst = max(rows, key=lambda r: abs(r["relative_error"] or 0))
    assert abs(worst["relative_error"]) <= 0.03, (worst["model"], worst["setup"], worst["relative_error"])


@pytest.fixture(scope="module")
def tp_rows():
    mod = load("multigpu")
    return mod.single.run(mod.draw(SEED, 4, small=True, tp_share=1.0), quiet=True)


def test_tensor_parallel_sample_traces_and_matches_rank_0(tp_rows):
    """Tensor parallelism (transformers' TP plan on DTensor, alone and under FSDP2 / HSDP) on drawn configurations:
    every one traces and each is within 3% (TP's saved tensors tensor by tensor: cabe.parallel.activations
    ``tensor_parallel_saved``). Measured 2026-12-07: gemma-2-2b HSDP over TP 2 (tied, GaLore) -0.0002% (+16.4%
    before), llama-3.2-1b FSDP2 over TP 4 (nf4 freeze) +0.70%, pythia-1.4b TP 2 alone -0.01%, pythia-1.4b FSDP2 over
    TP 8 -1.27%."""
    assert all(r["setup"]["tp"] > 1 for r in tp_rows)
    failed = [(r["model"], r["setup"], r["error"]) for r in tp_rows if r["error"]]
    assert not failed, failed
    worst = max(tp_rows, key=lambda r: abs(r["relative_error"]))
    assert abs(worst["relative_error"]) <= 0.03, (worst["model"], worst["setup"], worst["relative_error"])
