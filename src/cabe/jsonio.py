"""Strict JSON in and out, for every interface.

In: :func:`loads` refuses what Python's ``json`` accepts but a strict parser does not (``NaN``,
``Infinity``, ``-Infinity``), numbers that overflow to infinity (``1e999``), integers longer than
:data:`MAX_INT_DIGITS` digits (Python refuses to convert them past 4,300 anyway) and nesting deeper
than :data:`MAX_DEPTH` — each as a typed :class:`~cabe.errors.InvalidValueError` that names the
innermost key the value sits under (``not_finite`` / ``number_too_long`` / ``too_deep``).

Out: :func:`dumps` never writes ``NaN`` / ``Infinity`` (``allow_nan=False``): a non-finite number
reaching an output is a bug, and it raises rather than printing invalid JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any

from cabe.errors import InvalidValueError

#: Longest integer literal accepted (a real request or config.json never has more than ~20 digits).
MAX_INT_DIGITS = 300
#: Deepest nesting of objects / arrays accepted (a config.json is 3-4 levels deep).
MAX_DEPTH = 64


class _Bad:
    """A refused literal, kept until the object it sits in knows its key."""

    __slots__ = ("code", "text")

    def __init__(self, code: str, text: str) -> None:
        self.code, self.text = code, text


def _constant(text: str) -> _Bad:
    return _Bad("not_finite", text)


def _float(text: str) -> float | _Bad:
    x = float(text)
    return x if math.isfinite(x) else _Bad("not_finite", text)


def _int(text: str) -> int | _Bad:
    digits = text.lstrip("-")
    if len(digits) > MAX_INT_DIGITS:
        return _Bad("number_too_long", f"{text[:12]}…")
    return int(text)


def _find_bad(value: Any, depth: int = 0) -> _Bad | None:
    if isinstance(value, _Bad):
        return value
    if isinstance(value, list) and depth < MAX_DEPTH:
        for item in value:
            bad = _find_bad(item, depth + 1)
            if bad is not None:
                return bad
    return None


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    for key, value in pairs:
        bad = _find_bad(value)
        if bad is not None:
            raise _refuse(bad, key)
    return dict(pairs)


def _refuse(bad: _Bad, key: str | None) -> InvalidValueError:
    if bad.code == "number_too_long":
        return InvalidValueError("number_too_long", key, value=bad.text, digits=MAX_INT_DIGITS)
    return InvalidValueError("not_finite", key, value=bad.text)


def depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deeply ``value`` nests lists and dicts (stops counting past ``limit``)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    deepest = 0
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, tuple, dict)):
            deepest = max(deepest, d)
            if d > limit:
                return d
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def check_depth(value: Any, field: str | None = None) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` (``too_deep``)."""
    if depth(value) > MAX_DEPTH:
        raise InvalidValueError("too_deep", field, limit=MAX_DEPTH)


def loads(text: str | bytes, field: str | None = None, *, non_finite: bool = False) -> Any:
    """Parse strict JSON. Syntax errors stay :class:`json.JSONDecodeError` (the callers word them per
    place); refused numbers and nesting are :class:`~cabe.errors.InvalidValueError` naming the key
    (``field`` when the value is not inside an object).

    ``non_finite``: accept ``NaN`` / ``Infinity`` / ``-Infinity`` and overflowing floats as Python's floats, for
    the ``config.json`` files people download (Falcon-H1's and Mamba's ``"time_step_limit": [0.0, Infinity]``,
    which transformers reads with Python's ``json``); requests stay strict."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        data = json.loads(
            text,
            parse_constant=float if non_finite else _constant,
            parse_float=float if non_finite else _float,
            parse_int=_int,
            object_pairs_hook=_pairs,
        )
    except RecursionError:
        raise InvalidValueError("too_deep", field, limit=MAX_DEPTH) from None
    bad = _find_bad(data)
    if bad is not None:
        raise _refuse(bad, field)
    check_depth(data, field)
    return data


def is_finite_tree(value: Any) -> bool:
    """True when no float anywhere in ``value`` is NaN or infinite."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return False
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return True


def dumps(data: Any, **kw: Any) -> str:
    """JSON for an output: ``ensure_ascii=False``, never ``NaN`` / ``Infinity`` (``ValueError``)."""
    kw.setdefault("ensure_ascii", False)
    return json.dumps(data, allow_nan=False, **kw)


__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "check_depth", "depth", "dumps", "is_finite_tree", "loads"]
