"""cabe.memo: what an estimate memoizes never changes an answer, and a reshaped setup is the setup ``with_`` builds."""

from __future__ import annotations

import json
import random

import pytest

from cabe import memo
from cabe.analytic import estimate_model
from cabe.errors import InvalidValueError
from cabe.models import preset
from cabe.training import MAX_BATCH, TrainingSetup

MODELS = ("llama-3.1-8b", "gemma-2-2b", "qwen1.5-moe-a2.7b", "gpt2", "granite-4.0-h-tiny", "deepseek-v3.2-exp")


def _setups(rng: random.Random, n: int) -> list[TrainingSetup]:
    out = []
    while len(out) < n:
        kw = {
            "method": rng.choice(["full", "lora", "qlora", "freeze"]),
            "batch": rng.choice([1, 2, 3, 8]),
            "seq": rng.choice([256, 1000, 4096]),
            "checkpointing": rng.random() < 0.5,
            "attention": rng.choice(["eager", "sdpa", "flash"]),
            "lora_dropout": rng.choice([0, 0.0, 0.05]),
            "trainable_layers": 2,
            "grad_accum": rng.choice([1, 4]),
            "packing": rng.choice(["none", "none", "padding-free"]),
        }
        try:
            out.append(TrainingSetup(**kw))
        except InvalidValueError:
            continue
    return out


def _answers(spec, setups) -> list[str]:
    out = []
    for s in setups:
        try:
            out.append(json.dumps(estimate_model(spec, s).to_json(), sort_keys=True))
        except InvalidValueError as e:
            out.append(e.code)
    return out


@pytest.mark.parametrize("model", MODELS)
def test_answers_do_not_depend_on_what_was_estimated_before(model):
    """The same requests in two orders, each from empty memos: every answer (and every refusal) identical."""
    spec = preset(model).spec
    setups = _setups(random.Random(model), 24)
    memo.clear()
    forward = _answers(spec, setups)
    memo.clear()
    backward = _answers(spec, setups[::-1])[::-1]
    assert forward == backward
    # and one by one, each from empty memos
    single = []
    for s in setups:
        memo.clear()
        single += _answers(spec, [s])
    assert single == forward


def test_request_key_keeps_the_types():
    """0 and 0.0 are equal, but the report echoes each as given: they are different requests to the memo."""
    a, b = TrainingSetup(method="lora", lora_dropout=0), TrainingSetup(method="lora", lora_dropout=0.0)
    assert a == b and memo.request_key(a) != memo.request_key(b)
    assert memo.request_key(a) == memo.request_key(TrainingSetup(method="lora", lora_dropout=0, batch=7, seq=99))
    spec = preset("llama-3.1-8b").spec
    assert estimate_model(spec, a).to_json()["setup"]["lora_dropout"] == 0
    assert isinstance(estimate_model(spec, b).to_json()["setup"]["lora_dropout"], float)


@pytest.mark.parametrize("seed", range(6))
def test_reshaped_is_with_(seed):
    rng = random.Random(seed)
    base = _setups(rng, 1)[0].with_(optimizer=rng.choice(["adamw", "adamw_torch_fused", "paged_adamw_8bit"]))
    for batch, seq in ((1, 1), (5, 333), (base.batch, base.seq + 1), (MAX_BATCH, 2)):
        fast, slow = memo.reshaped(base, batch, seq), base.with_(batch=batch, seq=seq)
        assert fast == slow and fast.to_dict() == slow.to_dict()
        assert fast.optimizer_given == slow.optimizer_given and memo.request_key(fast) == memo.request_key(slow)


@pytest.mark.parametrize(
    ("batch", "seq", "code"),
    [
        (0, 8, "out_of_range"),
        (MAX_BATCH + 1, 8, "out_of_range"),
        (2, 0, "out_of_range"),
        (2.0, 8, "not_integer"),
        (True, 8, "not_integer"),
    ],
)
def test_reshaped_refuses_what_with_refuses(batch, seq, code):
    base = TrainingSetup(batch=4, seq=16)
    with pytest.raises(InvalidValueError) as slow:
        base.with_(batch=batch, seq=seq)
    with pytest.raises(InvalidValueError) as fast:
        memo.reshaped(base, batch, seq)
    assert (fast.value.code, fast.value.field) == (slow.value.code, slow.value.field) == (code, fast.value.field)


def test_an_estimate_leaves_no_reference_cycles() -> None:
    """Everything an estimate builds is freed by reference counting: a cycle (a layer holding a context that holds
    the layer) left every layer's terms for the collector, whose passes cost the 405B LoRA estimate a fifth of its
    time (benchmarks/speed.py: 181 µs with the cycle, 147 without)."""
    import gc

    from cabe.analytic import estimate_model
    from cabe.models import preset
    from cabe.training import TrainingSetup

    cases = [
        ("llama-3.1-8b", {"method": "full", "batch": 4, "seq": 2048}),
        ("llama-3.1-8b", {"method": "qlora", "batch": 4, "seq": 2048, "checkpointing": True}),
        ("llama-3.1-405b", {"method": "lora", "precision": "bf16", "batch": 1, "seq": 8192}),
        ("mixtral-8x7b", {"method": "lora", "lora_dropout": 0.1, "dora": True, "batch": 2, "seq": 512}),
    ]
    for model, kw in cases:  # (the first estimate of each fills the memos: reachable, not garbage)
        estimate_model(preset(model).spec, TrainingSetup(**kw))
    gc.collect()
    gc.disable()
    try:
        for model, kw in cases:
            estimate_model(preset(model).spec, TrainingSetup(**{**kw, "seq": kw["seq"] // 2}))
        assert gc.collect() == 0
    finally:
        gc.enable()
