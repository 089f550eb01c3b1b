"""What every kind of trace run is made with: the setup as a trace reads it (:func:`check_setup`), the fake tensor
mode of a simulation (:func:`fake_mode`) and the allocation tracker with its kernel-scratch intercepts
(:func:`tracker`). Shared by the one-GPU engine (:mod:`cabe.trace.engine`) and rank 0 of several
(:mod:`cabe.trace.distributed`)."""

from __future__ import annotations

import contextlib
from typing import Any

from cabe.errors import ConfigError
from cabe.training import TrainingSetup


def check_setup(setup: Any, config: Any) -> TrainingSetup:
    """The setup, with ``dtype="auto"`` read from the config as transformers 5 does."""
    if not isinstance(setup, TrainingSetup):
        raise ConfigError("bad_setup", "setup")
    from cabe.families import config_dtype
    from cabe.precision import resolve

    return resolve(setup, config_dtype(config) if isinstance(config, dict) else None)


def fake_mode(kind: str) -> Any:
    """FakeTensorMode for a simulation (``fake``), nothing for real tensors."""
    if kind != "fake":
        return contextlib.nullcontext()
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def tracker(setup: TrainingSetup, kind: str, device: Any, astate: Any, gemm4: Any) -> Any:
    """The allocation tracker, with the kernel-scratch intercepts of a simulation."""
    from cabe.trace.attention import intercept as attn_intercept
    from cabe.trace.quant import gemm_4bit_scratch
    from cabe.trace.tracker import AllocationTracker

    def intercept(tr: Any, func: Any, args: tuple, kwargs: dict) -> Any:
        if kind in ("cpu", "cuda"):  # real kernels allocate for themselves
            return NotImplemented
        if gemm4 is not None and func is gemm4:
            return gemm_4bit_scratch(tr, func, args, kwargs)
        return attn_intercept(astate, tr, func, args, kwargs)

    tracker = AllocationTracker(device_type=device.type, intercept=intercept)
    # A CPU run stands in for a GPU run: optimizer `step` counters are host tensors there.
    tracker.host_scalars_in_optimizer = kind == "cpu" and setup.resolved_optimizer_impl != "fused"
    return tracker


def finish(result: Any, setup: TrainingSetup, engine: dict[str, Any], notes: list[str], astate: Any, t0: float) -> Any:
    """A rank-0 trace's result with what every engine's run adds (cabe.trace.distributed, cabe.trace.zero): the
    attention kernels picked, the notes, the setup, the engine's description and the seconds it took."""
    import time

    result.attention_kernels = dict(astate.choices)
    result.notes = notes + result.notes
    result.setup = setup.to_dict()
    result.engine = engine
    result.seconds = time.perf_counter() - t0
    return result
