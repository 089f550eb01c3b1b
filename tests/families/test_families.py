"""cabe.families: one module per family, what each declares, and estimators that never ask a name.

Parameter counts of every preset against transformers are in tests/test_presets.py; the saved
tensors of each family against autograd in tests/core_torch. Here: the registry's contract.
"""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest

from cabe import families
from cabe.architecture import SLOTS, LayerGroup, ModelSpec
from cabe.errors import ConfigError

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
    assert spec.num_layers == sum(g.count for g in spec.layer_groups)
    for lin in spec.layer_linears:
        assert lin.slot in SLOTS, (lin.name, lin.slot)
    assert spec.slot_names("qkv"), "a layer has an attention input projection"
    assert len(spec.slot_names("o")) == 1
    if spec.mlp == "moe":
        assert spec.slot_names("router") and spec.slot_names("experts") and spec.num_experts > 0
    else:
        assert spec.slot_names("up") and len(spec.slot_names("down")) == 1
    targets = set(spec.peft_default_targets)
    assert targets == {"all-linear"} or targets <= set(spec.linear_names), spec.peft_default_targets
    for g in spec.layer_groups:
        assert (g.attention == "sliding") == (g.window is not None)


def test_layers_of_different_shapes_are_a_typed_refusal_not_a_guess():
    spec = _preset_spec(SRC / "data" / "models" / "llama-3.2-1b.json")
    g = spec.layer_groups[0]
    dense = LayerGroup(2, g.linears[:4] + g.linears[4:], g.mlp)
    narrow = LayerGroup(g.count - 2, g.linears[:4], g.mlp)  # no MLP: a different layer
    mixed = replace(spec, layer_groups=(dense, narrow))
    assert mixed.num_layers == spec.num_layers
    # the parameter count is exact over groups ...
    mlp = sum(lin.parameter_count for lin in g.linears[4:])
    assert mixed.parameter_count == spec.parameter_count - (g.count - 2) * mlp
    # ... and the one-layer-times-L estimators refuse it with a code
    with pytest.raises(ConfigError) as e:
        _ = mixed.layer_linears
    assert e.value.code == "unsupported_feature"


def test_unknown_model_type_lists_what_is_supported():
    with pytest.raises(ConfigError) as e:
        families.from_config({"model_type": "nope"})
    assert e.value.code == "unsupported_architecture"
    assert "llama" in str(e.value.params.get("allowed", ""))


# The estimators dispatch on kinds (spec.norm, spec.mlp, slots, traits), never on family names.
ESTIMATORS = [
    "activations.py",
    "analytic.py",
    "kv_cache.py",
    "flops.py",
    "method.py",
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
