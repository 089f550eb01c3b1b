"""``cabe.trace``: the ground truth on a CPU.

Simulates real PyTorch + transformers training steps on fake tensors and records every
allocation as the CUDA caching allocator would see it::

    from cabe.trace import trace_step, TraceResult, layer_inventory
    res = trace_step(config_dict, TrainingSetup(...), steps=2, mode="auto")
    res.peak_bytes, res.components, res.to_json()

Importing this package tries to install the fake-CUDA shim (see :mod:`cabe.trace._native`),
which only works before torch is imported; when torch came first, traces run in a persistent
worker process instead (same results, one extra torch import). Nothing else is imported
eagerly, so ``import cabe.trace`` works without the ``[trace]`` extra (calls then raise
``MissingDependencyError``). Traces are not thread-safe: one at a time per process.

Modules: :mod:`~cabe.trace.engine` (the entry points), :mod:`~cabe.trace.result` (the result and
its JSON), :mod:`~cabe.trace.build` (model, training method), :mod:`~cabe.trace.inputs` (optimizer, batch, autocast), :mod:`~cabe.trace.deps` (what must be installed), :mod:`~cabe.trace.patches`
(fake CUDA and the hooks a trace patches), :mod:`~cabe.trace.step` (the training steps),
:mod:`~cabe.trace.analysis` (events to peak, components, timeline), :mod:`~cabe.trace.saved`
(the layer inventory; its command line :mod:`~cabe.trace.inventory`), :mod:`~cabe.trace.worker` (the subprocess) and
:mod:`~cabe.trace.serve` (its server), :mod:`~cabe.trace.state` (the
attention state of the running trace), :mod:`~cabe.trace.tracker` (allocations and components), :mod:`~cabe.trace.attention` (CUDA SDPA backend choice, FlashAttention scratch),
:mod:`~cabe.trace.quant` (bitsandbytes 4-bit), :mod:`~cabe.trace.generate` (transformers' ``generate`` on fake
tensors: ``cabe infer --trace``), :mod:`~cabe.trace.allocator` (caching-allocator
replay, CUDA context table), :mod:`~cabe.trace.plot` (SVG), :mod:`~cabe.trace.measure` (real
GPU), :mod:`~cabe.trace.cli`; ``python -m cabe.trace CONFIG.json ...`` and
``python -m cabe.trace.inventory CONFIG.json ...``.

Known limits (the trace is exact for what tensors hold; these are outside it): memory that
kernels allocate without returning it as a tensor is modelled only for FlashAttention-2
backward (``softmax_d``, ``dq_accum``, GQA ``dk/dv`` expansion) and bitsandbytes' dequantising
``gemm_4bit`` fallback -- not for memory-efficient attention's backward workspace, cuBLAS
workspaces or the cuDNN attention backend (recent PyTorch prefers it on H100/B200 with
cuDNN > 9.15; its saved tensors match flash's); the CUDA context is a table, not a trace.
"""

from __future__ import annotations

from typing import Any

from cabe.trace import _native

_native.preload()

from cabe.trace.result import TraceResult  # noqa: E402  (no torch import at module level)

__all__ = ["TraceResult", "layer_inventory", "trace_step"]


def trace_step(config: dict, setup: Any, *, steps: int = 2, mode: str = "auto") -> TraceResult:
    from cabe.trace.engine import trace_step as _trace_step

    return _trace_step(config, setup, steps=steps, mode=mode)


def layer_inventory(config: dict, setup: Any, *, mode: str = "auto") -> list[dict]:
    from cabe.trace.engine import layer_inventory as _inv

    return _inv(config, setup, mode=mode)
