"""transformers 4.x checkpoints reentrantly by default (``use_reentrant=True``, modeling_utils.py 4.57.6:3691-3692),
5.x non-reentrantly (5.24:3157-3158); cabe counts both the same (note transformers4_reentrant). Proved here on the
installed transformers: the same step traced both ways has the same peak, and the estimate matches it."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import fake_trace

from cabe import models, transformers_line
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace

CASES = {
    "lora": dict(method="lora", batch=2, seq=256, checkpointing=True, dtype="bf16"),
    "full": dict(method="full", batch=1, seq=256, checkpointing=True, dtype="bf16"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reentrant_checkpointing_peaks_as_non_reentrant(case, monkeypatch):
    from cabe.trace import _native

    if not _native.available():
        pytest.skip("the reentrant switch is patched in this process: needs the in-process fake CUDA")
    p = models.preset("llama-3.2-1b")
    setup = TrainingSetup(**CASES[case])
    plain = fake_trace(p.config, setup).peak_bytes
    monkeypatch.setattr("cabe.trace.build.reentrant_checkpointing", lambda line: True)
    reentrant = fake_trace(p.config, setup).peak_bytes
    assert reentrant == plain
    estimate = estimate_model(p.spec, TrainingSetup(**CASES[case], transformers="4")).total_bytes
    # (4.x loads what --dtype says, as 5.x does: the same estimate, within the 0.01% of the savers' cases)
    assert abs(estimate - reentrant) / reentrant < 1e-4
    assert transformers_line.reentrant_checkpointing(4) and not transformers_line.reentrant_checkpointing(5)
