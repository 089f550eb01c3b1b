"""Rank 0 of a DeepSpeed ZeRO-1/2/3 job, traced in one process: ``deepspeed.initialize`` on PyTorch's fake group.

DeepSpeed runs on a fake process group as FSDP2 and DDP do (:mod:`cabe.trace.distributed`): ``deepspeed.comm``
wraps a ``torch.distributed`` group that is already initialised (DeepSpeed 0.19.8 comm/comm.py:878-880,
``init_distributed``: "The user initialized torch.dist themselves, create cdb and short-circuit"), and its CPU
accelerator (accelerator/cpu_accelerator.py) has no streams, no pinned memory and no kernels to build. The engine
is DeepSpeed's own: its ZeRO optimizer flattens the 16-bit parameters (stage 1/2 ``bit16_groups_flat``), keeps
rank 0's fp32 partition and its optimizer state, fills its ``reduce_bucket_size`` gradient buffers (``ipg_buffer``)
in backward, and under stage 3 partitions every parameter and gathers a submodule (and its prefetch) while it runs.

The model is handed over as ``from_pretrained`` leaves it without ``zero.Init``: whole, on the host, in the stored
dtype; DeepSpeed casts it to its 16-bit dtype (engine.py:2080-2088, ``_cast_module_mixed_precision``) and moves it
to the device (engine.py:2093-2094) under the tracker. Its optimizer is the setup's torch optimizer, the client
optimizer DeepSpeed wraps (transformers' Trainer passes its own when the DeepSpeed config names none); DeepSpeed's
FusedAdam and CPUAdam are kernels a CPU build lacks.

Two kinds of run, as for FSDP2: ``cpu`` (real CPU tensors on DeepSpeed's CPU accelerator: the exactness reference,
tiny models) and ``fake`` (FakeTensorMode on the fake CUDA device: DeepSpeed's CPU accelerator with its device
named ``cuda``, see :class:`_FakeCudaAccelerator`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from cabe.errors import ConfigError
from cabe.trace import state
from cabe.trace.build import build_model
from cabe.trace.family_patches import model_types
from cabe.trace.modes import finish
from cabe.trace.patches import _Patch, trace_environment
from cabe.trace.result import TraceResult
from cabe.training import TrainingSetup

#: the engine each ``shard`` runs, as the report names it
ENGINES = {"zero1": "DeepSpeed ZeRO stage 1", "zero2": "DeepSpeed ZeRO stage 2", "zero3": "DeepSpeed ZeRO stage 3"}


def available() -> bool:
    """Whether DeepSpeed is installed (it is an optional dependency: the trace of ZeRO needs it)."""
    return importlib.util.find_spec("deepspeed") is not None


def ds_config(setup: TrainingSetup) -> dict[str, Any]:
    """The DeepSpeed config of the setup: its stage with DeepSpeed's defaults (the buckets of
    :class:`cabe.parallel.config.ShardConfig`), ``bf16`` / ``fp16`` for the engine's mixed precision."""
    half = setup.param_dtype if setup.param_dtype != "none" else None
    return {
        "train_micro_batch_size_per_gpu": setup.batch,
        "gradient_accumulation_steps": min(setup.grad_accum, 2),
        "zero_optimization": {"stage": int(setup.shard[-1])},
        "bf16": {"enabled": half == "bf16"},
        "fp16": {"enabled": half == "fp16"},
        "steps_per_print": 2**31 - 1,
    }


def trace(config: dict[str, Any], setup: TrainingSetup, steps: int, kind: str) -> TraceResult:
    """Rank 0 of ``setup.gpus`` GPUs running DeepSpeed ZeRO ``setup.shard`` (``kind``: ``fake`` or ``cpu``)."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from cabe.trace.state import AttentionState
    from cabe.trace.streams import streams

    if setup.shard not in ENGINES:
        raise ConfigError("mode_unsupported", "shard", mode=setup.shard, why="one_fsdp_group")
    if kind not in ("fake", "cpu"):
        raise ConfigError("mode_unsupported", "mode", mode=kind, why="distributed_meta")
    if dist.is_initialized():
        raise ConfigError("mode_unsupported", "mode", mode=kind, why="process_group")
    t0 = time.perf_counter()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=setup.gpus)
    device = torch.device("cuda" if kind == "fake" else "cpu")
    try:
        with (
            state.active(AttentionState(device)) as astate,
            trace_environment(kind, setup, model_types(config)),
            streams(kind),
            _deepspeed(kind, setup.gpus),
        ):
            notes: list[str] = ["trace_parallel_fake_pg"]
            model, cfg = build_model(config, setup, notes)
            result, engine = _run(model, cfg, setup, steps, kind, device, astate)
    finally:
        _destroy()
    return finish(result, setup, engine, notes, astate, t0)


def _run(
    model: Any, cfg: Any, setup: TrainingSetup, steps: int, kind: str, device: Any, astate: Any
) -> tuple[TraceResult, dict[str, Any]]:
    """The model on the host, ``deepspeed.initialize`` under the tracker, the steps through the engine."""
    import deepspeed

    from cabe.trace.inputs import make_optimizer
    from cabe.trace.modes import fake_mode, tracker
    from cabe.trace.step import fill_random, materialize, train

    rank0 = tracker(setup, kind, device, astate, None)
    with fake_mode(kind):
        # the copy from_pretrained leaves, outside the tracker: on the host in a GPU run, where DeepSpeed casts it and
        # moves it (its ``module.to(device)`` cannot move a fake CPU tensor to the fake CUDA device: it is made there)
        materialize(model, device)
        if kind == "cpu":
            fill_random(model)
        with rank0:
            rank0.set_phase("setup")
            if kind == "cpu":  # (host and device are one here: the loaded model is rank 0's until DeepSpeed casts it)
                for p in model.parameters():
                    rank0.tag_tensor(p, "weights")
            n_params = sum(p.numel() for p in model.parameters())
            trainable = [p for p in model.parameters() if p.requires_grad]
            if not trainable:
                raise ConfigError("nothing_to_train", "method", method=setup.method)
            n_trainable = sum(p.numel() for p in trainable)
            client = make_optimizer(trainable, setup, rank0, kind, model)
            engine, zero, _, _ = deepspeed.initialize(model=model, optimizer=client, config=ds_config(setup))
            _tag_states(engine, zero, rank0)
            _tag_buckets(zero, rank0)
            result = train(_Engine(engine), cfg, setup, steps, device, rank0, [], kind, {}, optimizer=_Step(engine))
    result.parameters = n_params
    result.trainable_parameters = n_trainable
    result.mode = f"{kind}-{setup.shard}"
    info = {
        "engine": ENGINES[setup.shard],
        "engine_version": deepspeed.__version__,
        "optimizer": type(zero).__name__,
        "world_size": setup.gpus,
        "rank": 0,
        "process_group": "fake",
        "zero_init": False,
    }
    return result, info


def _tag_states(engine: Any, zero: Any, rank0: Any) -> None:
    """Rank 0's 16-bit module (stage 1/2: the flat buffer its parameters are views of; stage 3: their partitions,
    ``ds_tensor``, and the persistent whole ones) as weights, its fp32 partitions (stage_1_and_2.py
    ``single_partition_of_fp32_groups``, stage3.py ``fp32_partitioned_groups_flat``) as weight copies and stage 3's
    flat gradient partitions (stage3.py ``grad_partitions_flat_buffer``) as gradients."""
    for p in engine.module.parameters():
        rank0.tag_tensor(getattr(p, "ds_tensor", None), "weights")
        if p.numel():
            rank0.tag_tensor(p, "weights")
    for b in engine.module.buffers():
        rank0.tag_tensor(b, "weights")
    for t in getattr(zero, "single_partition_of_fp32_groups", []) + getattr(zero, "fp32_partitioned_groups_flat", []):
        rank0.tag_tensor(t, "weight_copies")
    rank0.tag_tensor(getattr(zero, "grad_partitions_flat_buffer", None), "gradients")


def _tag_buckets(zero: Any, rank0: Any) -> None:
    """The ``reduce_bucket_size`` gradient buffers as gradients: stage 3 makes them once (stage3.py
    ``ipg_buckets[dtype].buffer``), stages 1/2 at every backward's start (stage_1_and_2.py ``setup_buckets``: one,
    or two with ``overlap_comm``); the wrapper tags what ``setup_buckets`` made and does nothing else."""
    for bucket in getattr(zero, "ipg_buckets", {}).values():
        rank0.tag_tensor(bucket.buffer if not isinstance(bucket.buffer, list) else None, "gradients")
    setup_buckets = getattr(zero, "setup_buckets", None)
    if setup_buckets is None:
        return

    def tagged() -> None:
        setup_buckets()
        for bucket in zero.ipg_buckets.values():
            for buf in bucket.buffer:
                rank0.tag_tensor(buf, "gradients")

    zero.setup_buckets = tagged


class _Engine:
    """The DeepSpeed engine seen as the model (its module's ``config``, ``get_output_embeddings``...) while calls go
    through the engine (its forward registers the backward hooks that run ZeRO's prologue and epilogue)."""

    def __init__(self, engine: Any) -> None:
        self.__dict__["_engine"] = engine

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._engine(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine.module, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._engine.module, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._engine.module, name)


class _Step:
    """The engine's ``step()`` (the ZeRO optimizer's step, then its ``zero_grad``) where the trace steps its
    optimizer; ``state`` is the client optimizer's, on rank 0's fp32 partitions."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def step(self) -> None:
        self.engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass  # (the engine's step has zeroed them: engine.py ``_take_model_step``)

    @property
    def state(self) -> Any:
        zero = self.engine.optimizer
        return getattr(zero, "optimizer", zero).state


def _fake_cuda_accelerator() -> Any:
    """DeepSpeed's CPU accelerator with its device named ``cuda`` (see :class:`_FakeCudaAccelerator`)."""
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    class _FakeCudaAccelerator(CPU_Accelerator):
        """Where the engine puts its tensors: on the fake CUDA device. Everything else is the CPU accelerator's:
        no streams (a fake group's collectives are done when they return), no pinned memory, no kernels."""

        def device_name(self, device_index: Any = None) -> str:
            return "cuda" if device_index is None else f"cuda:{device_index}"

        def current_device_name(self) -> str:
            return "cuda:0"

        def current_device(self) -> int:
            return 0

    return _FakeCudaAccelerator()


@contextlib.contextmanager
def _deepspeed(kind: str, world: int) -> Iterator[None]:
    """DeepSpeed's environment for rank 0: its accelerator, the launcher's variables, no shared-memory op."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed  # noqa: F401
    import deepspeed.accelerator.real_accelerator as real

    comm_torch = sys.modules["deepspeed.comm.torch"]
    p = _Patch()
    saved_env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE")}
    try:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world), LOCAL_SIZE="1")
        # what DeepSpeed replaces for the whole process and leaves so ("This will persist unless manually reset"):
        # ZeRO-3's memory-efficient linear (runtime/zero/partition_parameters.py:412-419, ``torch.nn.functional.linear
        # = zero3_linear_wrap``) and torch.manual_seed: put back after the trace, so the next trace in this process
        # runs PyTorch's own (a later single-GPU trace lost autocast's weight copies without it)
        import torch

        p.set(torch.nn.functional, "linear", torch.nn.functional.linear)
        p.set(torch, "manual_seed", torch.manual_seed)
        accelerator = _fake_cuda_accelerator() if kind == "fake" else None
        if accelerator is None:
            from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

            accelerator = CPU_Accelerator()
        p.set(real, "ds_accelerator", accelerator)
        # the CPU accelerator's shared-memory all-reduce (comm/torch.py:47-53, ``build_shm_op``, a C++ op compiled
        # on first use) serves inference_all_reduce between processes of one host: host memory, never a training step
        p.set(comm_torch, "build_shm_op", lambda: None)
        if kind == "fake":
            from deepspeed.runtime.engine import DeepSpeedEngine

            configure = DeepSpeedEngine._configure_distributed_model

            def on_the_device(engine: Any, model: Any) -> None:
                # the model is made on the fake device (see _run), where engine.py:2093-2094's ``module.to(device)``
                # has nothing to move; nn.Module._apply swaps a FakeTensor parameter even then, which fails for the
                # parameters the client optimizer holds: the engine's own switch to skip the move
                engine.dont_change_device = True
                configure(engine, model)

            p.set(DeepSpeedEngine, "_configure_distributed_model", on_the_device)
            # ZeRO-3 checks once that every rank recorded the same submodule and parameter order
            # (partitioned_param_coordinator.py:258-267, ``reset_step``: a broadcast of a few ints read back on the
            # host, zero/utils.py:80-91): fake tensors hold no value to read, and every rank is rank 0's here
            coordinator = sys.modules["deepspeed.runtime.zero.partitioned_param_coordinator"]
            p.set(coordinator, "assert_ints_same_as_other_ranks", lambda ints: None)
        yield
    finally:
        p.restore()
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _destroy() -> None:
    """The group destroyed through ``deepspeed.comm`` (which forgets its cached groups, utils/groups.py
    ``_release_process_group_references``), then its wrapper forgotten: the next trace starts as a new process."""
    import torch.distributed as dist

    if "deepspeed.comm.comm" in sys.modules:
        comm: Any = sys.modules["deepspeed.comm.comm"]
        if comm.cdb is not None and dist.is_initialized():
            comm.destroy_process_group()
        comm.cdb = None
    if dist.is_initialized():
        dist.destroy_process_group()
