"""The attention state of the trace running now, shared by :mod:`cabe.trace.engine` (which pushes it),
:mod:`cabe.trace.patches` (which routes SDPA through it) and :mod:`cabe.trace.attention` (which notes
the kernels that ran). Kept here, importing nothing of cabe, so none of them imports another back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class AttentionState:
    """Per-trace bookkeeping: which kernels ran, and the device to put rng state on."""

    def __init__(self, device: Any) -> None:
        self.device = device  # a torch.device
        self.choices: dict[str, int] = {}

    def note(self, name: str) -> None:
        self.choices[name] = self.choices.get(name, 0) + 1


_STACK: list[AttentionState] = []


@contextlib.contextmanager
def active(state: AttentionState) -> Iterator[AttentionState]:
    """Make ``state`` the current attention state for the duration of one trace."""
    _STACK.append(state)
    try:
        yield state
    finally:
        _STACK.pop()


def current() -> AttentionState:
    """The attention state of the trace running now; ``IndexError`` outside a trace."""
    return _STACK[-1]
