"""Which LoRA targets PEFT 0.22.0 keeps on MoE models' nn.Linear modules and which it turns into LoRA on the fused
experts (cabe.method.kept_targets / moved_targets): peft/utils/transformers_weight_conversion.py:461-509,
``_convert_peft_config_moe``. A converted name whose every module is an ``nn.Linear`` stays a module target
(:492-503, PEFT #3711 / #3945) and joins the parameter targets too where the fused experts hold the new name; the
router's ``gate`` (a ``TopKRouter``, no nn.Linear) and a name with no module (Mixtral's w1 / w2 / w3) move only.
PEFT 0.21.2 moved every converted name off the linears, and did not convert qwen2_moe at all (0.22.0 adds it, :46).
The trainable counts equal the fake-CUDA trace's under PEFT 0.22.0 (tests/trace/test_moe_lora_wrapped.py,
test_moe_dispatch_and_eager.py); the 0.21.2 figures quoted are that trace's under 0.21.2."""

from __future__ import annotations

import json
from pathlib import Path

from cabe import families
from cabe.analytic import estimate_model
from cabe.method import kept_targets, lora_parameter_targets, lora_targets, moved_targets
from cabe.training import TrainingSetup

FILES = Path(__file__).resolve().parent / "configs/files"
QWEN3_NEXT = json.loads((FILES / "qwen3_next_tiny_config.json").read_text())
# tests/trace/configs.py's tiny Qwen2-MoE: layer 0 dense (intermediate 256), layer 1 MoE with a shared expert
QWEN2_MOE = dict(
    model_type="qwen2_moe",
    hidden_size=128,
    intermediate_size=256,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=256,
    num_experts=4,
    num_experts_per_tok=2,
    decoder_sparse_step=2,
)
MIXTRAL = dict(
    model_type="mixtral",
    hidden_size=128,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=256,
    num_local_experts=4,
    num_experts_per_tok=2,
)


def test_shared_expert_linears_keep_their_lora_beside_the_experts():
    spec = families.from_config(QWEN3_NEXT)
    every = ("all-linear",)
    assert kept_targets(spec, every) == {"gate_proj", "up_proj", "down_proj"}
    assert moved_targets(spec, every) == {"gate", "gate_proj", "up_proj", "down_proj"}
    moe = spec.runs[-1]
    names = {lin.name for lin in lora_targets(spec, every, moe)}
    assert {"gate_proj", "up_proj", "down_proj", "shared_expert_gate"} <= names
    wrapped = {lin.name: m for lin, m in lora_parameter_targets(spec, every, moe)}
    assert wrapped == {"gate": 1, "experts.gate_up_proj": 2, "experts.down_proj": 1}


def test_qwen3_next_down_proj_by_hand():
    """test_moe_dispatch_and_eager.py's case 9 (r16, down_proj and out_proj, 4 layers, h 256, shared expert 96):
    PEFT 0.22.0 adds the shared expert's down_proj, r·(96 + 256)·4 = 16·352·4 = 22,528, to 0.21.2's 176,128."""
    spec = families.from_config(QWEN3_NEXT)
    setup = dict(method="lora", lora_rank=16, lora_targets=("down_proj", "out_proj"))
    assert estimate_model(spec, TrainingSetup(**setup)).trainable_parameters == 176_128 + 22_528


def test_qwen2_moe_is_converted_and_keeps_its_linears():
    """r 8, all-linear, h 128. Each layer's attention (q 128, k / v 64, o 128): 8·(256 + 192 + 192 + 256) = 7168;
    the dense layer's MLP (256): 3·8·(128 + 256) = 9216; the MoE layer's shared expert (96): 3·8·(128 + 96) = 5376,
    its shared_expert_gate 8·(128 + 1) = 1032, the router 8·(128 + 4) = 1056, the 4 experts' gate_up_proj at rank
    2·8·4 = 64: 64·(128 + 128) = 16384, their down_proj at 8·4 = 32: 32·(64 + 128) = 6144.
    PEFT 0.21.2 (no qwen2_moe conversion): 2·7168 + 9216 + 5376 + 1032 = 29,960, the router and experts frozen."""
    spec = families.from_config(QWEN2_MOE)
    setup = TrainingSetup(method="lora", lora_rank=8, lora_targets=("all-linear",))
    assert kept_targets(spec, ("all-linear",)) == {"gate_proj", "up_proj", "down_proj"}
    assert estimate_model(spec, setup).trainable_parameters == 29_960 + 1056 + 16384 + 6144


def test_names_without_linears_move_only():
    """Mixtral's w1 / w3 / w2 and gate match no nn.Linear on transformers 5 (fused experts, a TopKRouter): PEFT
    0.22.0 moves them as 0.21.2 did; the router's ``gate`` is never kept, even where the shared expert is linear."""
    spec = families.from_config(MIXTRAL)
    assert kept_targets(spec, ("all-linear",)) == frozenset()
    assert moved_targets(spec, ("all-linear",)) == {"gate", "w1", "w2", "w3"}
    assert "gate" not in kept_targets(families.from_config(QWEN3_NEXT), ("gate",))
    assert moved_targets(families.from_config(QWEN3_NEXT), ("gate",)) == {"gate"}
