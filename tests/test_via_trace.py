"""cabe.via_trace: an architecture no family module reads (olmo3, glm4 in transformers 5.24), answered from
the trace — the report's figures are the traced step's, its model facts the built model's, and it says so."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import cabe
from cabe import via_trace
from cabe.errors import CabeError, InvalidValueError, MissingDependencyError

pytestmark = pytest.mark.trace

#: olmo3 has no family module (cabe.families); transformers 5.24 builds Olmo3ForCausalLM from it.
# a tiny olmo3 config.json, shared by the unknown-architecture tests of the CLI, the API and cabe.via_trace
OLMO3 = json.loads((Path(__file__).resolve().parents[0] / "configs/files/olmo3_tiny_config.json").read_text())
#: One Olmo3 decoder layer: q, k, v, o 4 × 128·128 = 65,536; gate, up, down 3 × 128·256 = 98,304; q_norm and
#: k_norm over heads × head_dim = 128 each, post-attention and post-feed-forward RMSNorms 128 each = 512
#: (transformers/models/olmo3/modeling_olmo3.py: Olmo3Attention, Olmo3MLP, Olmo3DecoderLayer).
OLMO3_LAYER = 4 * 128 * 128 + 3 * 128 * 256 + 4 * 128
#: embeddings 512·128 + untied lm_head 512·128 + the final norm 128 + two layers
OLMO3_PARAMETERS = 2 * 512 * 128 + 128 + 2 * OLMO3_LAYER
SMALL = {"batch": 1, "seq": 64}


def _trace_extra() -> None:
    for name in ("torch", "transformers", "peft"):
        pytest.importorskip(name)


def test_the_parameter_arithmetic():
    assert OLMO3_LAYER == 164_352 and OLMO3_PARAMETERS == 459_904


def test_full_fine_tuning_is_the_traced_step():
    _trace_extra()
    from cabe.trace import trace_step
    from cabe.training import TrainingSetup

    rep = cabe.estimate(dict(OLMO3), **SMALL)
    assert rep.notes[0] == via_trace.NOTE and rep.extra["answered_by"] == "trace"
    assert rep.parameters == rep.trainable_parameters == OLMO3_PARAMETERS
    # the model's facts come from the model transformers built, not from a family module
    m = rep.model or {}
    assert (m["model_type"], m["architecture"], m["num_layers"], m["head_dim"]) == ("olmo3", "Olmo3ForCausalLM", 2, 32)
    # the figures are the trace's: the same step traced directly peaks at the same byte (the split into
    # components can move by a few allocations between runs, benchmarks/house/snapshot.py says; the peak not)
    direct = trace_step(dict(OLMO3), TrainingSetup(**SMALL))
    assert rep.total_bytes == direct.peak_bytes == sum(rep.components.values())
    assert rep.reserved_bytes >= rep.total_bytes  # the allocator slack: the trace's replay, reserved - peak
    assert [s.key for s in rep.steps] == ["via_trace"] and "Traced:" in rep.explain()


def test_lora_on_named_modules_trains_the_adapters_only():
    _trace_extra()
    rep = cabe.estimate(dict(OLMO3), method="lora", lora_targets="q_proj,v_proj", lora_rank=8, **SMALL)
    # A (8 × 128) and B (128 × 8) on q_proj and v_proj of each of 2 layers: 2 · 2 · 2 · 8 · 128
    assert rep.trainable_parameters == 2 * 2 * 2 * 8 * 128 == 8_192
    assert rep.parameters == OLMO3_PARAMETERS


def test_lora_all_linear_and_freeze():
    _trace_extra()
    rep = cabe.estimate(dict(OLMO3), method="lora", lora_targets="all-linear", lora_rank=8, **SMALL)
    # q, k, v, o (128 → 128): 8·(128+128) each; gate, up (128 → 256) and down (256 → 128): 8·(128+256) each
    assert rep.trainable_parameters == 2 * (4 * 8 * 256 + 3 * 8 * 384) == 34_816
    frozen = cabe.estimate(dict(OLMO3), method="freeze", trainable_layers=1, **SMALL)
    assert frozen.trainable_parameters == OLMO3_LAYER  # the top decoder layer, found in the built model
    with pytest.raises(InvalidValueError) as e:
        cabe.estimate(dict(OLMO3), method="freeze", trainable_layers=3, **SMALL)
    assert (e.value.code, e.value.params["maximum"]) == ("out_of_range", 2)


def test_another_architecture_glm4():
    _trace_extra()
    # glm4 defaults pad_token_id to 151329, past this tiny vocabulary
    cfg = {**OLMO3, "model_type": "glm4", "head_dim": 32, "partial_rotary_factor": 0.5, "pad_token_id": 0}
    rep = cabe.estimate(cfg, **SMALL)
    assert rep.notes[0] == via_trace.NOTE and (rep.model or {})["architecture"] == "Glm4ForCausalLM"
    assert rep.total_bytes == sum(rep.components.values()) > 0


def test_several_gpus_are_refused_by_name():
    with pytest.raises(InvalidValueError) as e:
        cabe.estimate(dict(OLMO3), gpus=2, shard="fsdp", **SMALL)
    assert e.value.code == "unknown_architecture_one_gpu" and e.value.field == "gpus"


def test_packing_is_traced():
    # packed rows carry position_ids restarting per document; transformers' mask functions find the documents
    # (masking_utils.py:862-870) for any architecture whose forward takes position_ids: the traced figure is the
    # packed step's (SDPA gets a block-diagonal mask: the memory-efficient kernel, more than the causal row's)
    _trace_extra()
    from cabe.trace import trace_step
    from cabe.training import TrainingSetup

    rows = {"batch": 4, "seq": 512}
    for packing in ("packed", "padding-free"):
        rep = cabe.estimate(dict(OLMO3), packing=packing, **rows)
        assert rep.total_bytes == trace_step(dict(OLMO3), TrainingSetup(packing=packing, **rows)).peak_bytes
        assert rep.total_bytes > cabe.estimate(dict(OLMO3), **rows).total_bytes


def test_packing_is_refused_where_the_model_takes_no_position_ids():
    # BLOOM (ALiBi) takes no position_ids: its forward would drop them into **kwargs and attend across the
    # documents, so a packed trace would be an unpacked row under another name
    _trace_extra()
    bloom = {"model_type": "bloom", "vocab_size": 512, "hidden_size": 128, "n_layer": 2, "n_head": 4}
    with pytest.raises(CabeError) as e:
        cabe.estimate(bloom, packing="packed", batch=2, seq=64)
    assert (e.value.code, e.value.field) == ("packing_needs_position_ids", "packing")
    assert "takes none" in e.value.to_dict("en")["message"]
    assert cabe.estimate(bloom, batch=2, seq=64).total_bytes > 0  # unpacked rows are traced as before


def _no_torch(monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "torch" else real(name, *args, **kwargs)

    monkeypatch.setattr(via_trace.importlib.util, "find_spec", find_spec)


def test_without_the_trace_extra_the_refusal_says_how(monkeypatch):
    _no_torch(monkeypatch)
    with pytest.raises(MissingDependencyError) as e:
        cabe.estimate(dict(OLMO3))
    err: CabeError = e.value
    assert (err.code, err.field, err.params["package"]) == ("unknown_architecture_needs_trace", "model", "torch")
    en, es = err.to_dict("en")["message"], err.to_dict("es")["message"]
    assert "does not know the architecture 'olmo3'" in en and "pip install 'cabe[trace]'" in en
    assert "no conoce la arquitectura 'olmo3'" in es


def test_a_known_architecture_never_traces(monkeypatch):
    _no_torch(monkeypatch)  # the analytic path answers llama without the extra
    cfg = {**OLMO3, "model_type": "llama"}
    rep = cabe.estimate(cfg, **SMALL)
    assert via_trace.NOTE not in rep.notes and "answered_by" not in rep.extra


def test_a_config_too_deep_to_trace_is_refused_before_tracing():
    # 10^9 layers would hold the trace (and the server's worker) for hours: refused from the config alone
    with pytest.raises(CabeError) as e:
        cabe.estimate({**OLMO3, "num_hidden_layers": 10**9})
    assert (e.value.code, e.value.params["limit"]) == ("unknown_architecture_too_deep", via_trace.MAX_LAYERS)
    with pytest.raises(CabeError) as e:  # nested, as a multimodal config holds its language model
        cabe.estimate({"model_type": "olmo3", "text_config": {"num_hidden_layers": 5000}})
    assert e.value.code == "unknown_architecture_too_deep"
