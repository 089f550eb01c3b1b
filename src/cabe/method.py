"""Training method: which parameters train, LoRA adapter sizes, and QLoRA 4-bit storage.

This module is also the LoRA parameter calculator: :func:`lora_parameters` gives the adapter
parameter count per target module, r × (in_features + out_features) for each adapted weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cabe.architecture import Linear, ModelSpec
from cabe.errors import InvalidValueError
from cabe.training import TrainingSetup

#: bitsandbytes 4-bit: one absmax per block of 64 weights; double quantization stores those
#: absmax values as 8-bit with one fp32 scale per 256 of them (Dettmers et al., QLoRA §3).
QUANT_BLOCK = 64
DOUBLE_QUANT_BLOCK = 256
QUANT_CODE_BYTES = 16 * 4  # the 16-entry NF4/FP4 code book, fp32
DOUBLE_QUANT_CODE_BYTES = 256 * 4  # the 8-bit dynamic code for the absmax values


@dataclass(frozen=True)
class Tensor:
    """A group of identical parameter tensors: ``count`` tensors of ``numel`` elements each."""

    name: str
    numel: int
    count: int
    trainable: bool
    kind: str  # "base" | "norm" | "embedding" | "lm_head" | "adapter" | "quantized" | "prompt"
    rows: int = 0  # for 2-D tensors (Adafactor factors rows + cols)
    cols: int = 0

    @property
    def total(self) -> int:
        return self.numel * self.count


@dataclass(frozen=True)
class LoraTarget:
    name: str
    in_features: int
    out_features: int
    per_layer: int  # how many modules with this name in one layer
    parameters: int  # r*(in+out)*per_layer*num_layers


def lora_targets(spec: ModelSpec, targets: tuple[str, ...]) -> tuple[Linear, ...]:
    """The adapted weight matrices of one layer, as PEFT matches ``target_modules``.

    ``all-linear`` matches every ``nn.Linear`` / ``Conv1D`` in the layers (PEFT excludes the output
    layer). Raises :class:`InvalidValueError` for a name the model does not have.
    """
    names = spec.linear_names
    if not targets:
        targets = spec.peft_default_targets  # PEFT's default for the model type (the family module's)
    if any(t == "all-linear" for t in targets):
        wanted = set(names)
    else:
        unknown = [t for t in targets if t not in names]
        if unknown:
            raise InvalidValueError(
                "unknown_lora_target",
                "lora_targets",
                value=", ".join(unknown),
                allowed=", ".join(names) + ", all-linear",
            )
        wanted = set(targets)
    return tuple(lin for lin in spec.layer_linears if lin.is_module and lin.name in wanted)


def lora_parameters(spec: ModelSpec, rank: int, targets: tuple[str, ...]) -> list[LoraTarget]:
    """Adapter parameters per target module name: rank × (in + out) per adapted matrix."""
    out: dict[str, LoraTarget] = {}
    for lin in lora_targets(spec, targets):
        prev = out.get(lin.name)
        per = rank * (lin.in_features + lin.out_features) * spec.num_layers
        if prev is None:
            out[lin.name] = LoraTarget(lin.name, lin.in_features, lin.out_features, 1, per)
        else:  # e.g. GPT-2's c_proj exists in attention and MLP
            out[lin.name] = LoraTarget(
                lin.name, prev.in_features, prev.out_features, prev.per_layer + 1, prev.parameters + per
            )
    return list(out.values())


def quantized_bytes(numel: int, double_quant: bool) -> int:
    """bitsandbytes 4-bit storage of one weight of ``numel`` elements, in bytes.

    packed weights numel/2 + absmax (fp32 per 64, or 8-bit per 64 + fp32 per 256×64 with double
    quantization) + code books. Per parameter: 0.5 + 4/64 = 0.5625 B, or 0.5 + 1/64 + 4/(64·256)
    ≈ 0.5159 B with double quantization.
    """
    packed = (numel + 1) // 2
    blocks = -(-numel // QUANT_BLOCK)
    if double_quant:
        blocks2 = -(-blocks // DOUBLE_QUANT_BLOCK)
        # absmax uint8 + absmax2 fp32 + nested code + offset (fp32 scalar)
        state = blocks + 4 * blocks2 + DOUBLE_QUANT_CODE_BYTES + 4
    else:
        state = 4 * blocks
    return packed + state + QUANT_CODE_BYTES


def parameter_tensors(spec: ModelSpec, setup: TrainingSetup) -> list[Tensor]:
    """Every parameter tensor (grouped), marked trainable or frozen for the setup's method."""
    method = setup.method
    layers = spec.num_layers
    frozen_base = method in ("lora", "qlora", "prompt-tuning")
    quantize = method == "qlora"
    tensors: list[Tensor] = []

    def add(name: str, numel: int, count: int, trainable: bool, kind: str, rows: int = 0, cols: int = 0) -> None:
        if numel and count:
            tensors.append(Tensor(name, numel, count, trainable, kind, rows, cols))

    if method == "freeze":
        k = min(setup.trainable_layers, layers)
        groups = [(layers - k, False), (k, True)]
    else:
        groups = [(layers, not frozen_base)]
    emb_trainable = method == "full"
    add("embed_tokens", spec.embedding_count, 1, emb_trainable, "embedding", spec.vocab_size, spec.hidden_size)
    add(
        "position_embeddings",
        spec.position_embedding_count,
        1,
        emb_trainable,
        "embedding",
        spec.max_positions,
        spec.hidden_size,
    )
    add(
        "token_type_embeddings",
        spec.token_type_count,
        1,
        emb_trainable,
        "embedding",
        spec.token_types,
        spec.hidden_size,
    )
    for count, trainable in groups:
        for lin in spec.layer_linears:
            if quantize and lin.quantized_by_bnb:
                add(lin.name, lin.in_features * lin.out_features * lin.copies, count, False, "quantized")
            else:
                rows, cols = lin.out_features, lin.in_features
                add(lin.name, lin.in_features * lin.out_features, count * lin.copies, trainable, "base", rows, cols)
            if lin.bias:
                add(lin.name + ".bias", lin.out_features, count * lin.copies, trainable, "base")
        add(
            "norm",
            spec.norm_param_count // (2 if spec.norm_bias else 1),
            count * spec.norms_per_layer * (2 if spec.norm_bias else 1),
            trainable,
            "norm",
        )
        if spec.qk_norm == "head":
            add("qk_norm", spec.head_dim, 2 * count, trainable, "norm")
        elif spec.qk_norm == "full":
            add("q_norm", spec.q_dim, count, trainable, "norm")
            add("k_norm", spec.kv_dim, count, trainable, "norm")
    add("final_norm", spec.hidden_size, 2 if spec.norm_bias else 1, method == "full", "norm")
    add("lm_head", spec.lm_head_count, 1, method == "full", "lm_head", spec.vocab_size, spec.hidden_size)
    if spec.classifier_count:  # BertForSequenceClassification: pooler.dense and classifier, with biases
        h, n = spec.hidden_size, spec.num_labels
        add("pooler", h * h, 1, method == "full", "lm_head", h, h)
        add("pooler.bias", h, 1, method == "full", "lm_head")
        add("classifier", n * h, 1, method == "full", "lm_head", n, h)
        add("classifier.bias", n, 1, method == "full", "lm_head")
    if setup.adapters:
        r = setup.lora_rank
        for lin in lora_targets(spec, setup.lora_targets):
            add(lin.name + ".lora_A", r * lin.in_features, layers, True, "adapter", r, lin.in_features)
            add(lin.name + ".lora_B", lin.out_features * r, layers, True, "adapter", lin.out_features, r)
    if method == "prompt-tuning":
        add(
            "prompt_embeddings",
            setup.prompt_tokens * spec.hidden_size,
            1,
            True,
            "prompt",
            setup.prompt_tokens,
            spec.hidden_size,
        )
    return tensors


def stored_bytes(t: Tensor, setup: TrainingSetup, dt: Any) -> int:
    """Bytes per element of a parameter tensor as stored, for the setup's dtypes ``dt``.

    The one rule both the single-GPU estimate and the sharding plans use.
    """
    if t.kind == "adapter":
        return dt.adapter
    if t.kind == "prompt":
        return 4  # PEFT's prompt embeddings are fp32
    if t.kind in ("norm", "embedding", "lm_head") and setup.method == "qlora":
        return 4  # prepare_model_for_kbit_training casts them to fp32
    return dt.weight if t.trainable else dt.frozen


def trainable_count(tensors: list[Tensor]) -> int:
    return sum(t.total for t in tensors if t.trainable)
