"""The model states of a training step: weights (stored dtype, 4-bit storage), gradients and optimizer state
(:func:`_model_states`, cached by the setup fields that change them), and the weight copies a step makes (autocast's
16-bit casts, engines' gathered parameters, PEFT's merged weights: :func:`_weight_copies`). Proved by
tests/test_estimate.py, tests/test_optimizer.py, tests/parallel/test_tensor_shares.py and the trace tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cabe import fp8, memo
from cabe.activations import (
    dora_stray_parameter,
    loss_chunk_positions,
)
from cabe.architecture import ModelSpec
from cabe.frozen import quick
from cabe.layers import LayerGroup, Linear
from cabe.method import VISION_PREFIX, head_targets, lora_targets, running_lora_targets
from cabe.optimizer_memory import optimizer_memory
from cabe.parameters import parameter_tensors, quantized_bytes, stored_bytes
from cabe.precision import Dtypes, dtypes_for
from cabe.schema import state_fields
from cabe.tensors import Tensor
from cabe.training import TrainingSetup
from cabe.units import round_alloc


@quick
@dataclass(frozen=True)
class _States:
    tensors: list
    bytes_of: dict
    weights: int
    quant: int
    grads: int
    opt: Any
    n_train: int
    #: figures read from these states by every estimate that shares them (:func:`_grads_of`)
    memo: dict = field(default_factory=dict, compare=False, repr=False)


#: the setup fields that change model states (cabe.schema, ``states=True``): the cache key
_STATE_FIELDS = state_fields()


def _model_states(spec: ModelSpec, setup: TrainingSetup) -> _States:
    """Weights, gradients and optimizer state: independent of batch and sequence, so cached by the
    fields they depend on (a solver sweeping batch or sequence pays for them once), in the model's memo
    (cabe.memo); found first by the request less its shape, which is cheaper to look up."""
    m, by_request = memo.of(spec), ("states", memo.request_key(setup))
    hit = m.get(by_request)
    if hit is None:
        key = ("states_by_fields", *(getattr(setup, f) for f in _STATE_FIELDS))
        hit = m.get(key)
        if hit is None:
            hit = m[key] = _compute_model_states(spec, setup)
        m[by_request] = hit
    return hit


def _compute_model_states(spec: ModelSpec, setup: TrainingSetup) -> _States:
    dt = dtypes_for(setup)
    tensors = parameter_tensors(spec, setup)
    kinds = {t.kind for t in tensors}
    bytes_of = dict.fromkeys(kinds, 0)
    weights = 0
    quant = 0
    for t in tensors:
        if t.kind == "quantized":
            quant += quantized_bytes(t.numel, setup.double_quant) * t.count
            continue
        b = stored_bytes(t, setup, dt)
        bytes_of[t.kind] = b
        weights += round_alloc(t.numel * b) * t.count
    bytes_of_trainable = dict(bytes_of)
    grads = sum(round_alloc(t.numel * bytes_of_trainable[t.kind]) * t.count for t in tensors if t.trainable)
    opt = optimizer_memory(tensors, setup, bytes_of_trainable)
    n_train = sum(t.total for t in tensors if t.trainable)
    return _States(tensors, bytes_of_trainable, weights, quant, grads, opt, n_train)


@quick
@dataclass(frozen=True)
class _Copies:
    """Autocast's 16-bit copies of matmul weights (aten/src/ATen/autocast_mode.cpp, ``cached_cast``), per
    layer of one run.

    ``layer``: every copy one layer makes (each saved by autograd for backward when the layer is in the
    gradient's path); ``cached``: the part autocast's cache keeps until forward ends — only casts of fp32
    leaves that require grad (``arg.requires_grad() && arg.is_leaf()`` with ``scalar_type == kFloat``);
    ``trained_layers``: layers with such leaves (in the whole model); ``head``: the lm_head's copy."""

    layer: int = 0
    cached: int = 0
    trained_layers: int = 0
    head: int = 0


def _fp8_linears(spec: ModelSpec, layer: LayerGroup) -> list[Linear]:
    """The matrices of one layer that an fp8 recipe swaps (cabe.fp8.converted)."""
    return [lin for lin in layer.linears if fp8.converted(spec, lin)]


def _weight_copies(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, run: LayerGroup | None = None) -> _Copies:
    """The copies of one layer of ``run`` (the top run's when None): once per model, request less its shape, dtypes
    and run (cabe.memo; the run and the dtypes by identity, kept alive by the entry)."""
    m, key = memo.of(spec), ("weight_copies", memo.request_key(setup), id(dt), id(run))
    hit = m.get(key)
    if hit is None:
        hit = m[key] = (dt, run, _compute_weight_copies(spec, setup, dt, run))
    return hit[2]


def _compute_weight_copies(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, run: LayerGroup | None) -> _Copies:
    layer = run or spec.runs[-1]
    if setup.fp8 != "none" and fp8.is_te(setup.fp8):
        # te.Linear saves the fp8 weight it made (row-wise and its transpose) until its backward, autocast or not
        # (cabe.fp8.te_weight_bytes, modelled from source); the lm_head stays an nn.Linear, cast as ever
        saved = sum(round_alloc(fp8.te_weight_bytes(setup.fp8, lin.weight_count)) for lin in _fp8_linears(spec, layer))
        head = sum(round_alloc(n * 2) for n in _head_matrices(spec)) if dt.weight_copies else 0
        trained = spec.num_layers if setup.method == "full" else min(setup.trainable_layers, spec.num_layers)
        return _Copies(saved, 0, trained, head)
    if not dt.autocast:
        return _Copies()
    base = sum(round_alloc(lin.weight_count * 2) for lin in _cast_linears(spec, setup, dt, layer))
    adapters = 0
    if setup.adapters:  # the fp32 LoRA matrices are cast too (r × in and out × r per target)
        adapters = sum(
            round_alloc(setup.lora_rank * lin.in_features * 2) + round_alloc(setup.lora_rank * lin.out_features * 2)
            for lin in running_lora_targets(spec, setup.lora_targets, layer)
        )
    if setup.method in ("full", "freeze"):  # the trained layers' weights, when they are fp32 leaves
        cached = base if dt.cached_copies else 0
        trained = spec.num_layers if setup.method == "full" else min(setup.trainable_layers, spec.num_layers)
    else:  # LoRA / QLoRA: only the adapters train; prompt tuning: nothing in the layers
        cached, trained = adapters, (spec.num_layers if setup.adapters else 0)
        if setup.dora and setup.lora_dropout > 0 and dt.cached_copies:
            # DoRA + dropout on Conv1D: PEFT's throwaway Parameter(W.T) is an fp32 leaf that requires grad, so
            # autocast caches its cast until forward ends (activations.dora_stray_parameter); without
            # checkpointing that cast is the one the matmul saves (counted with the layer's saved tensors)
            quantized = setup.method == "qlora"
            cached += sum(
                round_alloc(lin.weight_count * 2)
                for lin in lora_targets(spec, setup.lora_targets, layer)
                if dora_stray_parameter(spec, quantized, dt.adapter, dt.frozen, lin)
            )
    # (freeze with fp32 trained layers: the frozen head stays as loaded, cast only when that is not autocast's dtype)
    head_cast = dt.weight_copies and not (
        setup.trainable_fp32 and setup.method == "freeze" and setup.dtype == setup.autocast
    )
    # TRL's fused LM head (DPO, KTO, GRPO) never calls the lm_head module (trl/trainer/utils.py:1629-1654): no
    # autocast cast of its weight; its own casts, tile by tile, are the head's transients (cabe.objectives.fused_head)
    head_cast = head_cast and setup.objective not in ("dpo", "kto", "grpo")
    head = sum(round_alloc(n * 2) for n in _head_matrices(spec)) if head_cast else 0
    head += _head_adapter_copies(spec, setup)
    if setup.resolved_loss in ("chunked", "litgpt") and not (setup.method == "full" and dt.cached_copies):
        # torchtune's chunked output (and LitGPT's) calls the lm_head once per chunk: autocast casts a weight that
        # is not a trained fp32 leaf anew on each call (cached_cast), and each chunk's mm saves its own copy
        head *= len(loss_chunk_positions(setup))
    return _Copies(base + adapters, cached, trained, head)


def _cast_linears(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, layer: LayerGroup) -> list[Any]:
    """The matmul weights of one layer autocast casts to 16 bits (under autocast)."""
    if not dt.weight_copies:
        return []
    # QLoRA's 4-bit layers dequantize per use and keep nothing; every other matmul weight is cast when
    # it is not in the autocast dtype already
    # The 3-D experts get no copy when transformers' grouped_mm runs them in their own dtype, outside autocast
    # (activations._moe); Llama 4's dense dispatch runs them through torch.bmm, which autocast casts
    experts_cast = spec.expert_dispatch == "dense"
    # nor are a Mamba-2 mixer's conv1d, dt_bias, A_log, D and norm weights: the fused kernel reads them as they are
    # nor DeepSeek-V4's bare fp32 vectors (norm weights, hyper-connections' base and scale, position biases), which
    # only element-wise ops read
    uncast = ("ssm", "vector") if experts_cast else ("ssm", "experts", "vector")
    torchao = fp8.is_torchao(setup.fp8)
    return [
        lin
        for lin in layer.linears
        if not (setup.method == "qlora" and lin.quantized_by_bnb)
        and lin.slot not in uncast
        # torchao's Float8Linear casts only its input to autocast's dtype (float8_linear.py:258-262); its fp8 weight
        # is a temporary, re-wrapped by autocast without a copy (float8_ops.py:442-463): no 16-bit copy
        and not (torchao and fp8.converted(spec, lin))
    ]


def _expert_copies(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, layer: LayerGroup) -> int:
    """Of one layer's copies (:func:`_weight_copies` ``.layer``), the routed experts' (what the explanation names:
    Llama 4's dense dispatch casts every expert)."""
    if not dt.autocast:
        return 0
    return sum(
        round_alloc(lin.weight_count * 2) for lin in _cast_linears(spec, setup, dt, layer) if lin.slot == "experts"
    )


def _head_adapter_copies(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Under autocast, the 16-bit casts of the embedding's and the lm_head's LoRA matrices that their matmuls
    save: lora_A and lora_B of the lm_head (fp32 leaves: cached, peft tuners/lora/layer.py ``Linear``), and the
    embedding's ``lora_embedding_B.T`` (``Embedding.forward``; ``F.embedding`` is not on autocast's lists, so
    lora_embedding_A is read as it is)."""
    if not setup.adapters:
        return 0
    r, h, v = setup.lora_rank, spec.hidden_size, spec.vocab_size
    out = 0
    for t in head_targets(spec, setup.lora_targets):
        out += round_alloc(r * h * 2) + (round_alloc(v * r * 2) if t.kind == "lm_head" else 0)
    return out


def _logit_width(spec: ModelSpec) -> int:
    """Logits per token: the vocabulary under an lm_head; none under a sequence-classification head."""
    return spec.vocab_size if spec.head == "lm" else 0


def _head_matrices(spec: ModelSpec) -> tuple[int, ...]:
    """Elements of the head's matmul weights, which autocast casts to 16 bits: the lm_head (or the tied
    embedding), or the pooler and the classifier."""
    if spec.head == "sequence_classification":
        return (spec.hidden_size * spec.hidden_size, spec.num_labels * spec.hidden_size)
    return (spec.vocab_size * spec.hidden_size,)


def _grad_bytes(states: _States, keep: Callable[[Tensor], bool]) -> int:
    """Gradient bytes (allocator-rounded) of the trainable tensors ``keep`` selects."""
    b = states.bytes_of
    return sum(round_alloc(t.numel * b[t.kind]) * t.count for t in states.tensors if t.trainable and keep(t))


#: the gradients the step's parts ask the states for, by name (:func:`_grads_of`)
_GRAD_SELECTIONS: dict[str, Callable[[Tensor], bool]] = {
    "head": lambda t: t.kind == "lm_head" or t.name == "final_norm",  # made at the head (lm_head, final norm)
    "embedding_prompt": lambda t: t.kind in ("embedding", "prompt"),
    "vision": lambda t: t.name.startswith(VISION_PREFIX),  # the tower's (images)
    "embedding": lambda t: t.kind == "embedding",
    "lm_head": lambda t: t.kind == "lm_head",
}


def _grads_of(states: _States, what: str) -> int:
    """:func:`_grad_bytes` of the tensors :data:`_GRAD_SELECTIONS` names, once per states."""
    hit = states.memo.get(what)
    if hit is None:
        hit = states.memo[what] = _grad_bytes(states, _GRAD_SELECTIONS[what])
    return hit
