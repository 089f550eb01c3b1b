"""Frozen dataclasses that are quick to build (:func:`quick`), for the few built on every estimate.

A frozen dataclass's generated ``__init__`` sets each field through ``object.__setattr__`` (the class's own
``__setattr__`` raises): a method call per field, about four times a plain store. :class:`cabe.step.StepParts` has
over sixty fields and is built on every estimate, a step's layer runs and moments several times: with those calls
they cost a tenth of an estimate. :func:`quick` gives such a class an ``__init__`` that stores the same fields,
with the same defaults and default factories, straight into the instance's ``__dict__``. Nothing else changes: the
class stays frozen (assignment still raises ``FrozenInstanceError``), equal, hashed and ``replace``-able as
``dataclasses`` made it. Proved by tests/test_frozen.py (the two ``__init__`` give equal objects, field by field).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")
V = TypeVar("V")
_DICT = "_quick_fields_"  # the local that holds the instance's __dict__


def quick(cls: type[T]) -> type[T]:
    """``cls`` (a frozen dataclass without ``__slots__`` or init-only fields) with a quick ``__init__``."""
    if not is_dataclass(cls) or not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__}: quick() takes a frozen dataclass")
    if "__slots__" in cls.__dict__:
        raise TypeError(f"{cls.__name__}: quick() fills __dict__; a class with __slots__ has none")
    params: list[str] = []
    body: list[str] = []
    env: dict[str, Any] = {"_MISSING": MISSING}
    keyword_only = False
    for f in fields(cls):
        if not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: quick() sets every field from its argument")
        n = f.name
        if n in ("self", _DICT) or n.startswith(("_d_", "_f_")) or n == "_MISSING":
            raise TypeError(f"{cls.__name__}.{n}: a name quick()'s __init__ uses itself")
        if f.kw_only and not keyword_only:
            params.append("*")
            keyword_only = True
        if f.default is not MISSING:
            env[f"_d_{n}"] = f.default
            params.append(f"{n}=_d_{n}")
            body.append(f"    {_DICT}[{n!r}] = {n}")
        elif f.default_factory is not MISSING:
            env[f"_f_{n}"] = f.default_factory
            params.append(f"{n}=_MISSING")
            body.append(f"    {_DICT}[{n!r}] = _f_{n}() if {n} is _MISSING else {n}")
        else:
            params.append(n)
            body.append(f"    {_DICT}[{n!r}] = {n}")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = f"def __init__(self, {', '.join(params)}):\n    {_DICT} = self.__dict__\n" + "\n".join(body) + "\n"
    exec(source, env)
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = f"{cls.__name__}'s fields, stored as dataclasses' frozen __init__ stores them (cabe.frozen)."
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


#: the field names of the classes evolve() has copied (a dataclass without __post_init__)
_EVOLVABLE: dict[type, dict[str, None]] = {}


def evolve(obj: T, **changes: Any) -> T:
    """``dataclasses.replace(obj, **changes)`` for a :func:`quick` class without ``__post_init__``: its fields copied
    as they are, ``changes`` set over them (a field's value is never checked or converted on the way, by either).
    Only the fields: what a ``cached_property`` kept in the old object's ``__dict__`` is worked out anew."""
    cls = type(obj)
    names = _EVOLVABLE.get(cls)
    if names is None:
        if hasattr(cls, "__post_init__") or not is_dataclass(cls):
            raise TypeError(f"{cls.__name__}: evolve() copies the fields of a dataclass without __post_init__")
        names = _EVOLVABLE[cls] = dict.fromkeys(f.name for f in fields(cls))
    unknown = changes.keys() - names.keys()
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {sorted(unknown)[0]!r}")
    new = object.__new__(cls)
    old = obj.__dict__
    d = new.__dict__
    for n in names:
        d[n] = old[n]
    d.update(changes)
    return new


class cached(Generic[V]):
    """``functools.cached_property`` without its lock, for the few values worked out on every estimate.

    Python 3.11's ``cached_property`` takes a lock (an ``RLock`` shared by every instance) on each first read: about
    a microsecond, paid several times per estimate on objects that live for one estimate and one thread. Python 3.12
    dropped the lock for the same reason; this is its ``__get__``: the value is stored in the instance's ``__dict__``,
    which shadows this (non-data) descriptor from then on."""

    def __init__(self, func: Callable[[Any], V]) -> None:
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> cached[V]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> V: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> V | cached[V]:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)
        return value
