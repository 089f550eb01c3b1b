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
from cabe.trace import context_parallel, expert_parallel, fsdp_wrap, offload, sequence_parallel, state, zero
from cabe.trace.build import build_model
from cabe.trace.family_patches import model_types
from cabe.trace.modes import finish
from cabe.trace.patches import _Patch, trace_environment
from cabe.trace.result import TraceResult
from cabe.trace.streams import streams
from cabe.training import TrainingSetup

#: the engine each ``shard`` runs, as the report names it
ENGINES = {
    "fsdp": "FSDP2 fully_shard",
    "fsdp-hybrid": "FSDP2 fully_shard, 2-D mesh (HSDP)",
    "ddp": "DistributedDataParallel",
    "none": "DistributedDataParallel",
}
#: the largest world traced: FSDP2 chunks every parameter into a view per rank (torch.chunk), so the set-up grows
#: with the world; rank 0 of a 1,024-GPU job is the largest the differential has asked for (64 is its usual top)
MAX_WORLD = 1024
#: the optimizers whose step runs on FSDP2's DTensor parameters (torch.optim's, every implementation)
DTENSOR_OPTIMIZERS = ("adamw", "sgd", "sgd-momentum", "rmsprop")


def refusal(setup: TrainingSetup, config: dict[str, Any] | None = None) -> None:
    """What rank 0 of the real engine cannot be traced for here: one sentence each, naming the field (with the
    model's ``config``, what its tensor-parallel plan cannot cut too)."""
    if config is not None and setup.tp > 1:
        _tp_refusal(config, setup.tp)
    context_parallel.refusal(setup)
    if setup.shard in ("zero1", "zero2", "zero3") and not zero.available():
        # DeepSpeed's engine runs on the fake group (cabe.trace.zero) when DeepSpeed is installed: an optional extra
        raise InvalidValueError("trace_parallel_unsupported", "shard", value=setup.shard, why="deepspeed")
    if setup.shard in ("zero1", "zero2", "zero3") and "fp16" in (setup.dtype, setup.param_dtype):
        # DeepSpeed's fp16 training scales the loss inside ``engine.backward`` and refuses a plain backward ("Loss
        # scaling is required for this configuration", runtime/engine.py); the trace runs the step's own backward
        raise InvalidValueError("trace_parallel_unsupported", "shard", value=setup.shard, why="deepspeed_fp16")
    if setup.gpus > MAX_WORLD:
        raise InvalidValueError("trace_parallel_unsupported", "gpus", value=setup.gpus, why="world", maximum=MAX_WORLD)
    if setup.tp > 1 and setup.gpus > setup.tp and setup.shard not in ("fsdp", "fsdp-hybrid"):
        # DDP wraps plain tensors: tensor parallelism's DTensor parameters take FSDP2 (or no data parallelism)
        raise InvalidValueError("trace_parallel_unsupported", "tp", value=setup.tp, why="tp_ddp")
    if setup.tp > 1 and setup.resolved_loss != "hf":
        # the chunked losses multiply the hidden states by the lm_head's weight themselves (torchtune's, LitGPT's),
        # outside the module whose forward TP wraps: a plain tensor times a DTensor, which DTensor refuses
        raise InvalidValueError("trace_parallel_unsupported", "loss", value=setup.resolved_loss, why="tp_loss")
    if setup.tp > 1 and setup.autocast == "fp16":
        # the GradScaler unscales every gradient in one foreach call, TP's DTensor ones beside the plain ones
        # ("_amp_foreach_non_finite_check_and_unscale_ got mixed torch.Tensor and DTensor": a real run fails too)
        raise InvalidValueError("trace_parallel_unsupported", "autocast", value="fp16", why="tp_scaler")
    if setup.tp > 1 and setup.method not in ("full", "freeze"):
        # transformers' TP styles replace the forward of the nn.Linear its plan names; PEFT's adapters wrap that
        # module and add their own full-width output to its sharded one (no TP plan covers an adapter)
        raise InvalidValueError("trace_parallel_unsupported", "method", value=setup.method, why="tp_adapters")
    if setup.pp > 1:
        raise InvalidValueError("trace_parallel_unsupported", "pp", value=setup.pp, why="pp")
    expert_parallel.refusal(setup, config)  # transformers' EP (cabe.trace.expert_parallel)
    if setup.offload != "none" and not offload.offloads(setup):
        raise InvalidValueError("trace_parallel_unsupported", "offload", value=setup.offload, why=offload.why(setup))
    if setup.method == "qlora":
        # FSDP-QLoRA shards bitsandbytes' packed weights stored as bf16 (bnb_4bit_quant_storage): not built here
        raise InvalidValueError("trace_parallel_unsupported", "method", value=setup.method, why="qlora")
    if setup.images:
        raise InvalidValueError("trace_parallel_unsupported", "images", value=setup.images, why="images")
    dtensors = setup.shard in ("fsdp", "fsdp-hybrid") or setup.tp > 1
    if dtensors and setup.optimizer not in DTENSOR_OPTIMIZERS:
        # FSDP2's parameters are DTensors: bitsandbytes' fused updates have no DTensor sharding rule
        # ("optimizer_update_32bit does not have a sharding strategy registered") and transformers' Adafactor's in-place
        # row / column factors change a gradient's placement (DTensor refuses): a real FSDP2 run fails the same way
        raise InvalidValueError("trace_parallel_unsupported", "optimizer", value=setup.optimizer, why="dtensor")
    if setup.tp > 1 and setup.shard not in ("fsdp", "fsdp-hybrid") and setup.resolved_optimizer_impl != "for-loop":
        # TP alone leaves the parameters its plan does not name (the norms) plain tensors beside its DTensors, and
        # torch.optim's foreach / fused steps take them in one list: "aten._foreach_mul_.Scalar got mixed
        # torch.Tensor and DTensor" (a real run fails the same way; FSDP2 makes every parameter a DTensor)
        raise InvalidValueError(
            "trace_parallel_unsupported", "optimizer_impl", value=setup.resolved_optimizer_impl, why="tp_mixed"
        )


def _tp_refusal(config: dict[str, Any], tp: int) -> None:
    """transformers' TP plan on this model: it has one, and it can split the key / value heads (``colwise`` cuts
    k_proj and v_proj by output features, so each GPU needs whole heads: Megatron replicates them when there are
    fewer than ``tp``, transformers does not)."""
    from cabe.trace.build import hf_config

    text = hf_config(config)
    text = text.get_text_config() if hasattr(text, "get_text_config") else text
    if not getattr(text, "base_model_tp_plan", None):
        raise InvalidValueError("trace_parallel_unsupported", "tp", value=tp, why="tp_plan")
    partial = _partial_plan(text)
    if partial:
        raise InvalidValueError("trace_parallel_unsupported", "tp", value=tp, why="tp_plan_partial", parts=partial)
    kv = int(getattr(text, "num_key_value_heads", None) or getattr(text, "num_attention_heads", 0) or 0)
    if kv % tp:
        raise InvalidValueError("trace_parallel_unsupported", "tp", value=tp, why="tp_kv_heads", heads=kv)


def _tp_alone_loop(setup: TrainingSetup) -> TrainingSetup:
    """TP alone with an optimizer whose memory does not depend on its implementation (SGD, RMSprop: cabe reads no
    ``optimizer_impl`` for them): its step runs one tensor at a time, as a real run must (torch.optim's foreach
    step refuses TP's DTensors beside the plain norms: :func:`refusal`'s ``tp_mixed``)."""
    from cabe import optimizer

    if setup.tp == 1 or setup.shard != "none" or setup.optimizer_impl is not None:
        return setup
    entry = optimizer.get(setup.optimizer) if setup.optimizer in optimizer.OPTIMIZERS else None
    if entry is None or entry.temporaries or entry.impl_flags:
        return setup
    return setup.with_(optimizer_impl="for-loop")


def _partial_plan(text: Any) -> str:
    """What transformers' TP plan leaves whole on every GPU where cabe's TP (Megatron's cut, :mod:`cabe.parallel`)
    splits it: a layer's projections it gathers (``colwise_gather_output`` / ``rowwise_split_input``: Phi-3's fused
    ones), a model whose plan names no layer projection (gpt-oss: the embedding only), experts (transformers shards
    them by expert parallelism, ``ep_plan``, not TP), state-space mixers (no plan entry). Empty when it splits what
    cabe splits; the trace of the others would measure a different cut, not the estimate's."""
    plan = dict(getattr(text, "base_model_tp_plan", None) or {})
    layer = {k: v for k, v in plan.items() if k.startswith("layers.")}
    parts = []
    if any(v in ("colwise_gather_output", "rowwise_split_input") for v in layer.values()):
        parts.append("gathered projections")
    if not any(v == "colwise" for v in layer.values()):
        parts.append("attention and MLP")
    if getattr(text, "num_local_experts", 0) or getattr(text, "num_experts", 0) or getattr(text, "n_routed_experts", 0):
        parts.append("experts")
    if any("mamba" in str(t) or "linear_attention" in str(t) for t in getattr(text, "layer_types", None) or ()):
        parts.append("state-space / linear-attention layers")
    return ", ".join(parts)


def trace(config: dict[str, Any], setup: TrainingSetup, steps: int, kind: str) -> TraceResult:
    """Rank 0 of ``setup.gpus`` GPUs running the setup's engine (``kind``: ``fake`` or ``cpu``)."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from cabe.trace.state import AttentionState

    setup = _tp_alone_loop(setup)
    refusal(setup, config)
    if kind not in ("fake", "cpu"):
        raise ConfigError("mode_unsupported", "mode", mode=kind, why="distributed_meta")
    if setup.shard in zero.ENGINES:
        return zero.trace(config, setup, steps, kind)
    if kind == "cpu" and offload.offloads(setup):
        # a CPU run has no device to tell the host from, and pinned memory needs an accelerator (torch refuses
        # ``pin_memory()`` on a CPU-only build): the offload is traced on the fake device only
        raise InvalidValueError("trace_parallel_unsupported", "offload", value=setup.offload, why="offload_cpu_run")
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
            streams(kind),
        ):
            notes: list[str] = ["trace_parallel_fake_pg"]
            model, cfg = build_model(config, setup, notes)
            result, engine = _run(model, cfg, setup, steps, kind, device, astate)
    finally:
        dist.destroy_process_group()
    return finish(result, setup, engine, notes, astate, t0)


def _run(
    model: Any, cfg: Any, setup: TrainingSetup, steps: int, kind: str, device: Any, astate: Any
) -> tuple[TraceResult, dict[str, Any]]:
    """Wrap the model as the engine does, materialise rank 0's share under the tracker, run the steps."""
    import torch

    from cabe.trace.modes import fake_mode, tracker
    from cabe.trace.step import fill_random, materialize, train

    fsdp = setup.shard in ("fsdp", "fsdp-hybrid")
    tp = setup.tp > 1
    # (outside the fake mode: the mesh's coordinates are real, and TP's DTensors of the ``meta`` model stay on meta,
    # where under the fake mode distribute_tensor would give them fake CPU shards FSDP2 refuses to move)
    mesh: Any = _mesh(setup, device.type) if (fsdp or tp) and setup.cp == 1 else None
    # (the data-parallel submesh sliced here too: a slice made in the fake mode computes rank 0's coordinate on fake
    # tensors, finds none, and DTensor then treats rank 0 as outside the mesh: empty host shards)
    dp_mesh = _dp_mesh(setup, mesh) if fsdp and mesh is not None else None
    cp_mesh = None
    if setup.cp > 1:  # FSDP2 over dp_shard × cp, the ring over cp (cabe.trace.context_parallel)
        mesh, cp_mesh = context_parallel.mesh(setup, device.type)
        dp_mesh = mesh
    engine: dict[str, Any] = {}
    experts: Any = None  # (expert parallelism: transformers' ep_plan on its own meshes, as TP outside the fake mode)
    if setup.ep > 1:
        ep_mesh, efsdp, tp_mesh = expert_parallel.meshes(setup, device.type)
        experts = (expert_parallel.apply(model, ep_mesh, tp_mesh), efsdp)
    if tp:  # (sequence parallelism: torch's own styles, as torchtitan applies them: cabe.trace.sequence_parallel)
        engine = (sequence_parallel.apply if setup.sequence_parallel else _tensor_parallel)(model, mesh["tp"], setup)
    rank0 = tracker(setup, kind, device, astate, None)
    rank0.host = offload.host_tally(setup, rank0)
    rank0.local = _local  # a DTensor is counted by its local shard: the wrapper holds no memory of its own
    with fake_mode(kind), rank0, _storage_resizes(rank0), _real_mesh_coordinates(), offload.pinned_host(kind, setup):
        rank0.set_phase("setup")
        if fsdp:
            engine = _fully_shard(model, cfg, setup, mesh, dp_mesh, engine, experts)
        if fsdp or tp:
            offload.to_empty(
                model, setup, device
            )  # each rank allocates its own shards (FSDP2's padded ones, TP's DTensors)
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
        if not fsdp and not tp:
            model, engine = _ddp(model, device)
        with (
            _loss_context(setup, rank0),
            expert_parallel.balanced_exchange(setup.ep > 1),
            _context(model, setup, cp_mesh, rank0, engine),
        ):
            result = train(model, cfg, setup, steps, device, rank0, trainable, kind, {})
    result.parameters = n_params
    result.trainable_parameters = sum(p.numel() for p in trainable)
    result.mode = f"{kind}-{setup.shard if setup.shard != 'none' else ('tp' if tp else 'ddp')}"
    if tp and not fsdp:
        engine = {"engine": "tensor parallel (DTensor)", "wrapping": "no data parallelism", **engine}
        engine["mesh"] = list(mesh.shape)
    engine.update(engine_version=torch.__version__, world_size=setup.gpus, rank=0, process_group="fake")
    return result, engine


def _mesh(setup: TrainingSetup, device_type: str) -> Any:
    """The device mesh: the N GPUs (FSDP), or (nodes, GPUs per node) with dims replicate and shard (HSDP); with
    tensor parallelism a last dimension ``tp`` of ``setup.tp`` GPUs (inside a node, as Megatron and torchtitan lay
    it out) and the data-parallel dimensions over the rest. Index it with :func:`_dp_mesh` / ``mesh["tp"]``."""
    from torch.distributed.device_mesh import init_device_mesh

    tp = setup.tp
    dims: tuple[int, ...]
    names: tuple[str, ...]
    if setup.shard == "fsdp-hybrid":
        per = min(setup.gpus_per_node, setup.gpus)
        dims, names = (setup.gpus // per, per // tp), ("replicate", "shard")
    elif setup.shard == "fsdp":
        dims, names = (setup.gpus // tp,), ("shard",)
    else:
        dims, names = (), ()
    if tp > 1:
        dims, names = (*dims, tp), (*names, "tp")
    return init_device_mesh(device_type, dims, mesh_dim_names=names)


def _dp_mesh(setup: TrainingSetup, mesh: Any) -> Any:
    """The data-parallel part of :func:`_mesh`'s mesh (FSDP2 shards over it)."""
    if setup.tp == 1:
        return mesh
    return mesh[("replicate", "shard")] if setup.shard == "fsdp-hybrid" else mesh["shard"]


def _tensor_parallel(model: Any, mesh: Any, setup: TrainingSetup) -> dict[str, Any]:
    """transformers' own tensor parallelism on ``mesh``: the model's TP plan (its config's ``base_model_tp_plan``
    and the head's ``_tp_plan``, the vocabulary-sharded input embedding that ``init_parallel_plans`` adds), applied
    as ``from_pretrained(distributed_config=DistributedConfig(tp_size=K))`` does (transformers 5.25
    distributed/mixin.py ``maybe_distribute_model`` -> tensor_parallel.py ``apply_tensor_parallelism``): each named
    parameter a DTensor sharded on the mesh, each named module's forward wrapped to redistribute its input and
    output (column-wise: the output's last dimension sharded; row-wise: a partial sum all-reduced).

    The lm_head: transformers' ``colwise_gather_output`` gathers the logits whole on every GPU
    (``--no-loss-parallel``); with ``loss_parallel`` (the default) it keeps them sharded over the vocabulary as a
    DTensor (``ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)``, torchtitan's
    ``parallelize_llama``) and the loss runs inside torch's ``loss_parallel()`` (:func:`_loss_context`)."""
    from torch.distributed.tensor import Replicate, Shard
    from transformers.distributed.tensor_parallel import ColwiseParallel, apply_tensor_parallelism

    base = getattr(model, "tp_plan", None)
    if not base:
        raise InvalidValueError("trace_parallel_unsupported", "tp", value=setup.tp, why="tp_plan")
    params = dict(model.named_parameters())  # (a tied lm_head's weight is the embedding's: listed once)
    plan = {
        k: v
        for k, v in model._expand_parallel_plan(dict(base)).items()
        if k in params or not k.endswith((".weight", ".bias"))
    }
    modules = dict(model.named_modules())
    heads = {n for n, style in plan.items() if style == "colwise_gather_output" and n in modules}
    heads = heads if setup.loss_parallel else set()
    apply_tensor_parallelism(
        model, mesh, {k: v for k, v in plan.items() if k.rpartition(".")[0] not in heads and k not in heads}
    )
    sharded = ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False)
    config = model.config.get_text_config()
    for name in heads:  # (as apply_tensor_parallelism does for each entry: the parameters, then the module)
        module = model.get_submodule(name)
        for param in list(module._parameters):
            sharded.shard_param(module, param, mesh, config=config)
        sharded.install_forward(module, mesh, config=config)
    if getattr(model.config, "tie_word_embeddings", False):
        # each style made its own DTensor parameter: transformers ties them again once the weights are loaded
        # (modeling_utils ``_finalize_model_loading``), and so does the trace
        model.tie_weights()
    styles = sorted(
        set(plan.values()) - ({"colwise_gather_output"} if heads else set())
        | ({"colwise (loss_parallel)"} if heads else set())
    )
    return {
        "tensor_parallel": f"transformers' tp_plan ({', '.join(styles)})",
        "tp": setup.tp,
        "loss_parallel": bool(heads),
    }


@contextlib.contextmanager
def _context(model: Any, setup: TrainingSetup, cp_mesh: Any, rank0: Any, engine: dict[str, Any]) -> Iterator[None]:
    """torch's context parallelism around the steps when the setup asks for it (cabe.trace.context_parallel)."""
    if cp_mesh is None:
        yield
        return
    with context_parallel.active(model, setup, cp_mesh, rank0) as info:
        engine.update(info)
        yield


@contextlib.contextmanager
def _loss_context(setup: TrainingSetup, rank0: Any) -> Iterator[None]:
    """torch's ``loss_parallel()`` around the step when the logits stay sharded: its cross-entropy (log-softmax and
    NLL forward and backward on the vocabulary shards, torch 2.13 distributed/tensor/parallel/loss.py) takes the
    DTensor logits.

    Its handlers compute on the local shards inside DTensor's dispatch, where the tracker (a dispatch mode, off the
    mode stack while it runs the DTensor op) would see only their results, not the shifted logits and exponentials
    they make on the way (``_log_softmax``: ``x - x_max``, ``exp(shifted)``; the backward's ``zeros_like`` and
    ``exp``): each helper runs with the tracker pushed again, so those are counted as a GPU holds them."""
    if setup.tp == 1 or not setup.loss_parallel:
        yield
        return
    from torch.distributed.tensor.parallel import loss, loss_parallel

    def seen(fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            with rank0:
                return fn(*args, **kwargs)

        return run

    p = _Patch()
    try:
        for name in ("_log_softmax", "_nll_loss_forward", "_nll_loss_and_log_softmax_backward"):
            p.set(loss, name, seen(getattr(loss, name)))
        with loss_parallel():
            yield
    finally:
        p.restore()


def _fully_shard(
    model: Any, cfg: Any, setup: TrainingSetup, mesh: Any, dp: Any, tp: dict[str, Any], experts: Any = None
) -> dict[str, Any]:
    """FSDP2's units on the data-parallel part of ``mesh`` (with tensor parallelism, FSDP2 shards the TP shards: 2-D
    parallelism), cut as the request's ``fsdp_wrap`` says (:mod:`cabe.trace.fsdp_wrap`); under expert parallelism
    each experts module its own unit on the expert-FSDP mesh first, as transformers does before its layers."""
    mp, policy = fsdp_wrap.policies(setup)
    ep = {}
    if experts is not None:
        units = expert_parallel.shard_experts(model, experts[0], experts[1], setup, mp_policy=mp, offload_policy=policy)
        ep = expert_parallel.engine(setup, experts[0], units)
    wrapping = fsdp_wrap.apply(model, cfg, setup, dp, mp, policy)
    return {
        "engine": ENGINES[setup.shard] + (" + tensor parallel" if tp else ""),
        "wrapping": wrapping,
        "mesh": list(mesh.shape),
        "reshard_after_forward": setup.reshard_after_forward,
        "param_dtype": setup.param_dtype if setup.param_dtype != "none" else "as stored",
        **({"offload_policy": "CPUOffloadPolicy(pin_memory=True)"} if offload.offloads(setup) else {}),
        **tp,
        **ep,
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
def _real_mesh_coordinates() -> Iterator[None]:
    """A device mesh's coordinates computed on its real rank tensor, outside the fake mode: FSDP2 over tensor
    parallelism concatenates the data- and tensor-parallel meshes when it wraps a module (torch 2.13
    _fsdp_param.py ``_init_sharding_spec_tp`` -> device_mesh.py ``_concatenate``), whose rank tensor and ``(mesh == rank).nonzero()``
    a fake tensor cannot answer (its output's size depends on the data). Host-side bookkeeping: no device memory."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    real = DeviceMesh._concatenate

    def concatenate(meshes: Any) -> Any:
        with unset_fake_temporarily():
            return real(meshes)

    p = _Patch()
    try:
        p.set(DeviceMesh, "_concatenate", staticmethod(concatenate))
        yield
    finally:
        p.restore()


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
