"""Rank 0 of an N-GPU FSDP2 job, traced in one process on PyTorch's fake process group.

``torch.testing._internal.distributed.fake_pg`` registers a ``"fake"`` backend whose collectives return at
once without touching data: with ``init_process_group("fake", rank=0, world_size=N)`` the real FSDP2 code
(``torch.distributed.fsdp.fully_shard``) shards, all-gathers, reduce-scatters and frees exactly as rank 0
of N would, so the allocation tracker sees rank 0's memory. It runs on real CPU tensors (``kind="cpu"``,
the exactness reference of :mod:`cabe.trace`): FSDP2 on the fake CUDA device needs CUDA streams, which a
CPU-only build does not have, so this is for small models.

Each decoder layer is one ``fully_shard`` unit and the root module another (the recipe of torchtune and
accelerate), with ``MixedPrecisionPolicy(param_dtype=setup.param_dtype)`` when the setup asks for the
engine's mixed precision. ``reshard_after_forward`` is FSDP2's default (True).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from cabe.errors import ConfigError
from cabe.trace import state
from cabe.trace.build import build_model, decoder_layers
from cabe.trace.deps import import_deps
from cabe.trace.engine import _check_setup
from cabe.trace.family_patches import model_types
from cabe.trace.patches import trace_environment
from cabe.trace.result import TraceResult
from cabe.training import TrainingSetup

_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def trace_fsdp2(config: dict[str, Any], setup: TrainingSetup, *, steps: int = 2) -> TraceResult:
    """Trace rank 0 of ``setup.gpus`` GPUs running ``fully_shard`` (``setup.shard == "fsdp"``).

    Raises :class:`~cabe.errors.ConfigError` when the setup is not one FSDP2 group on several GPUs.
    """
    setup = _check_setup(setup, config)
    if setup.shard != "fsdp" or setup.gpus < 2 or setup.tp > 1 or setup.pp > 1 or setup.offload != "none":
        raise ConfigError("mode_unsupported", "shard", mode="fsdp2", reason="one FSDP2 group of 2 or more GPUs only")
    import_deps(setup)
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from cabe.trace.state import AttentionState

    t0 = time.perf_counter()
    if dist.is_initialized():
        raise ConfigError("mode_unsupported", "mode", mode="fsdp2", reason="a process group is already initialised")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=setup.gpus)
    try:
        mesh = init_device_mesh("cpu", (setup.gpus,))
        device = torch.device("cpu")
        with state.active(AttentionState(device)) as astate, trace_environment("cpu", setup, model_types(config)):
            notes: list[str] = ["trace_fsdp2_fake_pg"]
            model, cfg = build_model(config, setup, notes)
            _shard(model, cfg, setup, mesh)
            result = _run(model, cfg, setup, steps, device, astate)
    finally:
        dist.destroy_process_group()
    result.attention_kernels = dict(astate.choices)
    result.notes = notes + result.notes
    result.setup = setup.to_dict()
    result.seconds = time.perf_counter() - t0
    return result


def _shard(model: Any, cfg: Any, setup: TrainingSetup, mesh: Any) -> None:
    """``fully_shard`` each decoder layer, then the root (embeddings, final norm, lm_head)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if setup.param_dtype != "none":
        mp = MixedPrecisionPolicy(param_dtype=getattr(torch, _DTYPES[setup.param_dtype]))
    for layer in decoder_layers(model, cfg):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)


def _local_tracker(setup: TrainingSetup) -> Any:
    """The allocation tracker, counting a DTensor by its local shard: the DTensor itself is a wrapper
    whose storage reports the global size and holds no memory of its own."""
    from cabe.trace.tracker import AllocationTracker

    class LocalTracker(AllocationTracker):
        def record(self, t: Any, op: str = "") -> int | None:
            return super().record(_local(t), op)

    tracker = LocalTracker(device_type="cpu", intercept=None)
    # a CPU run stands in for a GPU run: optimizer `step` counters are host tensors there
    tracker.host_scalars_in_optimizer = setup.resolved_optimizer_impl != "fused"
    return tracker


@contextlib.contextmanager
def _storage_resizes(tracker: Any) -> Iterator[None]:
    """FSDP2 frees a unit's all-gathered parameters by shrinking their storage in place and gathers into it again
    by growing it (torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param.py:1066-1074, ``free_storage`` /
    ``alloc_storage``: ``untyped_storage().resize_``): no tensor op the dispatch mode sees, and the storage object
    lives on. Without this each unit's gathered parameters stayed counted from their first gather on (a 4-layer
    llama's rank 0: every layer's bf16 gather alive at the loss's backward, not one)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    alloc0, free0 = _fsdp_param.alloc_storage, _fsdp_param.free_storage

    def free_storage(tensor: Any) -> None:
        tracker.release(tensor)
        free0(tensor)

    def alloc_storage(tensor: Any) -> None:
        alloc0(tensor)
        tracker.record(tensor, "fsdp_all_gather")

    _fsdp_param.alloc_storage, _fsdp_param.free_storage = alloc_storage, free_storage
    _fsdp_param_group.alloc_storage = alloc_storage
    try:
        yield
    finally:
        _fsdp_param.alloc_storage, _fsdp_param.free_storage = alloc0, free0
        _fsdp_param_group.alloc_storage = alloc0


def _local(p: Any) -> Any:
    return p.to_local() if hasattr(p, "to_local") else p


def _run(model: Any, cfg: Any, setup: TrainingSetup, steps: int, device: Any, astate: Any) -> TraceResult:
    """Materialise the sharded model under the tracker (FSDP2's own ``to_empty`` path: each rank allocates
    its padded shard), then the steps of :func:`cabe.trace.step.train`."""
    from cabe.trace.step import fill_random, train

    tracker = _local_tracker(setup)
    with tracker, _storage_resizes(tracker):
        tracker.set_phase("setup")
        model.to_empty(device=device)
        fill_random(model)
        for p in model.parameters():
            tracker.tag_tensor(_local(p), "weights")
        for b in model.buffers():
            tracker.tag_tensor(b, "weights")
        tracker.weight_keys = {_local(p).untyped_storage()._cdata for p in model.parameters()}
        n_params = sum(p.numel() for p in model.parameters())
        trainable = [p for p in model.parameters() if p.requires_grad]
        if not trainable:
            raise ConfigError("nothing_to_train", "method", method=setup.method)
        result = train(model, cfg, setup, steps, device, tracker, trainable, "cpu", {})
    result.parameters = n_params
    result.trainable_parameters = sum(p.numel() for p in trainable)
    result.mode = "cpu-fsdp2"
    return result
