"""Models whose layers differ (Qwen MoE's dense layers among MoE layers): the estimate sums over its runs
of like layers, and the trace of the real step agrees.

Shapes are tiny and activation-heavy (4 layers, hidden 64, 1,024 tokens) so that the saved tensors of
each kind of layer weigh in the peak.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe.analytic import estimate_model
from cabe.families import from_config
from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace

BASE = dict(
    model_type="qwen3_moe",
    hidden_size=64,
    intermediate_size=192,
    moe_intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    max_position_embeddings=256,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
)
# Qwen2-MoE: the same, with a shared expert beside the routed ones and biases on q, k, v
QWEN2 = dict(BASE, model_type="qwen2_moe", shared_expert_intermediate_size=80)
MIXED = {
    "sparse_step_2": dict(BASE, decoder_sparse_step=2),  # dense, MoE, dense, MoE
    "mlp_only_0": dict(BASE, mlp_only_layers=[0]),  # dense, then 3 MoE layers
    "qwen2_sparse_step_2": dict(QWEN2, decoder_sparse_step=2),
}
SETUPS = {
    "full": dict(method="full", precision="bf16"),
    "lora": dict(method="lora", precision="bf16", lora_targets=("q_proj", "k_proj", "v_proj", "o_proj")),
    "freeze": dict(method="freeze", precision="bf16", trainable_layers=3),
    "full-ckpt": dict(method="full", precision="bf16", checkpointing=True),
}


def _error(cfg: dict, kw: dict) -> tuple[int, int]:
    """(estimate − trace, trace) in bytes, for one training step."""
    from cabe.trace import trace_step

    setup = TrainingSetup(batch=4, seq=256, **kw)
    traced = trace_step(dict(cfg), setup).peak_bytes
    return estimate_model(from_config(dict(cfg)), setup).total_bytes - traced, traced


@pytest.mark.parametrize("setup", sorted(SETUPS))
@pytest.mark.parametrize("config", sorted(MIXED))
def test_mixed_layers_within_3_percent_of_trace(config, setup):
    diff, traced = _error(MIXED[config], SETUPS[setup])
    assert abs(diff) / traced <= 0.03, (diff, traced)


@pytest.mark.parametrize(("base", "setup"), [(BASE, "full"), (BASE, "lora"), (QWEN2, "full")])
def test_mixed_model_errs_by_the_mean_of_its_kinds_of_layer(base, setup):
    """The estimate of a model of 2 dense and 2 MoE layers is off from its trace by, to the byte, the mean
    of what the all-dense and the all-MoE versions are off by: each layer is estimated as its kind is, and
    nothing is lost or counted twice where the kinds meet. (Those two errors are the families' own: here
    e.g. −18,432 B dense and −118,784 B MoE for full bf16, so −68,608 B mixed.)"""
    kw = SETUPS[setup]
    mixed, _ = _error(dict(base, decoder_sparse_step=2), kw)
    dense, _ = _error(dict(base, mlp_only_layers=[0, 1, 2, 3]), kw)
    moe, _ = _error(base, kw)
    assert 2 * mixed == dense + moe, (mixed, dense, moe)
