"""The model's context limit with rope scaling (cabe.context_limit)."""

from __future__ import annotations

from cabe.context_limit import context_limit


def test_llama_3_1_ships_its_scaled_limit():
    """Llama-3.1: rope_scaling llama3, factor 8 over 8,192 original positions; the config's max_position_embeddings
    131,072 is the larger (8 × 8,192 = 65,536: llama3's factor stretches only the low frequencies)."""
    cfg = {
        "max_position_embeddings": 131072,
        "rope_scaling": {"factor": 8.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    }
    lim = context_limit(cfg, 131072)
    assert lim["limit"] == 131072 and not lim["beyond"]
    assert context_limit(cfg, 131073)["beyond"]


def test_yarn_multiplies_the_original_positions():
    """Qwen2.5's model card: rope_scaling yarn, factor 4 over 32,768 = 131,072 beyond max_position_embeddings."""
    cfg = {
        "max_position_embeddings": 32768,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    }
    lim = context_limit(cfg, 100_000)
    assert (lim["limit"], lim["native"], lim["rope_type"], lim["beyond"]) == (131072, 32768, "yarn", False)
    assert context_limit(cfg, 140_000)["beyond"]
    # transformers 5 spells it rope_parameters; no original: the config's max_position_embeddings
    v5 = {"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "linear", "factor": 2.0}}
    assert context_limit(v5, 1)["limit"] == 8192


def test_no_scaling_is_max_position_embeddings():
    assert context_limit({"max_position_embeddings": 2048}, 4096) == {
        "limit": 2048,
        "native": 2048,
        "rope_type": "default",
        "factor": None,
        "original": None,
        "beyond": True,
    }
    assert context_limit({"n_positions": 1024}, 10, 1024)["limit"] == 1024  # GPT-2: the spec's figure
