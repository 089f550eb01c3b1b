"""The parallel layout: world = dp × cp × tp × pp (ep within dp), the data-parallel shard group, and the
pipeline stage one GPU runs. Validation is here: a layout the frameworks refuse is a typed error."""

from __future__ import annotations

from dataclasses import dataclass

from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.parallel import context
from cabe.parallel.config import ShardConfig
from cabe.training import TrainingSetup

#: strategies that partition model states over the data-parallel group
SHARDED = ("zero1", "zero2", "zero3", "fsdp", "fsdp-hybrid")


@dataclass(frozen=True)
class Layout:
    """How the world is cut, seen from one GPU of pipeline stage ``stage``."""

    world: int
    dp: int
    tp: int
    pp: int
    ep: int
    strategy: str  # the setup's shard, "none" with dp > 1 read as "ddp"
    shard_group: int  # GPUs that share one copy of the sharded states
    stage: int = 0
    layers: int = 1  # decoder layers of the whole model
    cp: int = 1  # context-parallel degree (cabe.parallel.context)

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.pp - 1

    @property
    def stage_layers(self) -> int:
        return stage_layers(self.layers, self.pp, self.stage)

    def at_stage(self, stage: int) -> Layout:
        return Layout(
            self.world, self.dp, self.tp, self.pp, self.ep, self.strategy, self.shard_group, stage, self.layers, self.cp
        )


def stage_layers(layers: int, pp: int, stage: int) -> int:
    """Decoder layers on pipeline stage ``stage``: an even split, the first stages take the rest."""
    base, extra = divmod(layers, pp)
    return base + (1 if stage < extra else 0)


def validate(spec: ModelSpec, setup: TrainingSetup, cfg: ShardConfig) -> int:
    """Check the layout the setup asks for; returns the data-parallel degree dp."""
    tp, pp, ep, n, cp = setup.tp, setup.pp, setup.ep, setup.gpus, setup.cp
    if n % (tp * pp * cp):
        if cp > 1:
            raise InvalidValueError("gpus_not_divisible_cp", "gpus", value=n, cp=cp, tp=tp, pp=pp)
        raise InvalidValueError("gpus_not_divisible", "gpus", value=n, tp=tp, pp=pp)
    dp = n // (tp * pp * cp)
    context.validate(spec, setup)
    if pp > spec.num_layers:
        raise InvalidValueError("out_of_range", "pp", value=pp, minimum=1, maximum=spec.num_layers)
    if tp > 1 and spec.num_heads % tp:
        raise InvalidValueError("tp_not_divisor", "tp", value=tp, heads=spec.num_heads)
    if ep > 1:
        if not spec.num_experts:
            raise InvalidValueError("ep_without_experts", "ep", value=ep)
        if spec.num_experts % ep or dp % ep:
            raise InvalidValueError("ep_not_divisor", "ep", value=ep, experts=spec.num_experts, dp=dp)
    if cfg.pp_schedule not in ("1f1b", "gpipe"):
        raise InvalidValueError("bad_choice", "pp_schedule", value=cfg.pp_schedule, allowed="1f1b, gpipe")
    off, shard = setup.offload, setup.shard
    if off != "none":
        if shard in ("none", "ddp"):
            raise InvalidValueError("offload_needs_sharding", "offload", value=off, shard=shard)
        if off in ("parameters", "both") and shard in ("zero1", "zero2"):
            raise InvalidValueError("offload_params_needs_zero3", "offload", value=off, shard=shard)
        if off == "optimizer" and shard.startswith("fsdp"):
            raise InvalidValueError("fsdp_offload_optimizer", "offload", value=off)
    return dp


def layout(spec: ModelSpec, setup: TrainingSetup, cfg: ShardConfig) -> tuple[Layout, list[str]]:
    """The validated layout of stage 0, and the notes (codes) reading it raised."""
    dp = validate(spec, setup, cfg)
    strategy, notes = setup.shard, []
    if strategy == "none" and dp > 1:
        strategy = "ddp"
        notes.append("none_means_ddp")
    # the model states are sharded over the data-parallel GPUs and the context-parallel ones together: FSDP over the
    # joint ``dp_shard_cp`` mesh (accelerate 1.16 parallelism_config.py ``dp_shard_cp_dim_names``, torchtitan's),
    # ZeRO over DeepSpeed's ``seq_data_parallel_group`` (deepspeed 0.19.8 runtime/engine.py
    # ``_resolve_zero3_param_placement``): a cp group's GPUs hold the same weights and their gradients are reduced
    sharded = dp * setup.cp
    if strategy == "fsdp-hybrid":
        # shard within a node, replicate across nodes; a node's GPUs hold whole TP groups (TP innermost, as
        # torchtitan's and cabe.trace.distributed's meshes lay it out), so a node has gpus_per_node / tp shards
        group = min(max(setup.gpus_per_node // setup.tp, 1), sharded)
    elif strategy in SHARDED:
        group = sharded
    else:
        group = 1
    lay = Layout(setup.gpus, dp, setup.tp, setup.pp, setup.ep, strategy, group, 0, spec.num_layers, setup.cp)
    return lay, notes
