"""One vision-tower block as a :class:`cabe.architecture.ModelSpec` the decoder-layer estimator
(:func:`cabe.activations.layer_activations`) reads, and a Conv3d patch's values: what every tower kind shares.
Proved by tests/families/test_qwen2_5_vl.py, test_gemma3_images.py and test_qwen3_vl.py."""

from __future__ import annotations

from typing import Any

from cabe.architecture import ModelSpec
from cabe.layers import LayerGroup
from cabe.vision.tower import VisionTower


def tower_block_spec(
    tower: VisionTower, model_type: str, family: str, mlp: str, activation: str, rotary: bool, **kinds: Any
) -> ModelSpec:
    """One block of a vision tower as a :class:`ModelSpec` the decoder-layer estimator reads: full multi-head
    attention over the patches, the tower's linears and MLP kind, ``kinds`` for the rest (norm, positions, views)."""
    h, nh, f = tower.hidden_size, tower.num_heads, tower.intermediate_size
    return ModelSpec(
        model_type=model_type,
        family=family,
        hidden_size=h,
        num_heads=nh,
        num_kv_heads=nh,
        head_dim=h // nh,
        intermediate_size=f,
        vocab_size=1,
        tie_word_embeddings=True,
        activation=activation,
        rotary_dim=h // nh if rotary else 0,
        max_positions=1 << 24,
        layer_groups=(LayerGroup(1, tower.block_linears, mlp, intermediate_size=f),),
        peft_default_targets=("all-linear",),
        **kinds,
    )


def patch_values(tower: VisionTower) -> int:
    """Values of one patch: channels × frames × patch_size²."""
    return tower.in_channels * tower.temporal_patch_size * tower.patch_size**2
