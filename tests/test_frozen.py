"""cabe.frozen.quick: the quick __init__ builds what dataclasses' frozen __init__ builds, field by field."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from cabe.frozen import quick
from cabe.report.data import ReportData, Step
from cabe.step import LayerRun, Moment, StepParts


@dataclass(frozen=True)
class _Plain:
    a: int
    b: str = "x"
    c: dict[str, int] = field(default_factory=dict)
    d: int = field(default=3, kw_only=True)


def test_same_fields_defaults_and_factories() -> None:
    # the same class twice: one with dataclasses' __init__, one with quick's
    q = quick(
        dataclass(frozen=True)(
            type(
                "Q",
                (),
                {
                    "__annotations__": {"a": "int", "b": "str", "c": "dict[str, int]", "d": "int"},
                    "b": "x",
                    "c": field(default_factory=dict),
                    "d": field(default=3, kw_only=True),
                },
            )
        )
    )
    for args, kw in (((1,), {}), ((1, "y"), {"d": 7}), ((2, "z", {"k": 1}), {})):
        plain, fast = _Plain(*args, **kw), q(*args, **kw)
        assert vars(plain) == vars(fast)
    one, two = q(1), q(1)
    assert one.c == {} and one.c is not two.c  # a fresh dict per instance, as default_factory gives
    with pytest.raises(TypeError):
        q(1, "y", {}, 4)  # d is keyword-only, as declared
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.a = 2  # type: ignore[misc]
    assert one == q(1)
    assert dataclasses.replace(one, a=5).a == 5


@pytest.mark.parametrize("cls", [Moment, LayerRun, StepParts, Step, ReportData])
def test_cabe_classes_keep_their_fields(cls: type) -> None:
    """Each quick class's __init__ takes its fields as dataclasses declared them (names, order, defaults)."""
    import inspect

    params = list(inspect.signature(cls.__init__).parameters)[1:]
    assert params == [f.name for f in dataclasses.fields(cls)]
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"


def test_refuses_what_it_cannot_fill() -> None:
    with pytest.raises(TypeError):
        quick(dataclass(type("M", (), {"__annotations__": {"a": "int"}})))  # not frozen
    with pytest.raises(TypeError):
        quick(dataclass(frozen=True, slots=True)(type("S", (), {"__annotations__": {"a": "int"}})))
    with pytest.raises(TypeError):
        quick(
            dataclass(frozen=True)(type("N", (), {"__annotations__": {"a": "int"}, "a": field(default=1, init=False)}))
        )


def test_evolve_is_replace_for_quick_classes() -> None:
    from cabe.frozen import evolve

    run = LayerRun(count=4, grads=10, copies=2, saved=7, workspace=3)
    assert evolve(run, count=1, cached_count=1) == dataclasses.replace(run, count=1, cached_count=1)
    assert run.count == 4  # the original is left as it was
    with pytest.raises(TypeError):
        evolve(run, not_a_field=1)
    with pytest.raises(TypeError):  # a class with __post_init__: replace runs it, evolve would not
        evolve(ReportData.__new__(ReportData))


def test_cached_reads_once_and_shadows_itself() -> None:
    from cabe.frozen import cached

    calls: list[int] = []

    class C:
        @cached
        def value(self) -> int:
            """the doc"""
            calls.append(1)
            return 42

    c = C()
    assert (c.value, c.value) == (42, 42) and calls == [1]
    assert "value" in vars(c) and C.value.__doc__ == "the doc"
    assert C().value == 42 and calls == [1, 1]  # per instance
