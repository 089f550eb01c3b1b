"""Solver answers are verified by re-estimating at the answer (fits) and one step past it (does not)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cabe import gpus, solver
from cabe.analytic import estimate_model
from cabe.cli import main
from cabe.errors import CabeError, InvalidValueError
from cabe.models import preset
from cabe.training import TrainingSetup


def fits(spec, setup, card) -> bool:
    return gpus.fit(estimate_model(spec, setup), card)["fits"]


SPECS = {n: preset(n).spec for n in ("llama-3.2-1b", "llama-3.1-8b", "qwen2.5-7b", "mistral-7b-v0.1")}
CARDS = ["rtx-4090", "a100-80gb", "h100-80gb", "l4", "rtx-3090"]


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(sorted(SPECS)),
    st.sampled_from(CARDS),
    st.sampled_from(["full", "lora", "qlora"]),
    st.booleans(),
    st.sampled_from([256, 1024, 4096]),
    st.integers(1, 8),
)
def test_max_batch_fits_and_one_more_does_not(name, card_name, method, ckpt, seq, batch):
    spec, card = SPECS[name], gpus.gpu(card_name)
    s = TrainingSetup(method=method, precision="bf16", checkpointing=ckpt, seq=seq, batch=batch)
    a = solver.max_batch(spec, s, card)
    if a["value"] is None:
        assert not fits(spec, s.with_(batch=1), card)
        return
    assert fits(spec, s.with_(batch=a["value"]), card)
    if not a["capped"]:
        assert not fits(spec, s.with_(batch=a["value"] + 1), card)


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(sorted(SPECS)),
    st.sampled_from(CARDS),
    st.sampled_from(["full", "lora", "qlora"]),
    st.booleans(),
    st.integers(1, 8),
)
def test_max_seq_fits_and_one_more_does_not(name, card_name, method, ckpt, batch):
    spec, card = SPECS[name], gpus.gpu(card_name)
    s = TrainingSetup(method=method, precision="bf16", checkpointing=ckpt, batch=batch)
    a = solver.max_seq(spec, s, card)
    if a["value"] is None:
        assert not fits(spec, s.with_(seq=1), card)
        return
    assert fits(spec, s.with_(seq=a["value"]), card)
    if a["capped"]:
        assert a["value"] == spec.max_positions
    else:
        assert not fits(spec, s.with_(seq=a["value"] + 1), card)


@pytest.mark.parametrize("shard", ["zero3", "fsdp", "none"])
def test_min_gpus_fits_and_one_fewer_does_not(shard):
    spec, card = preset("llama-3.1-70b").spec, gpus.gpu("a100-80gb")
    s = TrainingSetup(precision="bf16-amp", batch=1, seq=2048, checkpointing=True, shard=shard)
    a = solver.min_gpus(spec, s, card)
    n = a["value"]
    assert n is not None and n > 1
    used = s.with_(shard=a["shard"], **({"param_dtype": a["param_dtype"]} if "param_dtype" in a else {}))
    # FSDP under autocast is solved with accelerate's policy (param_dtype = autocast's): without it autocast keeps
    # a whole 16-bit copy of the weights on every rank to forward's end, and no count of GPUs fits
    assert a.get("param_dtype") == ("bf16" if a["shard"].startswith("fsdp") else None)
    assert fits(spec, used.with_(gpus=n), card)
    assert not fits(spec, used.with_(gpus=n - 1), card)


def test_min_gpus_respects_tp_pp_multiples():
    spec, card = preset("llama-3.1-70b").spec, gpus.gpu("h100-80gb")
    # (DeepSpeed in its bf16 mode, as the Trainer configures it: a plain bf16 module in DeepSpeed's fp32 mode keeps
    # every gradient whole in fp32 under ZeRO-1, 70 GB per TP rank here, and fits no count of 80 GB cards)
    s = TrainingSetup(
        precision="bf16", param_dtype="bf16", batch=1, seq=4096, checkpointing=True, shard="zero1", tp=4, gpus=4
    )
    a = solver.min_gpus(spec, s, card)
    assert a["value"] is not None and a["value"] % 4 == 0
    assert solver.min_gpus(spec, s.with_(param_dtype="none"), card)["value"] is None


def test_make_it_fit_8b_full_on_24gb():
    spec, card = SPECS["llama-3.1-8b"], gpus.gpu("rtx-4090")
    s = TrainingSetup(batch=4, seq=2048)
    out = solver.make_it_fit(spec, s, card)
    assert not out["fits_now"]
    codes = {r["change"] for r in out["by_memory"]}
    assert {"checkpointing", "lora", "qlora", "optimizer_8bit", "offload_optimizer"} <= codes
    saved = [r["saved_bytes"] for r in out["by_memory"]]
    assert saved == sorted(saved, reverse=True)
    for r in out["by_memory"]:  # each figure is a real estimate of the changed setup
        assert r["needed_bytes"] == gpus.fit(estimate_model(spec, s.with_(**r["set"])), card)["needed_bytes"]
    plan = out["plan"]
    assert plan["fits"]
    assert fits(
        spec, TrainingSetup(**{k: tuple(v) if isinstance(v, list) else v for k, v in plan["setup"].items()}), card
    )


def test_solves_take_milliseconds():
    spec, card = SPECS["llama-3.1-8b"], gpus.gpu("a100-80gb")
    s = TrainingSetup(method="lora", precision="bf16", batch=2, seq=1024)
    solver.solve(spec, s, card)  # warm caches
    t0 = time.perf_counter()
    out = solver.solve(spec, s, card)
    assert time.perf_counter() - t0 < 0.5
    assert out["batch"]["value"] >= 2


def test_cli_fit_json_and_text(capsys):
    assert (
        main(
            [
                "fit",
                "--model",
                "llama-3.2-1b",
                "--method",
                "lora",
                "--gpu",
                "rtx-4090",
                "--batch",
                "2",
                "--seq",
                "1024",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["batch"]["value"] >= 2 and "changes" in out
    assert (
        main(
            [
                "fit",
                "--model",
                "llama-3.2-1b",
                "--method",
                "lora",
                "--gpu",
                "rtx-4090",
                "--solve",
                "batch,seq",
                "--lang",
                "es",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "Micro-lote más grande" in text and "GB" in text


def test_bad_input():
    with pytest.raises(InvalidValueError) as e:
        solver.plan_json({"model": "llama-3.2-1b"})
    assert e.value.code == "missing_gpu"
    with pytest.raises(InvalidValueError) as e:
        solver.plan_json({"model": "llama-3.2-1b", "gpu": "l4", "solve": "everything"})
    assert e.value.code == "bad_choice"
    with pytest.raises(CabeError):
        solver.plan_json({"model": "llama-3.2-1b", "gpu": "no-such-card"})
    assert main(["fit", "--model", "llama-3.2-1b", "--gpu", "l4", "--solve", "nope"]) == 2
