"""SmolLM3 (``smollm3``): Llama's layer with a NoPE layer every ``no_rope_layer_interval`` layers. The count by hand,
the layers as runs by rope; the preset's count against transformers' meta build in tests/test_presets.py."""

from __future__ import annotations

import pytest

from cabe import families
from cabe.errors import ConfigError
from cabe.models import preset


def test_smollm3_3b_parameters_by_hand():
    spec = preset("smollm3-3b").spec
    h, f, v, d = 2048, 11008, 128256, 128
    attn = h * 16 * d + 2 * h * 4 * d + 16 * d * h  # q, k and v (4 kv heads), o
    layer = attn + 3 * h * f + 2 * h  # SwiGLU and the two norms
    assert attn == 4_194_304 + 2_097_152 + 4_194_304 == 10_485_760
    total = v * h + 36 * layer + h  # tied embeddings, final norm
    assert total == spec.parameter_count == 3_075_098_624
    # layers 3, 7, ... 35 are NoPE (no_rope_layers 1, 1, 1, 0 repeated): 18 runs of 3 rotary layers and 1 NoPE
    assert [(r.count, r.rope) for r in spec.runs[:2]] == [(3, True), (1, False)] and len(spec.runs) == 18
    assert sum(r.count for r in spec.runs if not r.rope) == 9


def test_no_rope_layers_default_and_checks():
    base = {"model_type": "smollm3", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 6}
    spec = families.from_config({**base, "vocab_size": 100, "no_rope_layer_interval": 2})
    assert [g.rope for g in spec.layer_groups] == [True, False] * 3
    with pytest.raises(ConfigError):
        families.from_config({**base, "vocab_size": 100, "no_rope_layers": [1, 2, 1, 1, 1, 1]})
