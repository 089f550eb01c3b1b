"""The activations of every run of layers: one decoder layer's saved tensors per kind of layer
(:func:`cabe.activations.layer_activations`), composed over the runs with the masked layers, the bottom layer of the
gradient's path (its input requires no grad), packing's row shape and the head (:func:`_layer_activations`).
Proved by tests/core_torch/test_saved_tensors.py, tests/trace/test_bottom_layer.py, tests/trace/test_layer_groups.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cabe import memo
from cabe.activations import (
    LayerActivations,
    checkpointed_layer_bytes_per_token,
    layer_activations,
)
from cabe.architecture import ModelSpec
from cabe.facts import sdpa_masked_layers
from cabe.frozen import cached, evolve, quick
from cabe.layers import LayerGroup
from cabe.method import head_targets, lora_parameter_targets, running_lora_targets, saved_modules
from cabe.precision import Dtypes
from cabe.training import TrainingSetup


def _row_shape(setup: TrainingSetup) -> TrainingSetup:
    """The shape the layers see: padding-free flattens the batch to one row of batch × seq tokens (TRL's
    ``padding_free``, transformers' DataCollatorWithFlattening, data/data_collator.py:1261-1290). One sequence
    flattened is a plain row: its position_ids never restart, transformers finds no documents
    (masking_utils.py:761-762) and SDPA keeps ``is_causal`` (flash), as unpacked."""
    if setup.packing != "padding-free":
        return setup
    if setup.batch == 1:
        return setup.with_(packing="none")
    return memo.reshaped(setup, 1, setup.batch * setup.seq)  # (setup.with_ without validating the rest again)


def _packed_mask(spec: ModelSpec, setup: TrainingSetup) -> bool:
    """Packed or padding-free rows under SDPA: position_ids that restart per document and no attention mask
    make transformers find the documents (masking_utils.py:862-870, ``find_packed_sequence_indices``) and
    build a block-diagonal mask, never ``is_causal`` (masking_utils.py:990-1002: ``allow_is_causal_skip =
    False``); with a mask SDPA cannot run flash (activations.masked_sdpa_kind). flash-attn takes the varlen
    path instead (modeling_flash_attention_utils.py:564, ``_is_packed_sequence``): no mask, memory per token."""
    return setup.packing != "none" and setup.attention == "sdpa" and not spec.sdpa_fallback


def _masked_layers(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Layers whose SDPA gets a mask: every one for packed rows, or with images a tower makes the decoder attend
    both ways (Gemma 3's token_type_ids: :attr:`cabe.vision.tower.VisionTower.image_mask`), else the sliding /
    windowed ones."""
    images = setup.images and setup.attention == "sdpa" and spec.vision is not None and spec.vision.image_mask
    return spec.num_layers if _packed_mask(spec, setup) or images else sdpa_masked_layers(spec, setup)


@quick
@dataclass(frozen=True)
class _RunActivations:
    """What one layer of a run of like layers in the gradient's path saves."""

    group: LayerGroup
    count: int  # layers of the run in the gradient's path
    per_layer: LayerActivations
    full_layer_bytes: int  # what one layer saves without checkpointing
    saved_layer_bytes: int  # what it keeps through the forward (its input, under checkpointing)
    plain_layer_bytes: int = 0  # what a layer left out of selective checkpointing keeps (its full activations)
    recompute_bytes: int = 0  # checkpointing: what recomputing one layer allocates (its input is there already)


@quick
@dataclass(frozen=True)
class _Activations:
    """What one step saves, run by run of like layers, and through how many layers the gradient flows."""

    tokens: int  # batch × tokens per sequence
    runs: tuple[_RunActivations, ...]  # the gradient's path, bottom first (the top run alone when empty)
    rotary: int  # cos and sin tables, shared by every layer
    grad_layers: int
    first: int = 0  # the model's index of the gradient path's bottom layer
    every: int = 0  # checkpointing: every ``every``-th layer is checkpointed (1: all; 0: no checkpointing)
    offload: bool = False  # the checkpointed layers' inputs wait on the host
    #: checkpointing layers other modules come before in ``model.modules()``: transformers counts every
    #: GradientCheckpointingLayer for ``every_n_layers`` (modeling_utils.py:3239-3247), a vision tower's blocks first
    index_offset: int = 0

    @property
    def per_layer(self) -> LayerActivations:
        """The top run's layer: the one figure of a model whose layers are alike."""
        return self.runs[-1].per_layer

    def pieces(self) -> tuple[tuple[_RunActivations, int, bool], ...]:
        """The gradient's path, bottom first, as (run, layers, checkpointed) pieces: under selective
        checkpointing transformers checkpoints the layers whose index is a multiple of ``every``
        (transformers 5.24 modeling_utils.py:3245-3247, ``layer_index % every_n_layers == 0``)."""
        return self._pieces

    @cached
    def _pieces(self) -> tuple[tuple[_RunActivations, int, bool], ...]:
        # computed once per estimate (several parts walk the path); without selective checkpointing each run is
        # one piece, so the walk is per run rather than per layer
        if self.every in (0, 1):
            return tuple((r, r.count, self.every == 1) for r in self.runs if r.count)
        out: list[tuple[_RunActivations, int, bool]] = []
        i = self.first
        for r in self.runs:
            for _ in range(r.count):
                ckpt = self.checkpointed(i)
                if out and out[-1][0] is r and out[-1][2] == ckpt:
                    out[-1] = (r, out[-1][1] + 1, ckpt)
                else:
                    out.append((r, 1, ckpt))
                i += 1
        return tuple(out)

    def checkpointed(self, i: int) -> bool:
        """Whether the model's layer ``i`` (from the bottom) is checkpointed."""
        return self.every > 0 and (i + self.index_offset) % self.every == 0

    def kept(self, r: _RunActivations, ckpt: bool) -> int:
        """What one layer keeps on the device through the forward: its input when checkpointed (nothing when
        that input is offloaded), its full activations when left out of selective checkpointing."""
        if not ckpt:
            return r.plain_layer_bytes
        return 0 if self.offload else r.saved_layer_bytes

    @property
    def saved_bytes(self) -> int:
        """What every layer of the gradient's path keeps through the forward (on the device)."""
        return sum(n * self.kept(r, ckpt) for r, n, ckpt in self.pieces())

    @property
    def checkpointed_layers(self) -> int:
        """Layers of the gradient's path that are checkpointed."""
        return sum(n for _, n, ckpt in self.pieces() if ckpt)

    def offloaded_bytes(self, layers: int) -> int:
        """Host bytes of the inputs of the checkpointed layers among the model's ``layers`` (offloading)."""
        if not self.offload:
            return 0
        return sum(1 for i in range(layers) if self.checkpointed(i)) * self.runs[-1].saved_layer_bytes

    @property
    def saved_layer_bytes(self) -> int:
        """What one layer keeps (the mean over the gradient's path when the layers differ)."""
        return self.saved_bytes // self.grad_layers if self.grad_layers else self.runs[-1].saved_layer_bytes

    def mean(self, of: Callable[[_RunActivations], int]) -> int:
        """A per-layer figure over the gradient's path (exact when the layers are alike)."""
        if not self.grad_layers:
            return of(self.runs[-1])
        total = 0
        for r in self.runs:
            total += r.count * of(r)
        return total // self.grad_layers


def _grad_path(spec: ModelSpec, setup: TrainingSetup) -> tuple[int, int, tuple[tuple[LayerGroup, int], ...], bool]:
    """The layers the gradient flows through (their count, the trained ones, the path as (run, layers) bottom
    first) and whether the lowest one's input requires no grad. Independent of the batch and the sequence: once per
    model and request less its shape (cabe.memo)."""
    m, key = memo.of(spec), ("grad_path", memo.request_key(setup))
    hit = m.get(key)
    if hit is None:
        layers = spec.num_layers
        if setup.method == "freeze":
            grad_layers = min(setup.trainable_layers, layers)
            trainable_layers = grad_layers
        else:
            grad_layers = layers - _below_adapters(spec, setup)
            trainable_layers = layers if setup.method == "full" else 0
        path = tuple((run, n) for run, n, trained in spec.top_split(grad_layers) if trained)
        hit = m[key] = (grad_layers, trainable_layers, path, _input_needs_no_grad(spec, setup))
    return hit


def _layer_activations(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> _Activations:
    layers = spec.num_layers
    grad_layers, trainable_layers, path, input_needs_no_grad = _grad_path(spec, setup)
    tokens = setup.batch * setup.tokens_per_sequence
    # runs of one kind of layer (dense, MoE, dense, MoE ...) share their figures: worked out once per kind
    kinds: dict[tuple[Any, ...], _RunActivations] = {}
    for run, n in path:
        if _kind(run) not in kinds:  # (made with the first run's place: the others are placed below)
            kinds[_kind(run)] = _run_activations(spec, setup, dt, run, n, tokens, trainable_layers > 0)
    runs = tuple(_placed(kinds[_kind(run)], run, n) for run, n in path)
    if runs and not trainable_layers and input_needs_no_grad:
        # the path's lowest layer saves only from its first adapted module on (activations.state.LayerState.live)
        low = _run_activations(spec, setup, dt, path[0][0], 1, tokens, False, bottom=True)
        runs = (low, *((evolve(runs[0], count=runs[0].count - 1),) if runs[0].count > 1 else ()), *runs[1:])
    if not runs:  # no layer in the gradient's path: the top layer, for the figures that explain it
        runs = (_run_activations(spec, setup, dt, spec.runs[-1], 0, tokens, False),)
    # cos and sin tables, (1, s, rotary_dim) in the residual dtype, shared by every layer
    seq_total = tokens // setup.batch
    rotary = 2 * seq_total * spec.rotary_dim * dt.residual if spec.position == "rotary" else 0
    ckpt = setup.checkpointing
    return _Activations(
        tokens,
        runs,
        rotary,
        grad_layers,
        first=layers - grad_layers,
        every=setup.checkpoint_every if ckpt else 0,
        offload=ckpt and setup.offload_activations,
        index_offset=spec.vision.depth if spec.vision is not None else 0,  # Qwen2.5-VL's tower blocks come first
    )


def _placed(r: _RunActivations, group: LayerGroup, count: int) -> _RunActivations:
    """``replace(r, group=group, count=count)``, without the copy when nothing changes (the common case)."""
    return r if r.group is group and r.count == count else evolve(r, group=group, count=count)


def _input_needs_no_grad(spec: ModelSpec, setup: TrainingSetup) -> bool:
    """Whether the decoder's first layer gets an input that requires no grad: LoRA / QLoRA without checkpointing
    (with it ``enable_input_require_grads`` makes every layer's input require grad), no adapted or trained
    embedding, no images (a vision tower's LoRA, PEFT's default on Gemma 3, makes the image features require grad)."""
    if not setup.adapters or setup.checkpointing or setup.images:
        return False
    return not any(t.kind == "embedding" for t in head_targets(spec, setup.lora_targets) + saved_modules(spec, setup))


def _below_adapters(spec: ModelSpec, setup: TrainingSetup) -> int:
    """LoRA without checkpointing: the bottom layers with no adapter that runs carry no gradient (no tensor in
    them requires grad, so autograd records nothing there). A hybrid whose targets sit only in some layers
    (q_proj, v_proj: Granite-4.0-H's attention layers) trains from its lowest adapted layer. With checkpointing
    ``enable_input_require_grads`` makes every layer's input require grad (transformers' Trainer, PEFT's
    prepare_model_for_kbit_training); an adapted embedding does the same. A Mamba-2 layer's out_proj (slot ``o``)
    runs inside the fused kernel, which multiplies its base weight: its adapter never runs (cabe.ssm)."""
    if not setup.adapters or setup.checkpointing:
        return 0
    if any(t.kind == "embedding" for t in head_targets(spec, setup.lora_targets) + saved_modules(spec, setup)):
        return 0
    # an adapted lm_head alone trains above every layer: none of them carries a gradient (phi-3-mini LoRA on
    # lm_head only, no checkpointing: +23% with every layer in the gradient's path)
    below = 0
    for run in spec.runs:
        if running_lora_targets(spec, setup.lora_targets, run) or lora_parameter_targets(spec, setup.lora_targets, run):
            return below
        below += run.count
    return below


def _kind(run: LayerGroup) -> tuple[Any, ...]:
    """What a run's per-layer figures depend on: its tensors, not its length or attention span."""
    # NOTE: by identity, so as not to hash every Linear of every run: a family builds the runs of one kind
    # from one tuple of linears (two equal tuples only cost a second, equal computation)
    return (id(run.linears), run.mlp, run.intermediate_size, run.rope)


def _run_activations(
    spec: ModelSpec,
    setup: TrainingSetup,
    dt: Dtypes,
    run: LayerGroup,
    count: int,
    tokens: int,
    trained: bool,
    bottom: bool = False,
) -> _RunActivations:
    kw: dict[str, bool] = (
        {"base_trainable": True, "adapters": False}
        if trained
        else {"base_trainable": False, "adapters": setup.adapters, "bottom": bottom}
    )
    per_layer = layer_activations(spec, setup, dt, group=run, **kw)
    full_layer_bytes = tokens * per_layer.bytes_per_token + per_layer.constant_bytes
    mean_layer_bytes = full_layer_bytes
    masked = _masked_layers(spec, setup)
    if masked:  # layers whose SDPA gets a mask run another kernel (activations.sdpa_masked_layers)
        # NOTE: each run is given the model's share of masked layers: exact when the model is one run (every
        # family with masked layers today); a model with several runs and masked layers gets their mean
        layers = spec.num_layers
        per_masked = layer_activations(spec, setup, dt, group=run, masked=True, **kw)
        masked_bytes = tokens * per_masked.bytes_per_token + per_masked.constant_bytes
        # the mean over the layers, and the larger layer for the one being recomputed
        mean_layer_bytes = round((full_layer_bytes * (layers - masked) + masked_bytes * masked) / layers)
        full_layer_bytes = max(full_layer_bytes, masked_bytes)
        per_layer = per_masked if 2 * masked >= layers else per_layer
    if setup.checkpointing:
        saved_layer_bytes = tokens * checkpointed_layer_bytes_per_token(dt) * spec.residual_width
    else:
        saved_layer_bytes = mean_layer_bytes
    recompute_bytes = full_layer_bytes - tokens * per_layer.input_alias_per_token
    return _RunActivations(
        run, count, per_layer, full_layer_bytes, saved_layer_bytes, mean_layer_bytes, recompute_bytes
    )
