"""Mistral Small 3.x (``mistral3``) through the trace: AutoModelForCausalLM does not map it, so the trace builds the
config's Mistral3ForConditionalGeneration (cabe.trace.build ``_published_class``) and feeds it text; the Pixtral
tower is frozen weights (QLoRA quantizes its linear layers as the decoder's). The estimate within 3%."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe import families
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace

TINY = {
    "architectures": ["Mistral3ForConditionalGeneration"],
    "model_type": "mistral3",
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "mistral",
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 4000,
        "sliding_window": None,
    },
    "vision_config": {"model_type": "pixtral", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2},
}


@pytest.mark.parametrize(
    "kw",
    [
        dict(precision="bf16", batch=2, seq=512),
        dict(method="qlora", precision="bf16-amp", batch=2, seq=512),
        dict(method="lora", precision="bf16", batch=2, seq=512, checkpointing=True),
    ],
    ids=["full", "qlora", "lora"],
)
def test_mistral3_estimate_within_3_percent_of_trace(kw):
    from cabe.trace import trace_step

    spec = families.from_config(TINY)
    setup = TrainingSetup(**kw)
    traced = trace_step(dict(TINY), setup)
    if "method" not in kw:  # the whole model, the tower and the projector included
        assert traced.parameters == spec.parameter_count
    estimated = estimate_model(spec, setup).total_bytes
    assert abs(estimated - traced.peak_bytes) / traced.peak_bytes <= 0.03, (estimated, traced.peak_bytes)
