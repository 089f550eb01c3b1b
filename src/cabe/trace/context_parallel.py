"""Context parallelism traced with PyTorch's own ring attention on the fake group, as accelerate applies it.

accelerate 1.16 (accelerator.py ``_prepare_cp`` / ``maybe_context_parallel``, big_modeling.py
``_attach_context_parallel_hooks``) and torchtitan run ``torch.distributed.tensor.experimental.context_parallel``
(torch 2.13 _context_parallel/_attention.py) under FSDP2 sharded over the ``dp_shard × cp`` GPUs:

* the rotation is ``set_rotate_method(cp_impl)`` (``allgather``: the key / value shards gathered once;
  ``alltoall``: passed round the ring);
* the batch's ids, labels and positions are sharded over the sequence (``_context_parallel_buffers``: the head-tail
  load balancer when ``seq % (2 · cp) == 0``, as ``context_parallel`` creates it, then ``Shard(1)``): rank 0 runs
  s / cp tokens;
* ``F.scaled_dot_product_attention`` is wrapped to take its q, k, v as DTensors sharded on the sequence
  (``_enable_context_parallel_dispatcher_impl``), whose flash / efficient ops DTensor hands to the ring
  (``_sdpa_handler``); each attention module's mask is dropped and ``is_causal`` set (accelerate's hook).

The ring runs inside DTensor's dispatch, where the tracker (a dispatch mode, off the mode stack while a subclass
runs) would see only its results: :func:`seen` pushes it again around ``_templated_ring_attention`` and its
backward, so the all-gathered keys and values, the fp32 merger and accumulators and the all-to-all buffers are
counted as a GPU holds them. DeepSpeed-Ulysses (``cp_impl="ulysses"``) is refused here (:func:`refusal`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cabe.errors import InvalidValueError
from cabe.training import TrainingSetup


def refusal(setup: TrainingSetup) -> None:
    """What the context-parallel trace does not run (the estimate's own refusals come first: cabe.parallel.context)."""
    if setup.cp == 1:
        return
    if setup.cp_impl == "ulysses":
        raise InvalidValueError("trace_parallel_unsupported", "cp_impl", value="ulysses", why="cp_ulysses")
    for name, bad in (("tp", setup.tp > 1), ("packing", setup.packing != "none"), ("method", setup.method == "qlora")):
        if bad:
            raise InvalidValueError("trace_parallel_unsupported", name, value=getattr(setup, name), why="cp_with")


def mesh(setup: TrainingSetup, device_type: str) -> tuple[Any, Any]:
    """The (dp_shard, cp) mesh -- (dp_replicate, dp_shard, cp) under HSDP, a node's GPUs sharding --: FSDP2's over the
    flattened ``dp_shard_cp`` (accelerate's ``dp_shard_cp_dim_names``, torchtitan's; HSDP: ``dp_replicate`` beside
    it, accelerate's ``fsdp_dim_names``), the ring's over ``cp``."""
    from torch.distributed.device_mesh import init_device_mesh

    dims: tuple[int, ...]
    names: tuple[str, ...]
    if setup.shard == "fsdp-hybrid":
        per = min(setup.gpus_per_node, setup.gpus)
        dims, names = (setup.gpus // per, per // setup.cp, setup.cp), ("dp_replicate", "dp_shard", "cp")
    else:
        dims, names = (setup.gpus // setup.cp, setup.cp), ("dp_shard", "cp")
    world = init_device_mesh(device_type, dims, mesh_dim_names=names)
    flat = world[("dp_shard", "cp")]._flatten("dp_shard_cp")
    dp = world[("dp_replicate", "dp_shard_cp")] if setup.shard == "fsdp-hybrid" else flat
    return dp, world["cp"]


def _named(fn: Any) -> Any:
    def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return scaled_dot_product_attention


def seen(fn: Any, rank0: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        with rank0:
            return fn(*args, **kwargs)

    return run


@contextlib.contextmanager
def active(model: Any, setup: TrainingSetup, cp_mesh: Any, rank0: Any) -> Iterator[dict[str, Any]]:
    """The ring attention on, for the steps: the inputs sharded, SDPA dispatched to the ring (module docstring)."""
    import torch.nn.functional as F
    from accelerate.big_modeling import _attach_context_parallel_hooks
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import _create_default_load_balancer

    from cabe.trace import step
    from cabe.trace.patches import _Patch

    old = (cp._cp_options.rotate_method, cp._cp_options.enable_load_balance, cp._dispatch_mode)
    cp.set_rotate_method(setup.cp_impl)
    cp._cp_options.enable_load_balance = True
    balancer = _create_default_load_balancer(setup.seq, setup.cp, "cpu")
    cp._cp_options.enable_load_balance = balancer is not None
    cp._dispatch_mode = cp._DispatchMode.MONKEY_PATCH
    make_inputs = step.make_inputs

    def sharded_inputs(cfg: Any, s: TrainingSetup, device: Any) -> tuple[Any, Any, Any]:
        import torch

        ids, labels, _ = make_inputs(cfg, s, device)
        positions = torch.arange(s.seq, device=device).expand(ids.shape[0], -1)
        lb = balancer and _create_default_load_balancer(s.seq, s.cp, device)  # (its indices on the batch's device)
        shards: list[Any] = cp._context_parallel_buffers(cp_mesh, [ids, labels, positions], [1, 1, 1], lb)
        return shards[0], shards[1], shards[2]

    p = _Patch()
    _attach_context_parallel_hooks(model)  # (hooks on the traced model, dropped with it)
    try:
        p.set(step, "make_inputs", sharded_inputs)
        for name in ("_templated_ring_attention", "_templated_ring_attention_backward"):
            p.set(cp, name, seen(getattr(cp, name), rank0))
        # the trace's SDPA (cabe.trace.attention.routed_sdpa, a functools.partial) under the name torch's
        # ``_distribute_function`` replaces it by (``setattr(fn_module, fn.__name__, wrapper_fn)``)
        p.set(F, "scaled_dot_product_attention", _named(F.scaled_dot_product_attention))
        cp._enable_context_parallel_dispatcher_impl(seq_dim=2, mesh=cp_mesh)
        try:
            yield {
                "context_parallel": "torch context_parallel (ring attention)",
                "cp": setup.cp,
                "rotate_method": setup.cp_impl,
                "load_balance": balancer is not None,
            }
        finally:
            cp._disable_context_parallel_dispatcher_impl()
    finally:
        p.restore()
        cp._cp_options.rotate_method, cp._cp_options.enable_load_balance, cp._dispatch_mode = old
