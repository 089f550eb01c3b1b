"""The trace refuses what it would otherwise run differently without a word (a packed batch), and names what PEFT
did differently from what was asked (a LoRA target that matched no module), as the estimate does."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe.analytic import estimate_model
from cabe.errors import ConfigError
from cabe.models import preset
from cabe.trace import trace_step
from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace


@pytest.mark.parametrize("packing", ["packed", "padding-free"])
def test_a_packed_batch_is_refused_not_traced_padded(packing):
    with pytest.raises(ConfigError) as e:
        trace_step(dict(preset("llama-3.2-1b").config), TrainingSetup(packing=packing, seq=64))
    assert (e.value.code, e.value.field) == ("packing_not_traced", "packing")


def test_an_unmatched_lora_target_is_named_by_the_trace_as_by_the_estimate():
    source = preset("llama-3.2-1b")
    setup = TrainingSetup(method="lora", batch=1, seq=64, lora_targets=("q_proj", "v_proj", "c_attn"))
    res = trace_step(dict(source.config), setup, mode="fake")
    est = estimate_model(source.spec, setup)
    assert "lora_target_unmatched" in res.notes and "lora_target_unmatched" in est.notes
    assert res.setup["lora_unmatched"] == est.extra["lora_unmatched"] == "c_attn"
    assert "c_attn" in res.note_texts("es")[res.notes.index("lora_target_unmatched")]
    assert abs(est.total_bytes - res.peak_bytes) <= 1e-3 * res.peak_bytes
