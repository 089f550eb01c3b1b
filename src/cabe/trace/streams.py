"""CUDA streams and events that do nothing, for the engines traced on the fake CUDA device (FSDP2, DDP, DeepSpeed:
:mod:`cabe.trace.distributed`, :mod:`cabe.trace.zero`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cabe.trace.patches import _Patch


@contextlib.contextmanager
def streams(kind: str) -> Iterator[None]:
    """CUDA streams and events that do nothing, on the fake device: FSDP2 and DDP make their own streams for the
    collectives to overlap compute (a CPU-only build has none); on a fake group every collective is done when it
    returns, so waiting on a stream or an event has nothing to wait for, and memory does not depend on it (FSDP2
    frees a unit's gathered storage by its own bookkeeping, not by a stream's progress)."""
    if kind != "fake":
        yield
        return
    import torch

    p = _Patch()
    try:
        p.set(torch.cuda, "Stream", _Stream)
        p.set(torch.cuda, "Event", _Event)
        p.set(torch.cuda, "current_stream", lambda *a, **k: _STREAM)
        p.set(torch.cuda, "default_stream", lambda *a, **k: _STREAM)
        p.set(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        p.set(torch.cuda, "set_device", lambda *a, **k: None)
        p.set(torch.accelerator, "current_stream", lambda *a, **k: _STREAM)
        p.set(torch.Tensor, "record_stream", lambda self, s: None)
        yield
    finally:
        p.restore()


class _Event:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, *args: Any) -> None:
        pass

    def wait(self, *args: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _Stream(_Event):
    def wait_stream(self, *args: Any) -> None:
        pass

    def wait_event(self, *args: Any) -> None:
        pass

    def record_event(self, *args: Any, **kwargs: Any) -> _Event:
        return _Event()

    def is_capturing(self) -> bool:  # (no CUDA graph is ever captured here)
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Stream)

    def __hash__(self) -> int:
        return 0


_STREAM = _Stream()
