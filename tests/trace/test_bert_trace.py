"""BERT traced as transformers builds it for fine-tuning (AutoModelForSequenceClassification, one label per
sequence), and cabe's estimate within 3% of that trace."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe.analytic import estimate_model
from cabe.models import preset
from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace

_EAGER = dict(attention="eager", batch=4, seq=512)
SAMPLE = [
    ("bert-base-uncased", dict(precision="fp16-amp", **_EAGER)),
    ("bert-base-uncased", dict(precision="fp32", checkpointing=True, **_EAGER)),
    ("bert-large-uncased", dict(precision="fp32", optimizer_impl="for-loop", **_EAGER)),
]


@pytest.mark.parametrize("model,kw", SAMPLE, ids=[f"{m}-{i}" for i, (m, _) in enumerate(SAMPLE)])
def test_bert_estimate_within_3_percent_of_trace(model, kw):
    from cabe.trace import trace_step

    src = preset(model)
    setup = TrainingSetup(**kw)
    traced = trace_step(dict(src.config), setup)
    assert traced.parameters == src.spec.parameter_count  # the classifier head, not a causal LM
    assert traced.components["logits"] == 0
    estimated = estimate_model(src.spec, setup).total_bytes
    assert abs(estimated - traced.peak_bytes) / traced.peak_bytes <= 0.03, (estimated, traced.peak_bytes)


def test_classification_inputs_are_one_label_per_sequence():
    from cabe.trace.build import hf_config
    from cabe.trace.inputs import make_inputs

    cfg = hf_config({k: v for k, v in preset("bert-base-uncased").config.items() if k != "_cabe"})
    cfg.problem_type = "single_label_classification"
    ids, labels, positions = make_inputs(cfg, TrainingSetup(batch=3, seq=16), "cpu")
    assert tuple(ids.shape) == (3, 16) and tuple(labels.shape) == (3,) and positions is None
    assert int(labels.max()) < cfg.num_labels
