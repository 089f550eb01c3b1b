"""Expert parallelism traced: transformers' own EP (5.25 ``transformers/distributed/expert_parallel.py``) on rank 0 of
the fake process group, with FSDP2 over the rest (:mod:`cabe.trace.distributed`).

What ``from_pretrained(distributed_config=DistributedConfig(fsdp_size=N, ep_size=K))`` does, step by step
(distributed/mixin.py ``maybe_distribute_model``), is done here with the same functions:

* the meshes (distributed/utils.py ``initialize_distributed_mesh``): the dense one ``(fsdp, tp)`` and the expert one
  ``(efsdp, ep)`` over the same ranks, ``efsdp = fsdp · tp / ep`` (configuration_utils.py ``efsdp_size``): rank 0 is
  in the EP group of ranks 0..K-1 and the expert-FSDP group of ranks 0, K, 2K...;
* the model's ``ep_plan`` (its config's ``base_model_ep_plan``: ``grouped_gemm`` on the experts' stacked weights,
  ``ep_dispatch_experts`` on the experts module), expanded per layer and applied by ``apply_expert_parallelism``:
  ``MoEParamShard`` makes each stack a DTensor ``Shard(0)`` on the EP mesh (rank 0 keeps experts ``0 .. E/K - 1``)
  and sets ``num_experts = E/K``; ``EpDispatchExpertsParallel`` replaces the experts' forward by the
  ``EPImplementation`` ``"auto"`` picks: ``AllToAllEP`` in training (``AllReduceEP``, the masked run of every token
  through the local experts, is for inference on a batch the EP group shares, ``AutoEP.__call__``);
* FSDP2 (distributed/fsdp.py ``apply_fully_sharded_data_parallelism``): each experts module its own unit on the
  expert-FSDP mesh (``reshard_after_forward=True``, gradients divided by the data-parallel size, summed then divided
  when ``efsdp > 1``), before the decoder layers and the root (cabe.trace.distributed's wrapping).

``AllToAllEP`` reads the split sizes of its two all-to-alls back to the host (``.tolist()``): what rank 0 receives
is what the other ranks' routers chose, which neither a fake tensor nor a fake group's collective holds. The trace
takes the balanced exchange, the expectation of uniform routing (:func:`balanced`): rank 0 sends and receives
``T·k / K`` token-expert pairs to and from each rank of its EP group (``T·k`` in all, what it would run on one GPU).
Everything else is transformers' code on those sizes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cabe.errors import InvalidValueError
from cabe.trace.patches import _Patch
from cabe.training import TrainingSetup

#: the shard strategies EP is traced under: transformers' EP needs FSDP2 (see :func:`refusal`)
SHARDS = ("fsdp", "fsdp-hybrid")


def refusal(setup: TrainingSetup, config: dict[str, Any] | None) -> None:
    """What transformers' EP cannot run for this setup, one sentence each (``why`` names the catalog entry)."""
    if setup.ep == 1:
        return
    if setup.shard not in SHARDS:
        # DistributedConfig: "`ep_size` must divide `fsdp_size * tp_size`" (configuration_utils.py
        # ``_validate_mesh_config``): with neither FSDP2 nor TP there is no such size, and DDP is none of its engines
        raise InvalidValueError("trace_parallel_unsupported", "ep", value=setup.ep, why="ep_fsdp")
    if setup.tp > 1:
        # transformers' EP group is a multiple of the TP group (ep_size % tp_size == 0, the TP ranks sharing a
        # batch and slicing it: AllToAllEP._dispatch_tokens); cabe's layout puts EP inside the data-parallel ranks
        raise InvalidValueError("trace_parallel_unsupported", "ep", value=setup.ep, why="ep_tp")
    if setup.method not in ("full", "freeze"):
        # MoEParamShard replaces the experts' stacked weights by DTensors on the EP mesh, and the experts' forward runs
        # on their local tensors (parallel_utils.py ``_use_local_dtensor_params``): PEFT's adapters on those stacks
        # (its ParamWrapper) or beside them get no plan entry
        raise InvalidValueError("trace_parallel_unsupported", "method", value=setup.method, why="ep_adapters")
    if config is not None:
        plan = _plan_of(config)
        if "ep_dispatch_experts" not in plan.values():
            raise InvalidValueError("trace_parallel_unsupported", "ep", value=setup.ep, why="ep_plan")
        if setup.shard == "fsdp-hybrid" and min(setup.gpus_per_node, setup.gpus) % setup.ep:
            # the expert mesh is (dp_replicate, efsdp, ep) with efsdp = fsdp / ep inside a replica (utils.py)
            raise InvalidValueError("trace_parallel_unsupported", "ep", value=setup.ep, why="ep_node")


def _plan_of(config: dict[str, Any]) -> dict[str, str]:
    from cabe.trace.build import hf_config

    text = hf_config(config)
    text = text.get_text_config() if hasattr(text, "get_text_config") else text
    return dict(getattr(text, "base_model_ep_plan", None) or {})


def meshes(setup: TrainingSetup, device_type: str) -> tuple[Any, Any, Any]:
    """The EP mesh, the expert-FSDP mesh (``efsdp``, with HSDP ``(replicate, efsdp)``) and the one-rank TP mesh
    transformers hands ``EPImplementation`` (the ranks holding rank 0's batch), as ``initialize_distributed_mesh``
    lays them out; made outside the fake mode (cabe.trace.distributed._run)."""
    from torch.distributed.device_mesh import init_device_mesh

    ep = setup.ep
    if setup.shard == "fsdp-hybrid":
        per = min(setup.gpus_per_node, setup.gpus)
        expert = init_device_mesh(
            device_type, (setup.gpus // per, per // ep, ep), mesh_dim_names=("replicate", "efsdp", "ep")
        )
        efsdp = expert[("replicate", "efsdp")]
    else:
        expert = init_device_mesh(device_type, (setup.gpus // ep, ep), mesh_dim_names=("efsdp", "ep"))
        efsdp = expert["efsdp"]
    dense = init_device_mesh(device_type, (setup.gpus, 1), mesh_dim_names=("dense", "tp"))
    return expert["ep"], efsdp, dense["tp"]


def apply(model: Any, ep_mesh: Any, tp_mesh: Any) -> dict[str, str]:
    """transformers' ``apply_expert_parallelism`` with the model's expanded ``ep_plan``; returns the plan."""
    from transformers.distributed.expert_parallel import apply_expert_parallelism

    plan = model._expand_parallel_plan(dict(model.ep_plan))
    apply_expert_parallelism(model, ep_mesh, tp_mesh, plan, ep_implementation="auto")
    return plan


def shard_experts(model: Any, plan: dict[str, str], mesh: Any, setup: TrainingSetup, **policies: Any) -> int:
    """Each ``ep_dispatch_experts`` module its own FSDP2 unit on the expert-FSDP mesh, as transformers'
    ``apply_fully_sharded_data_parallelism`` wraps it (distributed/fsdp.py); returns how many."""
    from torch.distributed.fsdp import fully_shard

    units = 0
    for name, style in plan.items():
        if style != "ep_dispatch_experts":
            continue
        module = model.get_submodule(name)
        fully_shard(module, mesh=mesh, reshard_after_forward=True, **policies)
        module.set_gradient_divide_factor(float(setup.gpus // setup.tp))
        if mesh.size() > 1:
            module.set_force_sum_reduction_for_comms(True)
        units += 1
    return units


def balanced(pairs: int, ranks: int) -> list[int]:
    """``pairs`` token-expert pairs split over ``ranks`` as evenly as whole pairs go (the first ranks one more)."""
    base, extra = divmod(pairs, ranks)
    return [base + (1 if r < extra else 0) for r in range(ranks)]


@contextlib.contextmanager
def balanced_exchange(on: bool = True) -> Iterator[None]:
    """``AllToAllEP``'s split sizes, balanced (the module docstring): its counts all-to-all fills rank 0's receive
    counts evenly (each rank ``T·k / K`` pairs, over its local experts), and the one host read of the layer
    (``torch.stack([send_counts.sum(1), recv_counts.sum(1)]).tolist()``) answers those sizes. The dispatch and
    combine themselves run as transformers wrote them."""
    if not on:
        yield
        return
    import torch
    from transformers.distributed import expert_parallel as tep

    pending: list[list[int]] = []
    dispatch0 = tep.AllToAllEP._dispatch_tokens

    def dispatch(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
        pending[:] = [balanced(hidden_states.size(0) * top_k_index.size(-1), self.ep_mesh.size())]
        return dispatch0(self, hidden_states, top_k_index, top_k_weights)

    def counts(recv: Any, send: Any, group: Any = None) -> None:
        ranks, local = recv.shape
        values = [balanced(size, local) for size in pending[0]] if pending else [[0] * local] * ranks
        recv.copy_(torch.tensor(values, dtype=recv.dtype, device=recv.device))

    class _Sizes:
        def __init__(self, sizes: list[int]) -> None:
            self.sizes = sizes

        def tolist(self) -> list[list[int]]:
            return [self.sizes, self.sizes]

    class _Torch:
        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

        @staticmethod
        def stack(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if pending:
                return _Sizes(pending.pop())
            return torch.stack(tensors, *args, **kwargs)

    p = _Patch()
    try:
        p.set(tep.AllToAllEP, "_dispatch_tokens", dispatch)
        p.set(tep, "all_to_all_single", counts)
        p.set(tep, "torch", _Torch())
        yield
    finally:
        p.restore()


def engine(setup: TrainingSetup, plan: dict[str, str], units: int) -> dict[str, Any]:
    """What the report says of the EP run."""
    styles = sorted(set(plan.values()))
    return {
        "expert_parallel": f"transformers' ep_plan ({', '.join(styles)}), AllToAllEP",
        "ep": setup.ep,
        "expert_fsdp": f"fully_shard per experts module ({units} units) on efsdp = {setup.gpus // setup.ep}",
        "routing": "balanced: T·k/ep token-expert pairs to and from each EP rank",
    }
