"""``cabe measure``: run the same training step for real on a CUDA GPU and read the allocator.

The model is built exactly as :mod:`cabe.trace.engine` builds it (``from_config`` on meta,
the method's wrappers, random initialisation on the GPU -- nothing is downloaded), and the
same training loop runs with real tensors. The allocation tracker runs too, so the result
holds both what PyTorch's allocator reports and what the tracker counted in the same run;
their difference is memory that no tensor owns (kernel workspaces such as FlashAttention's
backward buffers or cuBLAS workspaces, and unsplit block remainders).

Reported, for the last (steady-state) step: ``max_memory_allocated``,
``max_memory_reserved`` (after ``reset_peak_memory_stats`` at the start of that step, and
since the process started), and the device's used memory from ``torch.cuda.mem_get_info``
(which includes the CUDA context, library workspaces and anything else on the GPU).
"""

from __future__ import annotations

import time
from typing import Any

from cabe.errors import CabeError
from cabe.training import TrainingSetup


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def measure_step(config: dict[str, Any], setup: TrainingSetup, *, steps: int = 3) -> dict[str, Any]:
    """Run ``steps`` real training steps on the current CUDA device; see the module docstring.

    Raises a :class:`~cabe.errors.CabeError` with code ``no_cuda`` when no CUDA device is
    visible, :class:`~cabe.errors.MissingDependencyError` without the ``[trace]`` extra.
    """
    from cabe.trace.engine import import_deps

    import_deps(setup)
    if not cuda_available():
        raise CabeError("no_cuda", None)
    import torch

    from cabe.trace.engine import run_trace

    if not isinstance(steps, int) or steps < 2:
        steps = 2
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.init()
    torch.zeros(1, device=dev)  # create the context
    torch.cuda.synchronize()
    free0, total = torch.cuda.mem_get_info()
    used_at_start = total - free0
    reserved_at_start = torch.cuda.memory_reserved()
    marks: dict[str, int] = {}

    def on_step_start(step: int) -> None:
        if step == steps:
            torch.cuda.synchronize()
            marks["max_reserved_before_last_step"] = torch.cuda.max_memory_reserved()
            marks["max_allocated_before_last_step"] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()

    t0 = time.perf_counter()
    try:
        res = run_trace(config, setup, steps, "cuda", hooks={"on_step_start": on_step_start})
    except torch.cuda.OutOfMemoryError as exc:
        _free, total = torch.cuda.mem_get_info()
        return {
            "oom": True,
            "error": str(exc).splitlines()[0][:300],
            "device_total_bytes": total,
            "device": torch.cuda.get_device_name(dev),
            "setup": setup.to_dict(),
        }
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    props = torch.cuda.get_device_properties(dev)
    out: dict[str, Any] = {
        "oom": False,
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
        "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(),
        "max_memory_reserved_whole_run_bytes": max(
            marks.get("max_reserved_before_last_step", 0), torch.cuda.max_memory_reserved()
        ),
        "max_memory_allocated_first_steps_bytes": marks.get("max_allocated_before_last_step", 0),
        "memory_reserved_end_bytes": torch.cuda.memory_reserved(),
        "device_used_bytes": total - free1,
        "device_used_at_start_bytes": used_at_start,
        "reserved_at_start_bytes": reserved_at_start,
        "cuda_context_bytes": max(0, used_at_start - reserved_at_start),
        "device_total_bytes": total,
        "tracked_peak_bytes": res.peak_bytes,
        "tracked_components": res.components,
        "tracked_peak_phase": res.peak_phase,
        "parameters": res.parameters,
        "trainable_parameters": res.trainable_parameters,
        "device": torch.cuda.get_device_name(dev),
        "capability": f"sm{props.major}{props.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "steps": steps,
        "seconds": round(time.perf_counter() - t0, 2),
        "notes": res.note_texts(localize=False),
        "setup": setup.to_dict(),
    }
    return out
