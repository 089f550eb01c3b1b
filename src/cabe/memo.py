"""What the estimates of one model share, computed once: a memo per model object (:func:`of`).

``cabe fit`` and the page run many estimates of one request that differ in the batch, the sequence, the method or
the GPUs; the parameter tensors of a run of layers, the LoRA targets, the resolved facts of a layer and the model
states do not depend on the batch or the sequence, so each is worked out once per model and per the request's other
fields (:func:`request_key`: every field of the setup but ``batch`` and ``seq``, so that a new field is part of the
key by itself). Nothing keyed on the whole request is kept: no estimate is ever answered from a memo.

A model is found by identity (hashing a ``ModelSpec`` walks every layer's linears): the memo holds the model, so its
id cannot be reused while the memo lives; an equal model built again gets a memo of its own. Objects met inside a
model (its layer groups) are keyed by id the same way: the memo's value keeps the object alive beside it.
The memos are bounded (the web server meets uploaded configs): past :data:`MAX_MODELS` models, or
:data:`MAX_ENTRIES` entries in one, they start again empty. Values are shared between estimates: never mutated.
"""

from __future__ import annotations

from dataclasses import fields
from operator import attrgetter
from typing import Any

from cabe import schema
from cabe.errors import InvalidValueError
from cabe.training import TrainingSetup

MAX_MODELS = 64
MAX_ENTRIES = 4096

_MEMOS: dict[int, tuple[object, dict[Any, Any]]] = {}

#: the setup's fields an estimate's shape does not enter: every one but the batch and the sequence
REQUEST_FIELDS = tuple(f.name for f in fields(TrainingSetup) if f.name not in ("batch", "seq"))
_request = attrgetter(*REQUEST_FIELDS)


def of(model: object) -> dict[Any, Any]:
    """The memo of ``model`` (a :class:`cabe.architecture.ModelSpec`), by identity."""
    hit = _MEMOS.get(id(model))
    if hit is not None:
        memo = hit[1]
        if len(memo) > MAX_ENTRIES:
            memo.clear()
        return memo
    if len(_MEMOS) >= MAX_MODELS:
        _MEMOS.clear()
    memo = {}
    _MEMOS[id(model)] = (model, memo)
    return memo


class _Key(tuple):
    """A request key that hashes once (40 fields hashed on every look-up would cost more than the look-up)."""

    hash: int

    def __new__(cls, values: tuple[Any, ...]) -> _Key:
        key = super().__new__(cls, values)
        key.hash = tuple.__hash__(key)
        return key

    def __hash__(self) -> int:
        return self.hash

    def __reduce__(self) -> tuple[Any, ...]:  # a setup sent to another process: hashed there anew
        return _Key, (tuple(self),)


def request_key(setup: TrainingSetup) -> tuple[Any, ...]:
    """The request less its shape: every field of ``setup`` but ``batch`` and ``seq``, and their types. Kept on the
    setup (a frozen value: its fields never change once built; ``replace`` makes a new one without it)."""
    key = setup.__dict__.get("_request_key")
    if key is None:
        values = _request(setup)
        # with the values' types: 0 and 0.0 are equal, but the report echoes each as it was given
        key = setup.__dict__["_request_key"] = _Key((*values, tuple(map(type, values))))
    return key


#: the ranges TrainingSetup checks the shape against (cabe.schema)
_RANGES = {n: (int(schema.field(n).minimum or 0), int(schema.field(n).maximum or 0)) for n in ("batch", "seq")}


def reshaped(setup: TrainingSetup, batch: int, seq: int) -> TrainingSetup:
    """``setup.with_(batch=batch, seq=seq)``, without validating again the fields that did not change (building a
    TrainingSetup checks all of them against the schema: tens of µs, more than an estimate's own work): the new
    shape is checked as TrainingSetup checks it, and no rule of :func:`cabe.training.validate` reads the shape
    beside another field (tests/test_memo.py holds the two equal). The optimizer's given name is the registry's, as
    ``with_`` leaves it."""
    if batch == setup.batch and seq == setup.seq:
        return setup
    for name, value in (("batch", batch), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidValueError("not_integer", name, value=value)
        lo, hi = _RANGES[name]
        if value < lo or value > hi:
            raise InvalidValueError("out_of_range", name, value=value, minimum=lo, maximum=hi)
    new = object.__new__(TrainingSetup)
    d = new.__dict__
    d.update(setup.__dict__)  # the fields, and the request key: the same request less its shape
    d["batch"], d["seq"], d["_optimizer_given"] = batch, seq, setup.optimizer
    return new


def clear() -> None:
    """Forget every memo (tests and benchmarks that want a first estimate)."""
    _MEMOS.clear()
