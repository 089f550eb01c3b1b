"""``cabe.trace``: the ground truth on a CPU.

Simulates real PyTorch + transformers training steps on fake tensors and records every
allocation as the CUDA caching allocator would see it::

    from cabe.trace import trace_step, TraceResult, layer_inventory
    res = trace_step(config_dict, TrainingSetup(...), steps=2, mode="auto")
    res.peak_bytes, res.components, res.to_json()

Importing this package tries to install the fake-CUDA shim (see :mod:`cabe.trace._native`),
which only works before torch is imported; nothing else is imported eagerly, so
``import cabe.trace`` works without the ``[trace]`` extra (calls then raise
``MissingDependencyError``).
"""

from __future__ import annotations

from typing import Any

from cabe.trace import _native

_native.preload()

from cabe.trace.engine import TraceResult  # noqa: E402  (no torch import at module level)

__all__ = ["trace_step", "TraceResult", "layer_inventory"]


def trace_step(config: dict, setup: Any, *, steps: int = 2, mode: str = "auto") -> "TraceResult":
    from cabe.trace.engine import trace_step as _trace_step

    return _trace_step(config, setup, steps=steps, mode=mode)


def layer_inventory(config: dict, setup: Any, *, mode: str = "auto") -> list[dict]:
    from cabe.trace.engine import layer_inventory as _inv

    return _inv(config, setup, mode=mode)

