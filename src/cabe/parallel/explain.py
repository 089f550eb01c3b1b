"""The per-GPU figures a multi-GPU plan reports, and its explanation as :class:`~cabe.report.Step`
lines (codes and numbers; :mod:`cabe.i18n` has the words)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from cabe.parallel.layout import SHARDED, Layout
from cabe.report import Step
from cabe.step import StepParts
from cabe.units import GB, GiB

COMMUNICATION = ("ddp_buckets", "ipg_buckets", "p2p_buffers", "tp_comm", "moe_all_to_all")


def per_gpu(new: StepParts, master_weights: float, host: int, grads: float | None = None) -> dict[str, Any]:
    """Model states, communication buffers, gathered parameters and host RAM of one GPU; ``grads``: the gradients
    kept as a model state where the step holds them elsewhere than ``new.grads`` (strategy.States.state_grads)."""
    master = round(master_weights)
    kept = new.grads if grads is None else round(grads)
    buffers = {
        **new.extra_forward,
        **new.extra_backward,
        **new.extra_layer_backward,
        **new.extra_below_top,
        **new.extra_above_bottom,
        **new.extra_layer_grads,
        **new.extra_optimizer,
    }
    return {
        "weights_bytes": new.weights,
        "gradients_bytes": kept,
        "optimizer_bytes": new.optimizer,
        "master_weights_bytes": master,
        "model_states_bytes": new.weights + kept + new.optimizer + master,
        "communication_bytes": {k: v for k, v in buffers.items() if k in COMMUNICATION},
        "gathered_params_bytes": max(
            # (reshard_after_forward=False: every unit's gathered parameters at the end of forward)
            new.extra_forward.get("gathered_params", 0)
            + new.extra_forward.get("kept_gathered_params", 0)
            + new.extra_pending_layer.get("kept_gathered_params", 0) * new.grad_layers,
            new.extra_backward.get("gathered_params", 0) + new.extra_above_bottom.get("prefetched_params", 0),
        ),
        "host_bytes": host,
    }


def steps(lay: Layout, inflight: int, figures: dict[str, Any], per_node: int, sp: bool) -> list[Step]:
    """The explanation of a plan, line by line."""
    host = figures["host_bytes"]
    states = figures["model_states_bytes"]
    out = [
        Step(
            "shard.layout",
            "{gpus} = dp {dp} × tp {tp} × pp {pp}; ep {ep}",
            None,
            {"gpus": lay.world, "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "ep": lay.ep},
        )
    ]
    if lay.strategy in SHARDED:
        out.append(Step("shard." + lay.strategy, "{states} B / {g}", states, {"states": states, "g": lay.shard_group}))
    else:
        out.append(Step("shard." + lay.strategy, "{states} B", states, {"states": states}))
    if lay.pp > 1:
        params = {"layers": lay.stage_layers, "inflight": inflight, "stage": lay.stage}
        out.append(Step("shard.pipeline", "{layers} layers × {inflight} micro-batches", None, params))
    if lay.tp > 1:
        out.append(Step("shard.tensor_parallel", "1/{tp}", None, {"tp": lay.tp, "sp": int(sp)}))
    for name, nbytes in figures["communication_bytes"].items():
        out.append(
            Step("shard.buffer." + name, "{bytes} B = {gib} GiB", nbytes, {"bytes": nbytes, "gib": nbytes / GiB})
        )
    gathered = figures["gathered_params_bytes"]
    if gathered:
        out.append(
            Step("shard.gathered", "{bytes} B = {gib} GiB", gathered, {"bytes": gathered, "gib": gathered / GiB})
        )
    if host:
        total = host * per_node
        params = {"per_gpu": host, "gpus": per_node, "bytes": total, "gb": total / GB}
        out.append(Step("shard.host", "{per_gpu} B × {gpus} = {bytes} B = {gb} GB", total, params))
    return out


def step_json(s: Step) -> dict[str, Any]:
    """A step as the report's JSON writes it (``info`` travels in ``Report.extra``)."""
    return asdict(s)
