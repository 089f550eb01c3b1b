"""`cabe estimate` and `cabe trace` on an architecture no family module reads (olmo3): answered from the
trace, saying so; without the [trace] extra, one sentence and exit 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cabe import via_trace
from cabe.cli import main

pytestmark = pytest.mark.trace

# a tiny olmo3 config.json, shared by the unknown-architecture tests of the CLI, the API and cabe.via_trace
OLMO3 = json.loads((Path(__file__).resolve().parents[1] / "configs/files/olmo3_tiny_config.json").read_text())
#: tests/test_via_trace.py: 2 · 512·128 (embeddings, untied head) + 128 (final norm) + 2 · 164,352 (layers)
OLMO3_PARAMETERS = 459_904
SMALL = ["--batch", "1", "--seq", "64"]


@pytest.fixture
def olmo3(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(OLMO3))
    return str(p)


def _trace_extra():
    for name in ("torch", "transformers", "peft"):
        pytest.importorskip(name)


def test_estimate_full_answers_from_the_trace(olmo3, capsys):
    _trace_extra()
    assert main(["estimate", "--model", olmo3, *SMALL, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["notes"][0] == via_trace.NOTE and out["answered_by"] == "trace"
    assert out["parameters"] == out["trainable_parameters"] == OLMO3_PARAMETERS
    assert out["total_bytes"] == sum(out["components"].values()) and out["fits_on"]
    assert out["model"]["num_layers"] == 2 and out["model"]["source"] == "file"


def test_estimate_text_says_so_in_spanish(olmo3, capsys):
    _trace_extra()
    assert main(["estimate", "--model", olmo3, *SMALL, "--method", "lora", "--lang", "es"]) == 0
    text = capsys.readouterr().out
    assert "no conoce la arquitectura 'olmo3'" in text
    # PEFT has no default targets for olmo3: the trace adapts every linear layer, and the report says so
    assert "all-linear" in text


def test_trace_lora_needs_no_family_module(olmo3, capsys):
    _trace_extra()
    args = ["trace", "--model", olmo3, *SMALL, "--method", "lora", "--lora-targets", "q_proj,v_proj", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["analytic"] == "unknown_architecture" and "estimate_bytes" not in out
    assert any("does not know the architecture 'olmo3'" in n for n in out["notes"])
    assert out["trainable_parameters"] == 2 * 2 * 2 * 8 * 128  # r 8 on q_proj, v_proj of 2 layers: A and B
    assert out["model"]["architecture"] == "Olmo3ForCausalLM"


def test_trace_full_and_freeze_text(olmo3, capsys):
    _trace_extra()
    assert main(["trace", "--model", olmo3, *SMALL, "--method", "freeze", "--trainable-layers", "1"]) == 0
    text = capsys.readouterr().out
    assert "does not know the architecture 'olmo3'" in text
    assert "164352" in text  # trainable_parameters: the top layer found in the built model


def test_estimate_without_the_trace_extra_is_one_sentence(olmo3, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        via_trace.importlib.util, "find_spec", lambda name, *a, **k: None if name == "torch" else real(name, *a, **k)
    )
    assert main(["estimate", "--model", olmo3, "--lang", "en"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cabe: model: cabe's analytic path does not know the architecture 'olmo3'")
    assert "pip install 'cabe[trace]'" in err and "Traceback" not in err and err.count("\n") == 0


@pytest.mark.parametrize("command", [["fit", "--gpu", "rtx-4090"], ["infer"], ["lora"]])
def test_analytic_only_commands_refuse_in_one_sentence_naming_the_trace_path(olmo3, capsys, command):
    """fit (hundreds of estimates), infer and lora need the analytic model: a typed refusal (exit 2) that names
    the commands which do answer this architecture, from the trace."""
    assert main([command[0], "--model", olmo3, *command[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert "olmo3" in err and "`cabe estimate`" in err and "Traceback" not in err
    assert err.count(". ") == 0 and err.endswith(").")  # one sentence
