"""cabe.families: one module per family, what each declares, and estimators that never ask a name.

Parameter counts of every preset against transformers are in tests/test_presets.py; the saved
tensors of each family against autograd in tests/core_torch. Here: the registry's contract.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from cabe import families
from cabe.architecture import ModelSpec
from cabe.errors import ConfigError
from cabe.layers import SLOTS

SRC = Path(__file__).resolve().parents[2] / "src" / "cabe"
PRESETS = sorted((SRC / "data" / "models").glob("*.json"))


def _preset_spec(path: Path) -> ModelSpec:
    cfg = json.loads(path.read_text())
    cfg.pop("_cabe", None)
    return families.from_config(cfg, name=path.stem)


def test_every_family_module_declares_model_types_and_a_reader():
    mods = families.modules()
    assert len(mods) >= 8
    for mod in mods:
        assert mod.MODEL_TYPES and all(isinstance(t, str) for t in mod.MODEL_TYPES), mod.__name__
        assert callable(mod.read), mod.__name__
        assert mod.__doc__, f"{mod.__name__}: say in the docstring what its layers are made of"


def test_every_family_module_has_a_preset():
    seen = {json.loads(p.read_text())["model_type"] for p in PRESETS}
    lacking = [m.__name__ for m in families.modules() if not seen & set(m.MODEL_TYPES)]
    assert not lacking, f"family modules without a preset: {lacking}"


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_preset_spec_is_consistent(path):
    spec = _preset_spec(path)
    assert spec.layer_groups and all(g.count > 0 for g in spec.layer_groups)
    assert spec.num_layers == sum(g.count for g in spec.layer_groups) == sum(r.count for r in spec.runs)
    for g in spec.runs:
        for lin in g.linears:
            assert lin.slot in SLOTS, (lin.name, lin.slot)
        assert g.slot_names("qkv"), "a layer has an attention input projection"
        assert len(g.slot_names("o")) == 1
        if g.mlp == "moe":
            assert g.slot_names("router") and g.slot_names("experts") and spec.num_experts > 0
        else:
            assert g.slot_names("up") and len(g.slot_names("down")) == 1
    targets = set(spec.peft_default_targets)
    assert targets == {"all-linear"} or targets <= set(spec.linear_names), spec.peft_default_targets
    for g in spec.layer_groups:
        assert (g.attention in ("sliding", "chunked")) == (g.window is not None)


# Qwen3-MoE layers 0 and 2 dense (decoder_sparse_step=2), or layer 0 alone (mlp_only_layers)
MIXED = dict(
    model_type="qwen3_moe",
    hidden_size=64,
    intermediate_size=192,
    moe_intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    num_experts=8,
    num_experts_per_tok=2,
)


@pytest.mark.parametrize(
    ("extra", "kinds"),
    [
        (dict(decoder_sparse_step=2), [(1, "gated"), (1, "moe"), (1, "gated"), (1, "moe")]),
        (dict(mlp_only_layers=[0]), [(1, "gated"), (3, "moe")]),
        (dict(mlp_only_layers=[1, 2]), [(1, "moe"), (2, "gated"), (1, "moe")]),
        ({}, [(4, "moe")]),
    ],
)
def test_layers_that_differ_are_runs_bottom_first_and_every_count_sums_over_them(extra, kinds):
    spec = families.from_config(dict(MIXED, **extra))
    assert [(r.count, r.mlp) for r in spec.runs] == kinds
    dense = 64 * 192 * 3  # gate, up (h -> f) and down (f -> h)
    moe = 64 * 8 + 8 * 64 * 2 * 48 + 8 * 48 * 64  # router (E × h), experts' gate_up (E·2f'·h) and down (E·h·f')
    attn = 64 * 64 + 2 * 64 * 32 + 64 * 64  # q, k, v (2 kv heads × 16), o
    norms = 2 * 64 + 2 * 16  # two RMSNorms over h, q_norm and k_norm over head_dim
    layers = sum(n * (attn + norms + (moe if k == "moe" else dense)) for n, k in kinds)
    assert spec.parameter_count == 512 * 64 + layers + 64 + 64 * 512  # + embedding, final norm, untied lm_head
    assert spec.uniform() == (len(kinds) == 1)


def test_freeze_trains_the_top_layers_of_the_runs():
    spec = families.from_config(dict(MIXED, mlp_only_layers=[0]))  # dense, then 3 MoE layers
    split = [(run.mlp, n, trained) for run, n, trained in spec.top_split(3)]
    assert split == [("gated", 1, False), ("moe", 3, True)]
    split = [(run.mlp, n, trained) for run, n, trained in spec.top_split(2)]
    assert split == [("gated", 1, False), ("moe", 1, False), ("moe", 2, True)]


def test_an_estimate_sums_its_layer_runs():
    """A mixed model's activations are its dense layers' plus its MoE layers': 2 dense + 2 MoE layers save
    what half of the 4 dense and half of the 4 MoE layers save."""
    from cabe.analytic import estimate_model
    from cabe.training import TrainingSetup

    setup = TrainingSetup(batch=2, seq=128, precision="bf16")

    def layer_acts(cfg):
        r = estimate_model(families.from_config(cfg), setup)
        return r.components["activations"]

    mixed = layer_acts(dict(MIXED, decoder_sparse_step=2))
    dense = layer_acts(dict(MIXED, mlp_only_layers=[0, 1, 2, 3]))
    moe = layer_acts(dict(MIXED))
    assert 2 * mixed == dense + moe


def test_unknown_model_type_lists_what_is_supported():
    with pytest.raises(ConfigError) as e:
        families.from_config({"model_type": "nope"})
    assert e.value.code == "unsupported_architecture"
    assert "llama" in str(e.value.params.get("allowed", ""))


# The estimators dispatch on kinds (spec.norm, spec.mlp, slots, traits), never on family names.
ESTIMATORS = [
    *sorted(f"activations/{p.name}" for p in (SRC / "activations").glob("*.py")),
    "facts.py",
    *sorted(f"analytic/{p.name}" for p in (SRC / "analytic").glob("*.py")),
    "kv_cache.py",
    "flops.py",
    "method.py",
    "parameters.py",
    "inference.py",
    *sorted(p.name and f"parallel/{p.name}" for p in (SRC / "parallel").glob("*.py")),
]


@pytest.mark.parametrize("name", ESTIMATORS)
def test_estimators_never_compare_family_or_model_type(name):
    tree = ast.parse((SRC / name).read_text())
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if isinstance(side, ast.Attribute) and side.attr in ("family", "model_type"):
                    bad.append(node.lineno)
                if isinstance(side, ast.Name) and side.id in ("fam", "family", "model_type"):
                    bad.append(node.lineno)
    assert not bad, f"{name} compares a family or model type on lines {bad}"


def test_qlora_on_fused_moe_experts_says_they_stay_unquantized():
    # transformers 5 fuses the experts into 3-D parameters; bitsandbytes replaces nn.Linear only
    from cabe.analytic import estimate_model
    from cabe.models import preset
    from cabe.training import TrainingSetup

    moe = estimate_model(preset("mixtral-8x7b").spec, TrainingSetup(method="qlora"))
    dense = estimate_model(preset("llama-3.1-8b").spec, TrainingSetup(method="qlora"))
    assert "qlora_moe_experts_unquantized" in moe.notes
    assert "qlora_moe_experts_unquantized" not in dense.notes


def test_qwen2_moe_slides_in_the_layers_its_config_lists_and_sums_a_shared_expert():
    # Qwen2MoeConfig.__post_init__: layer i slides when (i + 1) % 2 and i < max_window_layers
    cfg = dict(
        MIXED,
        model_type="qwen2_moe",
        shared_expert_intermediate_size=80,
        use_sliding_window=True,
        sliding_window=32,
        max_window_layers=3,
        mlp_only_layers=[3],
    )
    spec = families.from_config(cfg)
    assert [(g.count, g.mlp, g.window) for g in spec.layer_groups] == [
        (1, "moe", 32),
        (1, "moe", None),
        (1, "moe", 32),
        (1, "gated", None),
    ]
    assert [(r.count, r.mlp) for r in spec.runs] == [(3, "moe"), (1, "gated")]
    from cabe.kv_cache import kv_cache_bytes

    # 2 layers keep the 32-token window, 2 every token: 2 × 2 kv heads × 16 × 2 B per token and layer
    assert kv_cache_bytes(spec, 100, 1, "fp16") == 2 * 2 * 16 * 2 * (2 * 32 + 2 * 100)
    shared = 64 * 80 * 3 + 64  # the shared expert's gate, up and down, and its sigmoid gate (h -> 1)
    qwen3 = families.from_config(dict(MIXED, mlp_only_layers=[3]))
    qkv_bias = 64 + 32 + 32  # Qwen2-MoE's q, k, v biases; Qwen 3 MoE's q_norm and k_norm instead
    assert spec.parameter_count - qwen3.parameter_count == 3 * shared + 4 * (qkv_bias - 2 * 16)
