"""The report's data: named components in bytes that sum to the total, the explained steps (:class:`Step`), the
model, the setup and the notes, and ``to_json()`` — the object the CLI's ``--json`` prints and the HTTP API returns.
The core fills codes and numbers only; the views (:mod:`cabe.report.text`, :mod:`cabe.report.html`) turn them into
words through :mod:`cabe.i18n`. Proved by tests/test_python_api.py and tests/web/test_schema_agreement.py."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from cabe.frozen import quick
from cabe.units import GB, GiB


@quick
@dataclass(frozen=True)
class Step:
    """One explained figure: ``formula`` with the worked numbers, and the resulting bytes.

    ``key`` names the line in the language catalogs (``step.<key>``); ``params`` fill it.
    """

    key: str
    formula: str
    bytes: int | None = None
    params: dict[str, Any] = field(default_factory=dict)


class LazySteps(Sequence[Step]):
    """The explained steps, worked out the first time they are read: an estimate nobody explains or prints as JSON (a
    solver's sweep, the page's charts) never builds them. Reads as the tuple it makes."""

    __slots__ = ("_make", "_steps")

    def __init__(self, make: Callable[[], Iterable[Step]]) -> None:
        self._make: Callable[[], Iterable[Step]] | None = make
        self._steps: tuple[Step, ...] | None = None

    def _all(self) -> tuple[Step, ...]:
        if self._steps is None:
            make, self._make = self._make, None
            self._steps = tuple(make()) if make is not None else ()
        return self._steps

    @overload
    def __getitem__(self, i: int) -> Step: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Step, ...]: ...
    def __getitem__(self, i: int | slice) -> Step | tuple[Step, ...]:
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[Step]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self._all() == tuple(other)

    def __repr__(self) -> str:
        return repr(self._all())


@quick
@dataclass(frozen=True)
class ReportData:
    mode: str  # "simple" | "lesson" | "architecture"
    total_bytes: int
    components: dict[str, int]
    parameters: int
    trainable_parameters: int
    peak_phase: str
    phase_peaks: dict[str, int]
    steps: Sequence[Step]  # a tuple, or LazySteps (worked out when read)
    setup: dict[str, Any]
    model: dict[str, Any] | None = None
    paged_bytes: int = 0
    cuda_context_bytes: int = 0
    allocator_slack_bytes: int = 0
    notes: tuple[str, ...] = ()
    lesson: dict[str, Any] | None = None
    gpu: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if sum(self.components.values()) != self.total_bytes:
            raise AssertionError("components must sum to total_bytes")  # internal invariant, not user input

    @property
    def reserved_bytes(self) -> int:
        """What ``torch.cuda.max_memory_reserved()`` is expected to show: peak + allocator slack."""
        return self.total_bytes + self.allocator_slack_bytes

    @property
    def device_bytes(self) -> int:
        """What nvidia-smi is expected to show: reserved + CUDA context (and paged state if resident)."""
        return self.reserved_bytes + self.cuda_context_bytes + self.paged_bytes

    @property
    def total_gb(self) -> float:
        return self.total_bytes / GB

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GiB

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": self.mode,
            "total_bytes": self.total_bytes,
            "total_gb": round(self.total_bytes / GB, 3),
            "total_gib": round(self.total_bytes / GiB, 3),
            "components": dict(self.components),
            "parameters": self.parameters,
            "trainable_parameters": self.trainable_parameters,
            "peak_phase": self.peak_phase,
            "phase_peaks": dict(self.phase_peaks),
            "paged_bytes": self.paged_bytes,
            "allocator_slack_bytes": self.allocator_slack_bytes,
            "reserved_bytes": self.reserved_bytes,
            "cuda_context_bytes": self.cuda_context_bytes,
            "device_bytes": self.device_bytes,
            "setup": self.setup,
            "model": self.model,
            "steps": [{"key": s.key, "formula": s.formula, "bytes": s.bytes, "params": s.params} for s in self.steps],
            "notes": list(self.notes),
        }
        if self.lesson is not None:
            out["lesson"] = self.lesson
        if self.gpu is not None:
            out["gpu"] = self.gpu
        out.update(self.extra)
        return out
