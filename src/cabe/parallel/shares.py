"""Each parameter tensor's share on one GPU, and the sums of what that GPU holds.

A tensor's share is the product of its tensor-parallel share (:func:`tp_share`), its expert-parallel
share (:func:`ep_share`) and its pipeline-stage share (:func:`pp_share`); the data-parallel strategy
then divides the sharded figures by the tensor's shard group (experts by their own, smaller group).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from cabe import memo
from cabe.architecture import ModelSpec
from cabe.optimizer import get as get_optimizer
from cabe.optimizer_memory import low_rank_temporaries
from cabe.parallel.config import ShardConfig
from cabe.parallel.layout import Layout
from cabe.parameters import layer_tensors, quantized_bytes, stored_bytes
from cabe.tensors import Tensor
from cabe.training import TrainingSetup
from cabe.units import round_alloc

#: parameter tensors that are not in a decoder layer
NON_LAYER = ("embed_tokens", "position_embeddings", "final_norm", "lm_head", "prompt_embeddings")


@dataclass
class Holdings:
    """Byte and element sums over the tensors one GPU holds (model-parallel share applied);
    ``*_sharded`` the same divided by each tensor's data-parallel shard group."""

    stored: float = 0.0  # stored bytes, non-quantized
    stored_sharded: float = 0.0
    quantized: float = 0.0  # quantized (4-bit) bytes
    quantized_sharded: float = 0.0
    trainable: float = 0.0  # trainable stored bytes
    trainable_sharded: float = 0.0
    elements: float = 0.0  # non-quantized elements
    elements_sharded: float = 0.0
    trainable_elements: float = 0.0
    trainable_elements_sharded: float = 0.0
    persistent_elements: float = 0.0  # ZeRO-3: elements under the persistence threshold (kept whole)
    layer_elements: float = 0.0  # non-quantized elements of one decoder layer
    layer_expert_elements: float = 0.0  # of which the routed experts' (under EP: this rank's experts)
    layer_quantized: float = 0.0  # quantized bytes of one decoder layer
    layer_stored: float = 0.0  # stored bytes of one decoder layer
    layer_trainable_elements: float = 0.0
    root_elements: float = 0.0  # embeddings, final norm, lm_head on this stage
    root_stored: float = 0.0
    largest_module: float = 0.0  # elements of the largest module (DeepSpeed's "largest layer")
    #: every tensor this GPU holds, with its model-parallel share applied (:class:`Held`)
    held: list[Held] = field(default_factory=list)
    #: the input embedding's weight is the lm_head's (tie_word_embeddings)
    tied: bool = False


@dataclass(frozen=True)
class Held:
    """One parameter tensor group as one GPU holds it before data-parallel sharding: ``tensor`` with
    its tensor- / expert-parallel share of elements (``numel``, ``rows``), ``count`` copies on this
    pipeline stage (a fraction when the stage's layers are not a multiple), ``group`` the GPUs that
    share one copy of its sharded states, ``nbytes`` its stored bytes per element (``stored_bytes``,
    the rule the single-GPU pass uses)."""

    tensor: Tensor
    count: float
    group: int
    nbytes: int

    @property
    def trainable(self) -> bool:
        return self.tensor.trainable


def tp_share(t: Tensor, base: str, role: str, spec: ModelSpec, tp: int, cfg: ShardConfig) -> float:
    """Megatron-style tensor parallelism: matrices split in tp, norms and routers replicated,
    embeddings split over the vocabulary (``vocab_parallel``), k / v replicated per kv head when
    there are fewer kv heads than ranks."""
    name = t.name
    if tp == 1 or t.kind == "norm" or name in ("position_embeddings", "prompt_embeddings", "final_norm"):
        return 1.0
    if name in ("embed_tokens", "lm_head"):
        return 1 / tp if cfg.vocab_parallel else 1.0
    if role == "router":
        return 1.0
    if base in ("k_proj", "v_proj") and spec.num_kv_heads < tp:
        return 1 / spec.num_kv_heads  # each rank keeps (a replica of) one KV head
    return 1 / tp


def ep_divisor(role: str, ep: int) -> int:
    """Expert parallelism: each rank of an ep group holds 1/ep of the experts."""
    return ep if role == "expert" else 1


def pp_share(name: str, spec: ModelSpec, lay: Layout) -> float:
    """Pipeline parallelism: a stage holds its layers; embeddings on the first stage (and, tied, on
    the last), final norm and lm_head on the last."""
    if name not in NON_LAYER:
        return lay.stage_layers / spec.num_layers
    if name in ("embed_tokens", "position_embeddings", "prompt_embeddings"):
        on = lay.first or (name == "embed_tokens" and spec.tie_word_embeddings and lay.last)
        return 1.0 if on else 0.0
    return 1.0 if lay.last else 0.0  # final_norm, lm_head


def holdings(
    spec: ModelSpec, setup: TrainingSetup, cfg: ShardConfig, tensors: list[Tensor], dt: Any, lay: Layout
) -> Holdings:
    """What one GPU of ``lay`` holds of ``tensors``."""
    layers = spec.num_layers
    roles = {lin.name: lin.role for lin in spec.layer_linears}
    copies = {lin.name: lin.copies for lin in spec.layer_linears}
    stage_layers = lay.stage_layers
    h = Holdings(tied=spec.tie_word_embeddings)
    group_of_experts = max(lay.shard_group // lay.ep, 1) if lay.ep > 1 else lay.shard_group
    for t in tensors:
        name = t.name
        base = name.split(".lora_")[0].removesuffix(".bias")
        is_layer = name not in NON_LAYER
        role = roles.get(base, "attn")
        tp = tp_share(t, base, role, spec, lay.tp, cfg)
        pp, ep = pp_share(name, spec, lay), ep_divisor(role, lay.ep)
        share = tp / ep * pp
        group = group_of_experts if role == "expert" else lay.shard_group
        if share == 0:
            continue
        numel = t.total * share
        per_tensor = t.numel * share / (stage_layers / layers) if is_layer else t.numel * share
        h.held.append(_held(t, tp, pp, ep, group, setup, dt))
        if t.kind == "quantized":
            qb = quantized_bytes(t.numel, setup.double_quant) * t.count * share
            h.quantized += qb
            h.quantized_sharded += qb / group
            if is_layer:
                h.layer_quantized += qb / stage_layers
            h.largest_module = max(h.largest_module, per_tensor)
            continue
        b = stored_bytes(t, setup, dt)
        _add_stored(h, t, numel, b, group, is_layer, stage_layers, t.numel * share < cfg.param_persistence_threshold)
        if is_layer and role == "expert":
            h.layer_expert_elements += numel / stage_layers
        # a module's parameters: weight (+ its experts, stored as one 3-D parameter)
        mod = per_tensor * (copies.get(base, 1) if t.count == layers * copies.get(base, 1) else 1)
        h.largest_module = max(h.largest_module, mod if role == "expert" else per_tensor)
    return h


def _held(t: Tensor, tp: float, pp: float, ep: int, group: int, setup: TrainingSetup, dt: Any) -> Held:
    """``t`` as one GPU holds it: TP splits each matrix's elements (rows, the dimension FSDP2 chunks,
    follow the split of a column-parallel matrix: an approximation for row-parallel ones); EP and PP
    hold fewer copies. Quantized tensors keep ``nbytes`` 0 (their bytes are :func:`quantized_bytes`)."""
    numel = round(t.numel * tp)
    rows = round(t.rows * tp) if t.rows else 0
    # (its role, module path and expert stack kept: GaLore's targets match the path, the step's temporaries the stack)
    here = replace(t, numel=numel, rows=rows)
    nbytes = 0 if t.kind == "quantized" else stored_bytes(t, setup, dt)
    return Held(here, t.count * pp / ep, group, nbytes)


def _add_stored(
    h: Holdings, t: Tensor, numel: float, b: int, group: int, is_layer: bool, stage_layers: int, persistent: bool
) -> None:
    h.stored += numel * b
    h.stored_sharded += numel * b / group
    h.elements += numel
    h.elements_sharded += numel / group
    if t.trainable:
        h.trainable += numel * b
        h.trainable_sharded += numel * b / group
        h.trainable_elements += numel
        h.trainable_elements_sharded += numel / group
    if persistent:  # under ZeRO-3's param_persistence_threshold
        h.persistent_elements += numel
    if is_layer:
        h.layer_elements += numel / stage_layers
        h.layer_stored += numel * b / stage_layers
        if t.trainable:
            h.layer_trainable_elements += numel / stage_layers
    else:
        h.root_elements += numel
        h.root_stored += numel * b


# ---- bytes, tensor by tensor ---------------------------------------------------------------------
#: a tensor, how many copies of it, and its bytes per element
Piece = tuple[Tensor, float, int]


def pieces(held: list[Held], *, trainable: bool = False, nbytes: int = 0) -> list[Piece]:
    """The non-quantized tensors of ``held`` (only the trainable ones with ``trainable``), each with
    its stored bytes per element, or ``nbytes`` when given (a 16-bit module, fp32 masters)."""
    return [
        (h.tensor, h.count, nbytes or h.nbytes)
        for h in held
        if h.tensor.kind != "quantized" and (h.trainable or not trainable)
    ]


def dense_bytes(items: list[Piece]) -> int:
    """Bytes of separate tensors: each rounded to the allocator's block, as the single-GPU pass counts."""
    return round(sum(round_alloc(t.numel * b) * n for t, n, b in items))


def quantized_held_bytes(held: list[Held], setup: TrainingSetup, group: int = 1) -> int:
    """bitsandbytes 4-bit storage of the quantized tensors, split in ``group`` equal padded shards."""
    return round(
        sum(-(-quantized_bytes(h.tensor.numel, setup.double_quant) // group) * h.count for h in held if not h.nbytes)
    )


def fsdp_shard(t: Tensor, group: int) -> Tensor:
    """FSDP2's shard of one parameter: ``torch.chunk`` on dim 0 over the group, every rank padded to the
    first chunk's size (torch 2.13 ``distributed/fsdp/_fully_shard/_fsdp_param.py:304``,
    ``padded_sharded_size = chunks[0].size()  # 0th always padded``). A 1-D tensor is its own dim 0."""
    if group == 1:
        return t
    rows = t.rows or t.numel
    chunk = -(-rows // group)
    return Tensor(
        t.name, chunk * (t.numel // rows), t.count, t.trainable, t.kind, chunk if t.rows else 0, t.cols, t.role, t.path
    )


def zero3_shard(t: Tensor, group: int) -> Tensor:
    """DeepSpeed ZeRO-3's partition of one parameter: flattened and padded to a multiple of the group
    (``partition_parameters.py``, ``_padding_size``: ``num_partitions - numel % num_partitions``),
    ``ds_numel / num_partitions`` elements per rank, 1-D."""
    return Tensor(t.name, -(-t.numel // group), t.count, t.trainable, t.kind)


def sharded(items: list[Piece], rule: Callable[[Tensor, int], Tensor], group: int) -> list[Piece]:
    return [(rule(t, group), n, b) for t, n, b in items]


def own_groups(held: list[Held], rule: Callable[[Tensor, int], Tensor], *, trainable: bool = False) -> list[Piece]:
    """:func:`pieces` of ``held``, each sharded by ``rule`` over its own group (:attr:`Held.group`): under expert
    parallelism the experts over the expert-FSDP group (``efsdp = fsdp / ep``), the rest over the whole shard group.
    transformers 5.25 wraps each experts module as its own FSDP2 unit on that mesh (distributed/fsdp.py
    ``apply_fully_sharded_data_parallelism``: ``fully_shard(module, mesh=expert_mesh)``, ``efsdp_size = fsdp_size
    * tp_size // ep_size``, configuration_utils.py), its stacks already cut to the rank's experts (``MoEParamShard``)."""
    return [
        (rule(h.tensor, h.group), h.count, h.nbytes)
        for h in held
        if h.tensor.kind != "quantized" and (h.trainable or not trainable)
    ]


def flat_partition(items: list[Piece], group: int, align: int = 2) -> list[Piece]:
    """DeepSpeed ZeRO-1/2: the trainable tensors of one dtype flattened into one buffer, padded to a
    multiple of ``nccl_start_alignment_factor`` (2) × world (``stage_1_and_2.py``,
    ``flatten_dense_tensors_aligned``), each rank owning an equal 1-D partition."""
    by_dtype: dict[int, float] = {}
    for t, n, b in items:
        by_dtype[b] = by_dtype.get(b, 0.0) + t.numel * n
    out: list[Piece] = []
    for b, numel in by_dtype.items():
        step = align * group
        part = -(-round(numel) // step) * step // group
        out.append((Tensor("flat", part, 1, True, "base"), 1, b))
    return out


def optimizer_bytes(items: list[Piece], setup: TrainingSetup, *, paged: bool = False) -> tuple[int, int]:
    """Optimizer state and ``step()`` temporaries of the trainable tensors ``items``, tensor by tensor
    through the optimizer registry (the same rules :func:`cabe.optimizer.optimizer_memory` applies on
    one GPU); paged state (bitsandbytes' unified memory) is not device memory and is left out unless
    ``paged`` (the state of an optimizer that runs on the host)."""
    opt = get_optimizer(setup.optimizer)
    impl = setup.resolved_optimizer_impl
    state = 0.0
    largest = 0
    for t, n, b in items:
        largest = max(largest, t.numel * b)
        on_device, in_unified = opt.device_and_paged(t, b, impl, setup)
        state += (on_device + (in_unified if paged else 0)) * n
    if opt.low_rank:  # GaLore runs whole weights only (optimizer.refusal): DDP's replicas
        return round(state), low_rank_temporaries([(t, b) for t, _, b in items], opt, setup)
    temps = dict(opt.temporaries).get(impl)
    if temps == "all":
        temp = dense_bytes(items)
    elif temps in ("largest", "one"):
        temp = (2 if temps == "largest" else 1) * round_alloc(largest) if items else 0
    else:
        temp = 0
    return round(state), temp


@dataclass(frozen=True)
class RunUnit:
    """One decoder layer of one kind (a run's) as one GPU holds it before data-parallel sharding: what an FSDP unit
    gathers of it (``elements`` non-quantized, ``quantized`` bytes), its trainable elements, and the share of its
    trainable bytes this GPU's tensor / expert parallelism leaves (1: none)."""

    elements: float
    quantized: float
    trainable_elements: float
    trainable_share: float


def run_unit(spec: ModelSpec, setup: TrainingSetup, cfg: ShardConfig, dt: Any, lay: Layout, group: Any) -> RunUnit:
    """:class:`RunUnit` of one layer of ``group`` (a :class:`cabe.layers.LayerGroup` of the gradient's path: its
    base weights trainable under full and freeze), tensor by tensor with :func:`holdings`' shares. Once per model,
    request and layout (cabe.memo)."""
    m, key = memo.of(spec), ("run_unit", memo.request_key(setup), cfg, lay.tp, lay.ep, id(group))
    hit = m.get(key)
    if hit is None:
        hit = m[key] = (group, _run_unit(spec, setup, cfg, dt, lay, group))
    out: RunUnit = hit[1]
    return out


def _run_unit(spec: ModelSpec, setup: TrainingSetup, cfg: ShardConfig, dt: Any, lay: Layout, group: Any) -> RunUnit:
    roles = {lin.name: lin.role for lin in spec.layer_linears}
    elements = quantized = trainable = mine = whole = 0.0
    for t in layer_tensors(spec, setup, group, True):
        base = t.name.split(".lora_")[0].removesuffix(".bias")
        role = roles.get(base, "attn")
        share = tp_share(t, base, role, spec, lay.tp, cfg) / ep_divisor(role, lay.ep)
        if t.kind == "quantized":
            quantized += quantized_bytes(t.numel, setup.double_quant) * t.count * share
            continue
        elements += t.total * share
        if t.trainable:
            trainable += t.total * share
            b = stored_bytes(t, setup, dt)
            mine += t.total * share * b
            whole += t.total * b
    return RunUnit(elements, quantized, trainable, mine / whole if whole else 1.0)
