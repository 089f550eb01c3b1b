"""TRL's preference trainers (cabe.objectives.preference): the phases each one has, the reference's weights beside
the policy, the typed refusals, and a DPO step traced with TRL 1.16's own code against the estimate."""

import pytest

from cabe import models, schema
from cabe.analytic import estimate_model
from cabe.errors import CabeError
from cabe.training import TrainingSetup

LLAMA = models.preset("llama-3.2-1b")


def _est(**kw):
    return estimate_model(LLAMA.spec, TrainingSetup(**kw))


def test_dpo_full_keeps_a_reference_copy_and_runs_its_forward():
    """Full fine-tuning: TRL loads a frozen copy in the policy's dtype (dpo_trainer.py:396-417): its bytes are the
    parameters × 2 (bf16) + buffers, beside every phase; the reference's no-grad forward is a phase of its own."""
    r = _est(method="full", dtype="bf16", batch=2, seq=512, objective="dpo", prompt_length=128)
    assert r.components["reference_weights"] == LLAMA.spec.parameter_count * 2 + LLAMA.spec.buffer_bytes
    assert {"forward", "backward", "optimizer", "reference"} <= set(r.phase_peaks)
    assert r.total_bytes == max(r.phase_peaks.values())
    assert r.peak_phase == max(r.phase_peaks, key=r.phase_peaks.get)


def test_dpo_rows_are_chosen_and_rejected():
    """The policy's step runs 2 × batch rows (DataCollatorForPreference): with a precomputed reference, a DPO step
    over batch 2 holds more than the same trainer's over batch 1 by about an SFT step's activations of 2 rows."""
    one = _est(method="lora", batch=1, seq=512, objective="dpo", precompute_ref_log_probs=True)
    two = _est(method="lora", batch=2, seq=512, objective="dpo", precompute_ref_log_probs=True)
    assert "reference" not in two.phase_peaks and "precompute" in two.phase_peaks
    assert "reference_weights" not in two.components
    assert two.total_bytes > one.total_bytes


def test_lora_reference_is_the_base_with_adapters_off():
    r = _est(method="lora", batch=2, seq=512, objective="dpo")
    assert "reference_weights" not in r.components and "reference" in r.phase_peaks


def test_kto_kl_batch_only_with_the_kto_loss():
    """calculate_kl is every KTO loss type but apo_zero_unpaired (kto_trainer.py:815)."""
    assert "kl" in _est(method="lora", batch=2, seq=512, objective="kto").phase_peaks
    assert "kl" not in _est(method="lora", batch=2, seq=512, objective="kto", loss_type="apo_zero_unpaired").phase_peaks


def test_orpo_has_no_reference():
    r = _est(method="lora", batch=2, seq=512, objective="orpo")
    assert "reference" not in r.phase_peaks and "reference_weights" not in r.components


@pytest.mark.parametrize(
    "kw, code",
    [
        (dict(objective="orpo", precompute_ref_log_probs=True), "orpo_no_reference"),
        (dict(objective="dpo", method="full", ref_model="adapter-off"), "ref_adapter_off_needs_adapter"),
        (dict(objective="dpo", prompt_length=512), "prompt_not_below_seq"),
        (dict(objective="kto", loss_type="sigmoid"), "loss_type_objective"),
        (dict(objective="kto", use_weighting=True), "dpo_only"),
        (dict(objective="dpo", loss="chunked"), "loss_with_trl_head"),
    ],
)
def test_bad_combinations_are_typed_errors(kw, code):
    setup = TrainingSetup(**{"method": "lora", "seq": 512, **kw})
    with pytest.raises(CabeError) as e:
        estimate_model(LLAMA.spec, setup)
    assert e.value.code == code


def test_preference_options_refused_with_another_objective():
    out = schema.inapplicable({"prompt_length": 64})
    assert ("prompt_length", "objective_only") in [(n, c) for n, c, _ in out]
    assert not [
        c for _, c, _ in schema.inapplicable({"prompt_length": 64, "objective": "dpo"}) if c == "objective_only"
    ]
