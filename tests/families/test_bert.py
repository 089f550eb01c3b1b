"""BERT: a post-LayerNorm encoder planned with BertForSequenceClassification's head."""

from cabe import api, families
from cabe.activations import head_activations
from cabe.analytic import estimate_model
from cabe.models import preset
from cabe.precision import dtypes_for
from cabe.training import TrainingSetup


def test_bert_base_parameters_term_by_term():
    spec = preset("bert-base-uncased").spec
    h, f, v, p, layers = 768, 3072, 30522, 512, 12
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h  # q, k, v, o; MLP; two LayerNorms
    head = (h * h + h) + (h * 2 + 2)  # pooler, 2-label classifier
    # word + position + token-type embeddings, the embeddings' LayerNorm (the spec's final norm), the head
    assert spec.parameter_count == v * h + p * h + 2 * h + layers * layer + 2 * h + head == 109_483_778
    assert spec.parameter_breakdown()["classifier"] == head
    assert "lm_head" not in spec.parameter_breakdown()


def test_bert_kinds_are_data():
    spec = preset("bert-large-uncased").spec
    assert (spec.head, spec.num_labels, spec.token_types) == ("sequence_classification", 2, 2)
    assert (spec.norm, spec.norm_placement, spec.position) == ("layernorm", "post", "learned")
    assert spec.peft_default_targets == ("query", "value")  # peft/utils/constants.py, "bert"
    assert not spec.eager_softmax_fp32  # eager_attention_forward: softmax without an fp32 dtype
    assert spec.parameter_count == 335_143_938


def test_num_labels_from_id2label():
    cfg = {k: v for k, v in preset("bert-base-uncased").config.items() if k != "_cabe"}
    spec = families.from_config({**cfg, "id2label": {"0": "a", "1": "b", "2": "c"}})
    assert spec.num_labels == 3
    assert spec.classifier_count == 768 * 768 + 768 + 768 * 3 + 3


def test_classification_head_saves_no_logits():
    spec = preset("bert-large-uncased").spec
    setup = TrainingSetup(precision="fp32", batch=4, seq=512, attention="eager")
    head = head_activations(spec, setup, dtypes_for(setup))
    # the embeddings' LayerNorm input (fp32, 4·h), its mean and rstd (8) and dropout's 1-byte mask (h)
    assert head.final_norm == 4 * 1024 + 8 + 1024
    assert (head.logits, head.saved_logsoftmax, head.forward_peak_extra, head.backward_peak_extra) == (0, 0, 0, 0)
    report = estimate_model(spec, setup)
    assert "logits" not in report.components or report.components["logits"] == 0
    # no vocabulary-wide fp32 buffer in the allocator's slack: 5 % of the peak
    assert report.allocator_slack_bytes == round(report.total_bytes * 0.05)


def test_bert_estimate_through_the_api():
    r = api.build({"model": "bert-base-uncased", "precision": "fp32", "batch": 4, "seq": 512, "attention": "eager"})
    assert r.parameters == 109_483_778
    assert r.components["weights"] > 0 and r.components["activations"] > r.components["weights"]
