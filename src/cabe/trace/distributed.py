"""Rank 0 of an N-GPU job, traced in one process: the real engine on PyTorch's fake process group.

``torch.testing._internal.distributed.fake_pg`` registers a ``"fake"`` backend whose collectives return at once
without touching data: with ``init_process_group("fake", rank=0, world_size=N)`` the engine's own code shards,
all-gathers, reduce-scatters, buckets and frees exactly as rank 0 of N would, and the allocation tracker sees rank
0's memory. The engines (:data:`ENGINES`):

* ``fsdp`` -- FSDP2 (``torch.distributed.fsdp.fully_shard``) on a 1-D mesh of the N GPUs; ``fsdp-hybrid`` -- the
  same on a 2-D mesh (replicate across nodes, shard within ``gpus_per_node``: HSDP). Each decoder layer is one unit
  and the root module another (the wrapping of torchtune, accelerate and transformers' ``fsdp_config``), with
  ``MixedPrecisionPolicy(param_dtype=setup.param_dtype)`` when the setup asks for the engine's mixed precision and
  FSDP2's default ``reshard_after_forward=True``.
* ``ddp`` (and ``none`` on several GPUs, read as DDP) -- ``torch.nn.parallel.DistributedDataParallel`` with its
  defaults (25 MiB buckets, ``gradient_as_bucket_view=False``): the C++ Reducer's buckets are allocated through the
  dispatcher, so the tracker sees them.

Two kinds of run: ``fake`` (FakeTensorMode on the fake CUDA device of :mod:`cabe.trace._native`: any model size,
the attention kernel CUDA would pick; CUDA streams and events, which a CPU-only build lacks and the collectives of a
fake group never need, are stand-ins that do nothing) and ``cpu`` (real CPU tensors: the exactness reference, tiny
models). What cannot be traced here is refused in one sentence (:func:`refusal`), never traced as one GPU.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from cabe.errors import ConfigError, InvalidValueError
from cabe.trace import state
from cabe.trace.build import build_model, decoder_layers
from cabe.trace.family_patches import model_types
from cabe.trace.patches import _Patch, trace_environment
from cabe.trace.result import TraceResult
from cabe.training import TrainingSetup

#: the engine each ``shard`` runs, as the report names it
ENGINES = {
    "fsdp": "FSDP2 fully_shard",
    "fsdp-hybrid": "FSDP2 fully_shard, 2-D mesh (HSDP)",
    "ddp": "DistributedDataParallel",
    "none": "DistributedDataParallel",
}
_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
#: the largest world traced: FSDP2 chunks every parameter into a view per rank (torch.chunk), so the set-up grows
#: with the world; rank 0 of a 1,024-GPU job is the largest the differential has asked for (64 is its usual top)
MAX_WORLD = 1024
#: the optimizers whose step runs on FSDP2's DTensor parameters (torch.optim's, every implementation)
DTENSOR_OPTIMIZERS = ("adamw", "sgd", "sgd-momentum", "rmsprop")


def refusal(setup: TrainingSetup) -> None:
    """What rank 0 of the real engine cannot be traced for here: one sentence each, naming the field."""
    if setup.shard in ("zero1", "zero2", "zero3"):
        # DeepSpeed's engine needs its accelerator (CUDA kernels it builds, its comm backend): no fake group runs it
        raise InvalidValueError("trace_parallel_unsupported", "shard", value=setup.shard, why="deepspeed")
    if setup.gpus > MAX_WORLD:
        raise InvalidValueError("trace_parallel_unsupported", "gpus", value=setup.gpus, why="world", maximum=MAX_WORLD)
    for name in ("tp", "pp", "ep"):
        if getattr(setup, name) > 1:
            raise InvalidValueError("trace_parallel_unsupported", name, value=getattr(setup, name), why=name)
    if setup.offload != "none":
        raise InvalidValueError("trace_parallel_unsupported", "offload", value=setup.offload, why="offload")
    if setup.method == "qlora":
        # FSDP-QLoRA shards bitsandbytes' packed weights stored as bf16 (bnb_4bit_quant_storage): not built here
        raise InvalidValueError("trace_parallel_unsupported", "method", value=setup.method, why="qlora")
    if setup.images:
        raise InvalidValueError("trace_parallel_unsupported", "images", value=setup.images, why="images")
    if setup.shard in ("fsdp", "fsdp-hybrid") and setup.optimizer not in DTENSOR_OPTIMIZERS:
        # FSDP2's parameters are DTensors: bitsandbytes' fused updates have no DTensor sharding rule
        # ("optimizer_update_32bit does not have a sharding strategy registered") and transformers' Adafactor's in-place
        # row / column factors change a gradient's placement (DTensor refuses): a real FSDP2 run fails the same way
        raise InvalidValueError("trace_parallel_unsupported", "optimizer", value=setup.optimizer, why="dtensor")


def trace(config: dict[str, Any], setup: TrainingSetup, steps: int, kind: str) -> TraceResult:
    """Rank 0 of ``setup.gpus`` GPUs running the setup's engine (``kind``: ``fake`` or ``cpu``)."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from cabe.trace.state import AttentionState

    refusal(setup)
    if kind not in ("fake", "cpu"):
        raise ConfigError("mode_unsupported", "mode", mode=kind, why="distributed_meta")
    t0 = time.perf_counter()
    if dist.is_initialized():
        raise ConfigError("mode_unsupported", "mode", mode=kind, why="process_group")
    world = setup.gpus
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    device = torch.device("cuda" if kind == "fake" else "cpu")
    try:
        with (
            state.active(AttentionState(device)) as astate,
            trace_environment(kind, setup, model_types(config)),
            _streams(kind),
        ):
            notes: list[str] = ["trace_parallel_fake_pg"]
            model, cfg = build_model(config, setup, notes)
            result, engine = _run(model, cfg, setup, steps, kind, device, astate)
    finally:
        dist.destroy_process_group()
    result.attention_kernels = dict(astate.choices)
    result.notes = notes + result.notes
    result.setup = setup.to_dict()
    result.engine = engine
    result.seconds = time.perf_counter() - t0
    return result


def _run(
    model: Any, cfg: Any, setup: TrainingSetup, steps: int, kind: str, device: Any, astate: Any
) -> tuple[TraceResult, dict[str, Any]]:
    """Wrap the model as the engine does, materialise rank 0's share under the tracker, run the steps."""
    import torch

    from cabe.trace.modes import fake_mode, tracker
    from cabe.trace.step import fill_random, materialize, train

    fsdp = setup.shard in ("fsdp", "fsdp-hybrid")
    mesh = _mesh(setup, device.type) if fsdp else None  # (outside the fake mode: the mesh's coordinates are real)
    rank0 = tracker(setup, kind, device, astate, None)
    rank0.local = _local  # a DTensor is counted by its local shard: the wrapper holds no memory of its own
    with fake_mode(kind), rank0, _storage_resizes(rank0):
        rank0.set_phase("setup")
        if fsdp:
            engine = _fully_shard(model, cfg, setup, mesh)
            model.to_empty(device=device)  # FSDP2's own: each rank allocates its padded shard
        else:
            materialize(model, device)
        if kind == "cpu":
            fill_random(model)
        for p in model.parameters():
            rank0.tag_tensor(p, "weights")
        for b in model.buffers():
            rank0.tag_tensor(b, "weights")
        rank0.weight_keys = {_local(p).untyped_storage()._cdata for p in model.parameters()}
        n_params = sum(p.numel() for p in model.parameters())
        trainable = [p for p in model.parameters() if p.requires_grad]
        if not trainable:
            raise ConfigError("nothing_to_train", "method", method=setup.method)
        if not fsdp:
            model, engine = _ddp(model, device)
        result = train(model, cfg, setup, steps, device, rank0, trainable, kind, {})
    result.parameters = n_params
    result.trainable_parameters = sum(p.numel() for p in trainable)
    result.mode = f"{kind}-{setup.shard if setup.shard != 'none' else 'ddp'}"
    engine.update(engine_version=torch.__version__, world_size=setup.gpus, rank=0, process_group="fake")
    return result, engine


def _mesh(setup: TrainingSetup, device_type: str) -> Any:
    """The device mesh: the N GPUs (FSDP), or (nodes, GPUs per node) with dims replicate and shard (HSDP)."""
    from torch.distributed.device_mesh import init_device_mesh

    if setup.shard == "fsdp-hybrid":
        per = min(setup.gpus_per_node, setup.gpus)
        return init_device_mesh(device_type, (setup.gpus // per, per), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (setup.gpus,))


def _fully_shard(model: Any, cfg: Any, setup: TrainingSetup, mesh: Any) -> dict[str, Any]:
    """``fully_shard`` each decoder layer, then the root (embeddings, final norm, lm_head), on ``mesh``."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if setup.param_dtype != "none":
        mp = MixedPrecisionPolicy(param_dtype=getattr(torch, _DTYPES[setup.param_dtype]))
    layers = decoder_layers(model, cfg)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return {
        "engine": ENGINES[setup.shard],
        "wrapping": f"fully_shard per decoder layer ({len(layers)} units) + root",
        "mesh": list(mesh.shape),
        "reshard_after_forward": True,
        "param_dtype": setup.param_dtype if setup.param_dtype != "none" else "as stored",
    }


def _ddp(model: Any, device: Any) -> tuple[Any, dict[str, Any]]:
    """``DistributedDataParallel(model)`` with its defaults, after the model is on the device (DDP broadcasts it)."""
    import torch.nn.parallel.distributed as ddp_module
    from torch.nn.parallel import DistributedDataParallel

    p = _Patch()
    try:
        # the parameters' shapes checked across ranks (an all-gather of their sizes read back on the host: no data on
        # fake tensors, and every rank is rank 0's here) and their first broadcast (init_sync): transient, before the
        # step, and what a fake group would not move anyway
        p.set(ddp_module, "_verify_param_shape_across_processes", lambda *a, **k: None)
        ids = [device.index or 0] if device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids, init_sync=False)
    finally:
        p.restore()
    # the fake group's all-reduce completes with no value, where the Reducer expects the bucket back: a hook that
    # does what the default one does to memory (torch 2.13 distributed/algorithms/ddp_comm_hooks/default_hooks.py,
    # ``allreduce_hook``: divides the bucket in place and all-reduces it in place, the future holding the bucket)
    ddp.register_comm_hook(None, _unannotated(_allreduce_in_place))
    # DDP's usage logger times the Reducer's work with a CUDA timer a CPU-only build has none of (c10d logger.cpp
    # asserts on it): its statistics are host-side logs, no device memory
    ddp.logger = _Silent()  # type: ignore[assignment]
    # Before the second forward the Reducer rebuilds its buckets once, in the order the gradients became ready, after
    # agreeing on that order with the other ranks (c10d reducer.cpp ``rebuild_buckets`` / ``sync_bucket_indices``:
    # a broadcast read back on the host, which fake tensors cannot give). The same gradients in buckets of the same
    # cap: the rebuilt buckets' total is the first ones'; the old and new ones overlap for a moment before that
    # forward, below the step's peak (its optimizer step holds gradients, buckets and the update's temporaries)
    ddp.reducer = _NoRebuild(ddp.reducer)
    engine = {
        "engine": ENGINES["ddp"],
        "wrapping": "the whole model",
        "bucket_cap_mb": 25,
        "gradient_as_bucket_view": False,
        "buckets_rebuilt": False,
    }
    return _Unwrapped(ddp), engine


def _allreduce_in_place(state: Any, bucket: Any) -> Any:
    import torch

    buffer = bucket.buffer()
    buffer.div_(torch.distributed.get_world_size())
    fut: Any = torch.futures.Future()
    fut.set_result(buffer)
    return fut


def _unannotated(hook: Any) -> Any:
    """``hook`` without annotations: DDP checks a hook's, and this module's are strings (``from __future__``)."""

    def bare(state, bucket):  # (no annotations: see above)
        return hook(state, bucket)

    return bare


class _NoRebuild:
    """The DDP Reducer, but for ``_rebuild_buckets`` (see :func:`_ddp`)."""

    def __init__(self, reducer: Any) -> None:
        self.__dict__["_reducer"] = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)


class _Silent:
    """Any method, doing nothing."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class _Unwrapped:
    """DDP's module seen as the model (``get_output_embeddings``, ``config``...) while calls go through DDP."""

    def __init__(self, ddp: Any) -> None:
        self.__dict__["_ddp"] = ddp

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._ddp(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ddp.module, name)

    def __setattr__(self, name: str, value: Any) -> None:  # (a loss kernel set on the model: on the module)
        setattr(self._ddp.module, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._ddp.module, name)


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


@contextlib.contextmanager
def _streams(kind: str) -> Iterator[None]:
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


def trace_fsdp2(config: dict[str, Any], setup: TrainingSetup, *, steps: int = 2) -> TraceResult:
    """Rank 0 of FSDP2 on real CPU tensors (the exactness reference of the fake-device run): :func:`trace`."""
    from cabe.trace.deps import import_deps
    from cabe.trace.modes import check_setup

    setup = check_setup(setup, config)
    if setup.shard != "fsdp" or setup.gpus < 2:
        raise ConfigError("mode_unsupported", "shard", mode="fsdp2", why="one_fsdp_group")
    import_deps(setup)
    return trace(config, setup, steps, "cpu")
