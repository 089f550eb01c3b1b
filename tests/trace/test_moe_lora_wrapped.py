"""LoRA on transformers 5's fused MoE experts, as PEFT 0.22.0 really places it (cabe.method.lora_parameter_targets,
kept_targets, cabe.activations.moe ``_wrapped_parameters``): for the model types it converts (Mixtral, Qwen2-MoE,
Qwen3-MoE, DeepSeek-V3), the expert and router names of ``all-linear`` become ``ParamWrapper`` adapters on the 3-D
expert stacks (gate_up_proj at twice the rank) and the router, each MoE layer keeps W + ΔW of its whole stack for
backward, and the dense / shared MLPs' nn.Linear modules of those names keep their adapters (PEFT 0.21.2 dropped
them, and did not convert Qwen2-MoE at all). Before: DeepSeek-V3 QLoRA was −50% against the trace (differential
seed 844940971). Trainable parameters equal PEFT's, totals within 1.5% of the fake-CUDA trace."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from cabe import families
from cabe.analytic import estimate_model
from cabe.errors import InvalidValueError
from cabe.method import lora_parameter_targets
from cabe.training import TrainingSetup
from configs import DEEPSEEK_V3, TINY

pytestmark = pytest.mark.trace

CONFIGS = {"mixtral": TINY["mixtral"], "qwen2_moe": TINY["qwen2_moe"], "qwen3_moe": TINY["qwen3_moe"]}
CONFIGS["deepseek_v3"] = DEEPSEEK_V3
SETUPS = {
    "lora-bf16": dict(method="lora", precision="bf16"),
    "qlora-amp": dict(method="qlora", dtype="bf16", autocast="bf16"),
    "lora-fp32-ckpt": dict(method="lora", dtype="fp32", autocast="none", checkpointing=True),
}


@pytest.mark.parametrize("setup_name", sorted(SETUPS))
@pytest.mark.parametrize("model", sorted(CONFIGS))
def test_all_linear_on_fused_experts_matches_the_trace(model, setup_name):
    from cabe.trace import trace_step

    cfg = CONFIGS[model]
    setup = TrainingSetup(batch=2, seq=256, lora_targets=("all-linear",), **SETUPS[setup_name])
    traced = trace_step(dict(cfg), setup)
    est = estimate_model(families.from_config(cfg), setup)
    assert est.trainable_parameters == traced.trainable_parameters
    assert abs(est.total_bytes - traced.peak_bytes) / traced.peak_bytes < 0.015, (est.total_bytes, traced.peak_bytes)


def test_wrapped_expert_adapters_have_peft_shapes():
    # tiny DeepSeek-V3: 16 experts of gate_up (2·128 x 256) and down (256 x 128), router 16 x 256; r = 8.
    # gate_up is reached from gate_proj and up_proj: rank 2·8 per expert -> lora_A 16·16 x 256, lora_B 256 x 16·16
    spec = families.from_config(DEEPSEEK_V3)
    moe = spec.runs[-1]
    wrapped = {lin.name: m for lin, m in lora_parameter_targets(spec, ("all-linear",), moe)}
    assert wrapped == {"gate": 1, "experts.gate_up_proj": 2, "experts.down_proj": 1}
    assert lora_parameter_targets(spec, ("q_b_proj", "o_proj"), moe) == ()
    # per MoE layer: 2·8·16·(256 + 256) + 8·16·(128 + 256) + 8·(256 + 16) = (16384 + 6144 + 272)·8 = 182400
    est = estimate_model(spec, TrainingSetup(method="lora", lora_targets=("gate_proj", "up_proj", "down_proj", "gate")))
    # PEFT 0.22.0 keeps gate_proj / up_proj / down_proj on the nn.Linear modules too (every module of those names is
    # one: peft/utils/transformers_weight_conversion.py:492-503): the shared expert (width 128) in each MoE layer,
    # 3·8·(256 + 128) = 9216, and the dense layer's MLP (intermediate 704), 3·8·(256 + 704) = 23040.
    # 3·(182400 + 9216) + 23040 = 597888 (PEFT 0.21.2 left those linears alone: 3·182400 = 547200)
    assert est.trainable_parameters == 3 * (182400 + 9216) + 23040


def test_half_of_a_fused_pair_is_refused():
    spec = families.from_config(DEEPSEEK_V3)
    with pytest.raises(InvalidValueError) as err:
        estimate_model(spec, TrainingSetup(method="lora", lora_targets=("up_proj",)))
    assert err.value.code == "fused_lora_target"
