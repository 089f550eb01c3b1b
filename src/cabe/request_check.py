"""A request's values checked against :mod:`cabe.schema` (type, choices, range) before the core reads them: the
Python API's ``cabe.infer`` takes any Python value, and the serving core reads its numbers as given (an empty list as
a prefill chunk reached ``min()`` as a bare TypeError). Each bad value is a typed error naming its field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe import schema
from cabe.errors import InvalidValueError
from cabe.training import number


def check_values(body: Mapping[str, Any], command: str) -> None:
    """Refuse the first value of ``body`` its field in ``command`` cannot hold; None and "" are "not given". The model
    (a name, a path or a config) is :func:`cabe.api.model_source`'s to read."""
    for f in schema.fields_for(command, output=False):
        if f.name in ("model", "config"):
            continue
        v = body.get(f.name)
        if v is None or (isinstance(v, str) and v == "" and f.type is not str):
            continue
        _check(f, v)


def _check(f: schema.Field, v: Any) -> None:
    if f.type is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidValueError("not_integer", f.name, value=v)
        lo = f.minimum if f.minimum is not None else -float("inf")
        hi = f.maximum if f.maximum is not None else float("inf")
        if v < lo or v > hi or (f.exclusive_minimum and v == lo):
            raise InvalidValueError("out_of_range", f.name, value=v, minimum=_n(f.minimum), maximum=_n(f.maximum))
    elif f.type is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidValueError("not_number", f.name, value=v)
        lo = f.minimum if f.minimum is not None else -1e300
        number(f.name, v, minimum=lo, maximum=f.maximum if f.maximum is not None else 1e300, strict=f.exclusive_minimum)
    elif f.type is bool:
        if not isinstance(v, bool):
            raise InvalidValueError("not_bool", f.name, value=v)
    elif f.type is str:
        if not isinstance(v, str):
            raise InvalidValueError("not_string", f.name, value=v)
        allowed = f.allowed()
        if allowed is not None and v not in allowed:
            raise InvalidValueError("bad_choice", f.name, value=v, allowed=", ".join(allowed))
    elif f.type is tuple:
        items = v if isinstance(v, (list, tuple)) else [v]
        if not items or not all(isinstance(x, str) for x in items):
            raise InvalidValueError("not_string", f.name, value=v)


def _n(x: float | None) -> Any:
    return "∞" if x is None else int(x) if float(x).is_integer() else x
