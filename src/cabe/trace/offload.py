"""FSDP2's CPU offload on rank 0 (:mod:`cabe.trace.distributed`): which setups it traces (:func:`offloads`), the
model materialised on the host (:func:`to_empty`), pinned memory on the fake device (:func:`pinned_host`) and the host
memory counted apart from the GPU's (:func:`host_tally`, :class:`cabe.trace.tracker.HostTally`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cabe.trace.patches import _Patch
from cabe.training import TrainingSetup


def offloads(setup: TrainingSetup) -> bool:
    """FSDP2's ``CPUOffloadPolicy`` traced: ``--offload parameters|both`` under FSDP / HSDP without tensor
    parallelism (FSDP's CPU offload moves the sharded parameters, their gradients and the optimizer step to the host:
    cabe.parallel.fsdp)."""
    return setup.shard in ("fsdp", "fsdp-hybrid") and setup.offload in ("parameters", "both") and setup.tp == 1


def why(setup: TrainingSetup) -> str:
    """Why an offload is not traced: FSDP2 has no optimizer-only offload (``CPUOffloadPolicy`` moves the parameters
    with it), DDP none at all, and FSDP2's offload over TP's DTensors is not built here."""
    if setup.shard in ("fsdp", "fsdp-hybrid") and setup.offload == "optimizer":
        return "offload_optimizer_fsdp"
    if setup.shard in ("fsdp", "fsdp-hybrid") and setup.tp > 1:
        return "offload_tp"
    return "offload"


def to_empty(model: Any, setup: TrainingSetup, device: Any) -> None:
    """Each rank's shards allocated on the device; with CPU offload on the host, which FSDP2 requires
    (_fsdp_param_group.py:1043-1055, ``_validate_cpu_offload_params``), and the buffers (rotary tables) on the device,
    as torchtitan materialises an offloaded model (``to_empty(device="cpu")``, then ``init_weights(buffer_device=)``
    on the GPU): FSDP2 shards no buffer, and the forward takes them where its activations are."""
    if not offloads(setup):
        model.to_empty(device=device)
        return
    model.to_empty(device="cpu")
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = buffer.to(device)


def host_tally(setup: TrainingSetup, rank0: Any) -> Any:
    """Host memory counted beside the GPU's when the setup offloads (the fake device tells them apart: fake tensors
    keep their ``cpu`` / ``cuda`` device); None otherwise."""
    from cabe.trace.tracker import HostTally

    return HostTally(lambda: rank0.step) if offloads(setup) else None


@contextlib.contextmanager
def pinned_host(kind: str, setup: TrainingSetup) -> Iterator[None]:
    """Pinned host memory on the fake device, for FSDP2's CPU offload: FakeTensorMode has no ``aten._pin_memory``
    ("NYI"). Pinning copies the tensor into a new page-locked storage of the same size (aten/src/ATen/native/Memory.cpp
    ``_pin_memory``: a storage from the pinned allocator, ``copy_`` into it), so a contiguous clone stands in for it,
    byte for byte on the host (the CUDA host allocator's rounding of that block aside); ``is_pinned`` says true for a
    host tensor, so FSDP2 pins each shard once (_fsdp_param.py:1044-1045) as it does on a GPU."""
    if kind != "fake" or not offloads(setup):
        yield
        return
    import torch

    p = _Patch()
    try:
        p.set(torch.Tensor, "pin_memory", lambda self, *a, **k: self.clone(memory_format=torch.contiguous_format))
        p.set(torch.Tensor, "is_pinned", lambda self, *a, **k: self.device.type == "cpu")
        yield
    finally:
        p.restore()
