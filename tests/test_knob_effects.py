"""Each memory knob against the same request without it (cabe.knob_effects, issue 32 item 4): saves, costs or
nothing, in bytes, and why, in both languages; the same on ``--explain``'s text and ``--json``."""

from __future__ import annotations

import json

import pytest

import cabe
from cabe import knob_effects
from cabe.cli import main
from cabe.report.knobs import knob_line, lines

#: the issue's solver example: llama-3.1-70b, one trained layer (freeze's default), bf16 weights, no autocast. Traced
#: (``cabe trace ... --json``, fake mode, 2026-12-07): 157,066,976,256 B without checkpointing, 164,815,927,296 B with
FREEZE_70B = dict(method="freeze", precision="bf16", optimizer="paged-adamw-8bit", batch=8, seq=1024)
#: Llama 4 Scout loaded in fp32, LoRA under bf16 autocast (its dense dispatch runs every expert through torch.bmm).
#: Traced (fake mode, 2026-12-07): 709,442,607,104 B under autocast, 546,943,719,424 B without (estimates within 0.7%)
SCOUT_FP32 = dict(method="lora", dtype="fp32", autocast="bf16", batch=1, seq=1024)


def _knob(report, name):
    return next(k for k in report.extra["knobs"] if k["field"] == name)


@pytest.fixture(scope="module")
def freeze_ckpt():
    return cabe.estimate("llama-3.1-70b", checkpointing=True, explain=True, **FREEZE_70B)


def test_checkpointing_costs_on_a_freeze_run(freeze_ckpt):
    k = _knob(freeze_ckpt, "checkpointing")
    assert k["effect"] == "costs"
    assert (k["value"], k["without"]) == (True, False)
    assert k["with_bytes"] == freeze_ckpt.total_bytes
    assert k["without_bytes"] == cabe.estimate("llama-3.1-70b", **FREEZE_70B).total_bytes
    # the 79 frozen layers keep their inputs (79 × 8 × 1,024 tokens × 2 B × h 8,192 = 10,603,200,512 B), while the one
    # trained layer keeps its input instead of its 397,576 B/token ((397,576 − 16,384) × 8,192 = 3,122,724,864 B):
    # +7,480,475,648 B, less the allocator's 512 B rounding of the tensors the top layer saves
    assert abs(k["delta_bytes"] - (10_603_200_512 - 3_122_724_864)) < 4096
    assert list(k["components"]) == ["activations"]
    (reason,) = k["reasons"]
    assert reason["key"] == "activations.frozen_inputs"
    assert reason["params"]["layers"] == 79 and reason["with_bytes"] == 79 * 8 * 1024 * 2 * 8192
    assert reason["without_bytes"] == 0


@pytest.mark.parametrize(
    ("lang", "words"),
    [("en", ("costs 7.48 GB", "157.3 GB", "164.8 GB", "frozen")), ("es", ("cuesta 7,48 GB", "157,3 GB", "164,8 GB"))],
)
def test_checkpointing_cost_in_words(freeze_ckpt, lang, words):
    text = "\n".join(lines(freeze_ckpt.extra["knobs"], lang))
    line = next(x for x in text.splitlines() if x.startswith("· checkpointing"))
    for w in words[:3]:
        assert w in line
    assert "enable_input_require_grads" in text
    assert text == "\n".join(lines(freeze_ckpt.extra["knobs"], lang))  # deterministic


def test_freeze_against_full_moves_inputs_and_adds_none(freeze_ckpt):
    """Full fine-tuning checkpoints all 80 layers' inputs (activations.checkpointed); freeze keeps the same 80, one
    trained and 79 frozen (activations.frozen_inputs): the frozen layers' inputs are no reason for the method."""
    k = _knob(freeze_ckpt, "method")
    assert k["without"] == "full" and k["effect"] == "saves" and k["reasons"] == []


def test_explain_step_names_the_frozen_inputs(freeze_ckpt):
    """The worked steps agree with the activations: the frozen layers' inputs are a step of their own."""
    (step,) = [s for s in freeze_ckpt.steps if s.key == "activations.frozen_inputs"]
    assert step.bytes == 79 * 134_217_728 and step.params["checkpointed"] == 79


def test_autocast_on_an_fp32_moe_keeps_every_expert():
    r = cabe.estimate("llama-4-scout-17b-16e", explain=True, **SCOUT_FP32)
    k = _knob(r, "autocast")
    assert k["effect"] == "costs" and k["without"] == "none"
    assert (
        k["without_bytes"] == cabe.estimate("llama-4-scout-17b-16e", **{**SCOUT_FP32, "autocast": "none"}).total_bytes
    )
    assert next(iter(k["components"])) == "weight_copies"  # the largest change
    (reason,) = k["reasons"]
    # every expert's 16-bit copy: 48 layers × 16 experts × (2 × 8,192 × 5,120 + 5,120 × 8,192) × 2 B
    assert reason["params"]["experts"] == 48 * 16 * 3 * 8192 * 5120 * 2 == 193_273_528_320
    en, es = ("\n".join(lines([k], lang)) for lang in ("en", "es"))
    assert "costs" in en and "expert" in en and "193.3 GB" in en
    assert "cuesta" in es and "experto" in es and "193,3 GB" in es


def test_grouped_experts_get_no_copy_named():
    """Mixtral's grouped_mm runs the experts in their own dtype, outside autocast: no expert copy is claimed."""
    r = cabe.estimate("mixtral-8x7b", explain=True, **SCOUT_FP32)
    k = _knob(r, "autocast")
    assert all("experts" not in x["params"] for x in k["reasons"])


def test_plain_lora_checkpointing_saves():
    r = cabe.estimate("llama-3.1-8b", method="lora", checkpointing=True, batch=4, seq=2048, explain=True)
    k = _knob(r, "checkpointing")
    assert k["effect"] == "saves" and k["delta_bytes"] < 0 and k["reasons"] == []
    assert knob_line(k, "en").startswith("checkpointing = on: saves ")
    assert knob_line(k, "es").startswith("checkpointing = sí: ahorra ")
    assert _knob(r, "method")["effect"] == "saves" and _knob(r, "method")["without"] == "full"


def test_nothing_when_the_knob_changes_nothing():
    """bf16 weights under bf16 autocast, every layer checkpointed: autocast casts no weight, and the one layer
    recomputed at a time keeps the same tensors either way."""
    r = cabe.estimate("llama-3.1-8b", method="lora", checkpointing=True, batch=4, seq=2048, explain=True)
    k = _knob(r, "autocast")
    assert k["effect"] == "nothing" and abs(k["delta_bytes"]) < knob_effects.NEGLIGIBLE * r.total_bytes


def test_only_the_knobs_set():
    r = cabe.estimate("llama-3.1-8b", method="full", dtype="fp32", autocast="none", explain=True)
    assert r.extra["knobs"] == []
    r = cabe.estimate("llama-3.1-8b", method="qlora", optimizer="adamw-8bit", grad_accum=4, explain=True)
    fields = [k["field"] for k in r.extra["knobs"]]
    assert fields[0] == "method" and r.extra["knobs"][0]["without"] == "lora"
    assert "optimizer" in fields and "grad_accum" in fields and "checkpointing" not in fields


def test_a_cost_is_instead_of_a_saving_only_for_savers(freeze_ckpt):
    """Checkpointing is set to save memory: its cost is "instead of saving it". A LoRA rank above PEFT's 8 and
    gradient accumulation are not set to save memory against the request without them: their cost is plain."""
    k = _knob(freeze_ckpt, "checkpointing")
    assert k["saver"] and "instead of saving it" in knob_line(k, "en") and "en vez de ahorrar" in knob_line(k, "es")
    r = cabe.estimate("llama-3.1-8b", method="lora", lora_rank=64, grad_accum=4, explain=True)
    for name in ("lora_rank", "grad_accum"):
        k = _knob(r, name)
        assert k["effect"] == "costs" and not k["saver"]
        assert "instead" not in knob_line(k, "en") and knob_line(k, "en").startswith(f"{name} = ")
    assert _knob(cabe.estimate("llama-3.1-8b", method="lora", lora_rank=4, explain=True), "lora_rank")["saver"]


def test_not_computed_unless_asked():
    assert "knobs" not in cabe.estimate("llama-3.1-8b", method="lora").to_json()
    with pytest.raises(cabe.InvalidValueError) as e:
        cabe.estimate("llama-3.1-8b", explain="yes")
    assert e.value.code == "not_bool" and e.value.field == "explain"


@pytest.mark.parametrize("lang", ["en", "es"])
def test_cli_explain_text_and_json_agree(capsys, lang):
    argv = ["estimate", "--model", "llama-3.1-70b", "--method", "freeze", "--precision", "bf16", "--optimizer"]
    argv += ["paged-adamw-8bit", "--batch", "8", "--seq", "1024", "--checkpointing", "--explain", "--lang", lang]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    knobs = json.loads(capsys.readouterr().out)["knobs"]
    assert "\n".join(lines(knobs, lang)) in text
    assert [k["effect"] for k in knobs if k["field"] == "checkpointing"] == ["costs"]
    assert main(argv[:-3] + ["--json"]) == 0  # without --explain: no knobs
    assert "knobs" not in json.loads(capsys.readouterr().out)


@pytest.mark.trace
def test_a_traced_architecture_says_why_it_has_no_knobs():
    """An architecture answered from a trace (cabe.via_trace): a comparison per knob would be a trace each, so the
    report says it does not compare them, rather than leaving them out without a word."""
    for name in ("torch", "transformers", "peft"):
        pytest.importorskip(name)
    from pathlib import Path

    olmo3 = json.loads((Path(__file__).resolve().parent / "configs/files/olmo3_tiny_config.json").read_text())
    rep = cabe.estimate(olmo3, batch=1, seq=64, checkpointing=True, explain=True)
    assert "knobs" not in rep.extra and "knobs_not_traced" in rep.notes
    assert "traced step" in rep.text(lang="en") and "paso trazado" in rep.text(lang="es")


#: knobs of the schema's and the solver's lists, each set in a request where its direction is the mechanism's: what
#: it keeps or drops (the field, the request, the expected effect, the value estimated instead)
EACH_KNOB = [
    # PEFT's DoRA saves the adapted modules' extra tensors for backward (its weight norm, the scaled output): more
    # activations than plain LoRA (under checkpointing, only the magnitude vectors and their state: nothing worth a word)
    ("dora", dict(method="lora", dora=True, batch=4, seq=2048), "costs", False),
    ("dora", dict(method="lora", dora=True, checkpointing=True), "nothing", False),
    # a trainable copy of the lm_head with its gradient and AdamW state
    ("modules_to_save", dict(method="lora", modules_to_save="lm_head"), "costs", []),
    # selective checkpointing: the layers left out keep everything (against every layer checkpointed)
    ("checkpoint_every", dict(method="lora", checkpointing=True, checkpoint_every=4, batch=4, seq=2048), "costs", 1),
    # the checkpointed inputs on the host
    ("offload_activations", dict(method="lora", checkpointing=True, offload_activations=True, batch=4), "saves", False),
    # torchtune's chunked cross-entropy: the fp32 logits a chunk at a time
    ("loss", dict(method="lora", loss="chunked", batch=4, seq=2048), "saves", "hf"),
    # each gradient freed as its parameter steps, inside backward
    ("optimizer_in_backward", dict(method="full", optimizer_in_backward=True), "saves", False),
    # ZeRO-3 over 8 GPUs against each holding the states whole
    ("shard", dict(method="full", gpus=8, shard="zero3"), "saves", "ddp"),
    # ZeRO-Offload: the optimizer state in host memory
    ("offload", dict(method="full", gpus=8, shard="zero2", offload="optimizer"), "saves", "none"),
]


@pytest.mark.parametrize(
    ("name", "request_", "effect", "without"), EACH_KNOB, ids=[f"{k[0]}-{k[2]}" for k in EACH_KNOB]
)
def test_each_knob_against_the_request_without_it(name, request_, effect, without):
    r = cabe.estimate("llama-3.1-8b", explain=True, **request_)
    k = _knob(r, name)
    assert (k["effect"], k["without"]) == (effect, without)
    # the counterfactual is the same request with the field at its value without the knob, as cabe.estimate gives it
    alone = cabe.estimate("llama-3.1-8b", **{**request_, name: without})
    assert k["without_bytes"] == alone.total_bytes and k["with_bytes"] == r.total_bytes
    assert sum(k["components"].values()) == k["delta_bytes"]
