"""The model presets in ``src/cabe/data/models``: metadata, and exact parameter counts.

Every preset is a Hugging Face ``config.json`` plus a ``_cabe`` block. ``_cabe.parameters``
must equal what transformers counts when it builds the config (on the meta device, so no
memory is used), and, once ``cabe.architecture`` exists, what cabe's analytic count gives.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

MODELS_DIR = Path(__file__).resolve().parents[1] / "src" / "cabe" / "data" / "models"
PRESET_FILES = sorted(MODELS_DIR.glob("*.json"))
IDS = [p.stem for p in PRESET_FILES]

REQUIRED_PRESETS = {
    "llama-7b",
    "llama-13b",
    "llama-65b",
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "mistral-7b-v0.1",
    "mistral-7b-v0.3",
    "mixtral-8x7b",
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-7b",
    "qwen2.5-14b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "qwen3-8b",
    "gemma-2-2b",
    "gemma-2-9b",
    "gemma-2-27b",
    "gemma-3-1b",
    "gemma-3-4b",
    "gemma-3-12b",
    "gemma-3-27b",
    "phi-3-mini",
    "phi-4",
    "gpt2",
    "gpt2-medium",
    "gpt2-large",
    "gpt2-xl",
    "pythia-1.4b",
    "pythia-6.9b",
    "falcon-7b",
    "olmo-2-7b",
    # issue 13: the 2025-26 presets of families cabe already reads
    "llama-3.3-70b",
    "mixtral-8x22b",
    "mistral-small-24b",
    "mistral-nemo-12b",
    "phi-4-mini",
    "qwen3-0.6b",
    "qwen3-1.7b",
    "qwen3-4b",
    "qwen3-14b",
    "qwen3-32b",
    "qwen3-235b-a22b",
    "gemma-3-4b-it",
    "gemma-3-12b-it",
    "gemma-3-27b-it",
    "llama-4-scout-17b-16e",
    "llama-4-maverick-17b-128e",
    "granite-4.0-h-small",
    "granite-4.0-h-tiny",
    "granite-4.0-h-1b",
    "granite-4.0-h-350m",
    "deepseek-v3.2-exp",
    "deepseek-v4-flash",
    "smollm3-3b",
    "mistral-small-3.1-24b",
    "mistral-small-3.2-24b",
}

# Published totals (model cards / papers / the Hub's safetensors metadata) for a spot check that
# the configs describe the real models, independent of the ``_cabe`` block.
PUBLISHED = {
    "llama-7b": 6_738_415_616,
    "llama-2-7b": 6_738_415_616,
    "llama-2-70b": 68_976_648_192,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "mistral-7b-v0.1": 7_241_732_096,
    "mistral-7b-v0.3": 7_248_023_552,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-7b": 7_615_616_512,
    "gemma-2-9b": 9_241_705_984,
    "gpt2": 124_439_808,
    "gpt2-xl": 1_557_611_200,
    "llama-3.3-70b": 70_553_706_496,  # the Llama 3.1 70B architecture
    "phi-4-mini": 3_836_021_760,  # the safetensors of microsoft/Phi-4-mini-instruct
    # Gemma 3 with its SigLIP tower: the text decoder + 416,866,032 (tower) + 1,152 x hidden + 1,152 (projector)
    "gemma-3-4b-it": 4_300_079_472,  # 3,880,263,168 + 416,866,032 + 2,950,272
    "gemma-3-12b-it": 12_187_325_040,  # 11,766,034,176 + 416,866,032 + 4,424,832
    "gemma-3-27b-it": 27_432_406_640,  # 27,009,346,304 + 416,866,032 + 6,194,304
}

# Totals the authors publish rounded, with the non-embedding count where the model card gives it
# (billions): (total, non-embedding or None). Non-embedding = total - embeddings - an untied head.
PUBLISHED_ROUNDED = {
    "mixtral-8x22b": (141, None),  # "141B total, 39B active"
    "mistral-small-24b": (24, None),
    "mistral-nemo-12b": (12, None),
    "qwen3-0.6b": (0.6, 0.44),
    "qwen3-1.7b": (1.7, 1.4),
    "qwen3-4b": (4.0, 3.6),
    "qwen3-8b": (8.2, 6.95),
    "qwen3-14b": (14.8, 13.2),
    "qwen3-32b": (32.8, 31.2),
    "qwen3-235b-a22b": (235, 234),
    # the vision tower included (871,932,416): 108,641,793,536 -> "109B total". Maverick's card says "400B" for
    # 401,583,781,376 (tests/families/test_llama4.py checks it term by term)
    "llama-4-scout-17b-16e": (109, None),
    # Granite 4.0 H (IBM's model cards and the Granite 4.0 Nano announcement): "32B total", "7B total",
    # "1.5B", "340M" (the meta-device builds: 32,207,337,984; 6,939,037,248; 1,461,538,368; 340,332,224)
    "granite-4.0-h-small": (32, None),
    "granite-4.0-h-tiny": (7, None),
    "granite-4.0-h-1b": (1.5, None),
    "granite-4.0-h-350m": (0.34, None),
    "smollm3-3b": (3, None),  # "SmolLM3 is a 3B parameter language model": 3,075,098,624
    "mistral-small-3.1-24b": (24, None),  # 24,011,361,280 with the Pixtral tower and projector
    "mistral-small-3.2-24b": (24, None),
    # the Hub's model cards (safetensors): "3.75B", "8.29B", "73.4B" params, the vision tower included
    "qwen2.5-vl-3b-instruct": (3.75, None),
    "qwen2.5-vl-7b-instruct": (8.29, None),
    "qwen2.5-vl-72b-instruct": (73.4, None),
    # the Hub's model cards (safetensors): "2.13B", "4.44B", "8.77B", "33.4B" params, the vision tower included
    "qwen3-vl-2b-instruct": (2.13, None),
    "qwen3-vl-4b-instruct": (4.44, None),
    "qwen3-vl-8b-instruct": (8.77, None),
    "qwen3-vl-32b-instruct": (33.4, None),
    # the Hub's model cards: "31.1B" (safetensors) and "236B", the vision tower included (31,070,754,032 and
    # 235,670,022,896 on the meta device)
    "qwen3-vl-30b-a3b-instruct": (31.1, None),
    "qwen3-vl-235b-a22b-instruct": (236, None),
    # Qwen3.5 as published (vision-language, the tower counted, the MTP layer not built): "35B total, 3B activated"
    # for 35,107,181,936 (the text model alone 34,660,610,688); "2B" 2,213,241,664, "9B" 9,409,813,744, "27B"
    # 27,356,728,560, "397B" 396,802,360,816. The other names are not rounded totals: "0.8B" 852,985,920, "4B"
    # 4,539,265,536, "122B" 122,562,817,776 (their text models: 752,393,024; 4,205,751,296; 122,111,526,912)
    "qwen3.5-35b-a3b": (35, None),
    "qwen3.5-2b": (2, None),
    "qwen3.5-9b": (9, None),
    "qwen3.5-27b": (27, None),
    "qwen3.5-397b-a17b": (397, None),
}

CABE_KEYS = {
    "name": str,
    "display": str,
    "hf_id": str,
    "parameters": int,
    "parameters_source": str,
    "gated": bool,
    "family": str,
    "notes": str,
}

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _hf_fields(cfg: dict) -> dict:
    """The config without cabe's block, deep-copied (transformers mutates nested dicts)."""
    return copy.deepcopy({k: v for k, v in cfg.items() if k != "_cabe"})


def test_required_presets_present():
    missing = REQUIRED_PRESETS - set(IDS)
    assert not missing, f"missing presets: {sorted(missing)}"


def test_no_index_file():
    # The loader lists the directory; an index would drift from it.
    assert not any(p.stem.startswith("_") for p in PRESET_FILES)


@pytest.mark.parametrize("path", PRESET_FILES, ids=IDS)
def test_cabe_block(path: Path):
    cfg = _load(path)
    assert isinstance(cfg, dict)
    meta = cfg.get("_cabe")
    assert isinstance(meta, dict), "missing _cabe block"
    for key, typ in CABE_KEYS.items():
        assert key in meta, f"_cabe.{key} missing"
        assert type(meta[key]) is typ, f"_cabe.{key} should be {typ.__name__}"
    assert set(meta) <= set(CABE_KEYS), f"unexpected _cabe keys: {set(meta) - set(CABE_KEYS)}"
    assert meta["name"] == path.stem
    assert NAME_RE.match(meta["name"]), meta["name"]
    assert meta["display"].strip() and meta["notes"].strip() and meta["parameters_source"].strip()
    assert re.fullmatch(r"[\w.\-]+/[\w.\-]+", meta["hf_id"]), meta["hf_id"]
    assert 10**8 < meta["parameters"] < 10**12
    if meta["name"] in PUBLISHED:
        assert meta["parameters"] == PUBLISHED[meta["name"]]


@pytest.mark.parametrize("path", PRESET_FILES, ids=IDS)
def test_config_shape(path: Path):
    cfg = _load(path)
    assert isinstance(cfg.get("model_type"), str)
    archs = cfg.get("architectures")
    assert isinstance(archs, list) and len(archs) == 1
    # causal LMs, and encoders planned with the head their fine-tuning uses (BERT: sequence classification)
    # (and multimodal Gemma 3, Llama 4 and Mistral Small 3.x and Qwen2.5-VL as published: Gemma3ForConditionalGeneration,
    # Llama4ForConditionalGeneration, Mistral3ForConditionalGeneration)
    causal = ("ForCausalLM", "LMHeadModel", "ForSequenceClassification")
    multimodal = cfg["model_type"] in (
        "gemma3",
        "llama4",
        "mistral3",
        "qwen2_5_vl",
        "qwen3_vl",
        "qwen3_vl_moe",
        "qwen3_5",
        "qwen3_5_moe",
    )
    assert archs[0].endswith(causal + (("ForConditionalGeneration",) if multimodal else ())), archs
    # Every integer size that exists is positive.
    for key in (
        "hidden_size",
        "n_embd",
        "intermediate_size",
        "num_hidden_layers",
        "n_layer",
        "num_attention_heads",
        "n_head",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
    ):
        if cfg.get(key) is not None:
            assert type(cfg[key]) is int and cfg[key] > 0, key
    if cfg["model_type"] == "gemma3_text":
        assert "vision_config" not in cfg and "text_config" not in cfg


def _transformers_count(cfg: dict) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    fields = _hf_fields(cfg)
    model_type = fields.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **fields)
    auto = transformers.AutoModelForCausalLM
    arch = fields.get("architectures", [""])[0]
    if arch.endswith("ForSequenceClassification"):
        auto = transformers.AutoModelForSequenceClassification
    with torch.device("meta"):
        if arch.endswith("ForConditionalGeneration"):
            # the published class with its vision tower (AutoModelForCausalLM builds Llama4ForCausalLM from the
            # text config alone; for gemma3 it is Gemma3ForConditionalGeneration, the same class)
            model = getattr(transformers, arch)._from_config(config)
        else:
            model = auto.from_config(config)
    # parameters() yields tied (shared) tensors once.
    return sum(p.numel() for p in model.parameters())


@pytest.mark.trace
@pytest.mark.parametrize("path", PRESET_FILES, ids=IDS)
def test_parameters_match_transformers(path: Path):
    cfg = _load(path)
    assert _transformers_count(cfg) == cfg["_cabe"]["parameters"]


@pytest.mark.parametrize("path", PRESET_FILES, ids=IDS)
def test_parameters_match_analytic(path: Path):
    from cabe import families

    cfg = _load(path)
    spec = families.from_config(_hf_fields(cfg))
    assert spec.parameter_count == cfg["_cabe"]["parameters"]


@pytest.mark.parametrize("name", sorted(PUBLISHED_ROUNDED))
def test_published_rounded(name: str):
    cfg = _load(MODELS_DIR / f"{name}.json")
    total, non_embedding = PUBLISHED_ROUNDED[name]
    n = cfg["_cabe"]["parameters"]
    # rounded to the digits the authors print: mixtral-8x22b 140,620,634,112 -> "141B"
    assert round(n / 1e9, _digits(total)) == total, (n, total)
    if non_embedding is not None:
        # qwen3-0.6b: 596,049,920 - 151,936 x 1,024 (tied) = 440,467,456 -> 0.44B
        embeddings = cfg["vocab_size"] * cfg["hidden_size"] * (1 if cfg["tie_word_embeddings"] else 2)
        assert round((n - embeddings) / 1e9, _digits(non_embedding)) == non_embedding


def _digits(x: float) -> int:
    text = str(x)
    return len(text.split(".")[1]) if "." in text else 0
