"""The attention state of the trace running now, shared by :mod:`cabe.trace.engine` (which pushes it),
:mod:`cabe.trace.patches` (which routes SDPA through it) and :mod:`cabe.trace.attention` (which notes
the kernels that ran). Kept here, importing nothing of cabe, so none of them imports another back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cabe.trace.attention import AttentionState

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
