"""torchao's fp8 recipes traced for real on fake CUDA (cabe.trace.fp8: convert_to_float8_training, the casts and
torch._scaled_mm's meta kernel), against the analytic estimate (cabe.fp8); Transformer Engine refused."""

import pytest
from conftest import fake_trace

import cabe.trace  # noqa: F401  (before torch)
from cabe.analytic import estimate_model
from cabe.errors import InvalidValueError
from cabe.families import from_config as spec_from_config
from cabe.training import TrainingSetup

pytest.importorskip("torchao")

# dims divisible by 16 (torch._scaled_mm), an MLP wide enough for the casts to set the peak, a small vocabulary
LLAMA = dict(
    model_type="llama",
    hidden_size=512,
    intermediate_size=2048,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=8,
    vocab_size=512,
    max_position_embeddings=2048,
)


def _trace(setup):

    return fake_trace(dict(LLAMA), setup)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise-gw-hp"])
def test_recipe_traced_within_3_percent(recipe):
    setup = TrainingSetup(method="full", precision="bf16", attention="sdpa", batch=2, seq=1024, fp8=recipe)
    traced = _trace(setup)
    plain = _trace(setup.with_(fp8="none"))
    assert traced.peak_bytes > plain.peak_bytes  # the casts' temporaries (the saved tensors are nn.Linear's)
    assert "trace_fp8_torchao" in traced.notes and "trace_fp8_torchao" not in plain.notes
    est = estimate_model(spec_from_config(LLAMA), setup).total_bytes
    assert abs(est - traced.peak_bytes) / traced.peak_bytes < 0.03


def test_checkpointed_recompute_casts_again_within_3_percent():
    # the recompute runs the output projection's casts again beside all the layer saves (analytic.parts
    # _recompute_transient); its backward casts come after (the '.fp8' moment)
    setup = TrainingSetup(
        method="freeze", trainable_layers=1, precision="bf16", attention="sdpa", batch=2, seq=1024, fp8="rowwise"
    )
    traced = _trace(setup.with_(checkpointing=True))
    est = estimate_model(spec_from_config(LLAMA), setup.with_(checkpointing=True)).total_bytes
    assert abs(est - traced.peak_bytes) / traced.peak_bytes < 0.03


def test_no_autocast_weight_copies_under_torchao():
    setup = TrainingSetup(method="full", precision="bf16-amp", attention="sdpa", batch=4, seq=1024)
    assert _trace(setup).components["weight_copies"] > 0
    assert _trace(setup.with_(fp8="tensorwise")).components["weight_copies"] == 0


def test_transformer_engine_is_refused():
    from cabe.trace import trace_step

    with pytest.raises(InvalidValueError) as e:
        trace_step(dict(LLAMA), TrainingSetup(precision="bf16", fp8="te-delayed"))
    assert e.value.code == "fp8_trace_te"
