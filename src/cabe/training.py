"""The training setup: how a model is trained (method, precision, optimizer, shapes).

A :class:`TrainingSetup` is a frozen, validated value. Every interface (CLI, Python
API, HTTP API, web page, trace) builds one of these and hands it to the core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Literal, get_args

from cabe.errors import InvalidValueError

Method = Literal["full", "lora", "qlora", "freeze", "prompt-tuning"]
Precision = Literal["fp32", "fp16-amp", "bf16-amp", "bf16", "fp16"]
Optimizer = Literal[
    "adamw", "adamw-8bit", "paged-adamw", "paged-adamw-8bit", "sgd", "sgd-momentum", "adafactor", "lion"
]
OptimizerImpl = Literal["foreach", "fused", "for-loop"]
Attention = Literal["eager", "sdpa", "flash"]
Quant = Literal["nf4", "fp4"]
ComputeDtype = Literal["bf16", "fp16", "fp32"]
Shard = Literal["none", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-hybrid"]
Offload = Literal["none", "optimizer", "parameters", "both"]

METHODS: tuple[str, ...] = get_args(Method)
PRECISIONS: tuple[str, ...] = get_args(Precision)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
OPTIMIZER_IMPLS: tuple[str, ...] = get_args(OptimizerImpl)
ATTENTIONS: tuple[str, ...] = get_args(Attention)
QUANTS: tuple[str, ...] = get_args(Quant)
COMPUTE_DTYPES: tuple[str, ...] = get_args(ComputeDtype)
SHARDS: tuple[str, ...] = get_args(Shard)
OFFLOADS: tuple[str, ...] = get_args(Offload)

#: LoRA targets when none are given: PEFT's default for the model type
#: (peft.utils.constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING). An empty tuple means "that default".
DEFAULT_LORA_TARGETS: tuple[str, ...] = ()

# Upper bounds that catch typos (a batch of 10^9) without limiting real use.
MAX_BATCH = 1 << 20
MAX_SEQ = 1 << 24
MAX_RANK = 1 << 16


@dataclass(frozen=True)
class TrainingSetup:
    """How the model is trained. All sizes are counts (tokens, sequences), not bytes.

    Args:
        method: ``full`` fine-tuning, ``lora``, ``qlora`` (4-bit frozen base + LoRA),
            ``freeze`` (train only the last ``trainable_layers`` blocks), or ``prompt-tuning``.
        precision: ``fp32``; ``fp16-amp`` / ``bf16-amp`` (autocast, fp32 weights, gradients and
            optimizer state); ``bf16`` / ``fp16`` (pure 16-bit weights, gradients and state).
        optimizer: optimizer family.
        optimizer_impl: AdamW implementation; ``None`` means what PyTorch picks on CUDA
            (``foreach``).
        batch: micro-batch size in sequences (what is on the GPU at once).
        seq: sequence length in tokens.
        grad_accum: gradient-accumulation steps (effective batch = batch × grad_accum).
        checkpointing: gradient (activation) checkpointing of every decoder layer.
        attention: ``eager`` (materialises the s×s scores), ``sdpa`` or ``flash``.
        lora_rank, lora_alpha, lora_targets: LoRA settings; targets as PEFT names
            (``q_proj``...) or ``("all-linear",)``.
        quant, double_quant, compute_dtype: QLoRA (bitsandbytes) settings.
        trainable_layers: for ``freeze``, how many of the last decoder layers train.
        prompt_tokens: for ``prompt-tuning``, the number of virtual tokens.
        gpus: data-parallel world size × tp × pp (total GPUs); memory is reported per GPU.
        shard: ``none`` (one GPU), ``ddp``, DeepSpeed ``zero1``/``zero2``/``zero3``, ``fsdp``
            (full sharding), ``fsdp-hybrid`` (shard within a node, replicate across nodes).
        offload: CPU offload of optimizer state and/or parameters (ZeRO-Offload / FSDP offload).
        tp, pp, ep: tensor-, pipeline- and expert-parallel degrees.
        gpus_per_node: GPUs in one node (hybrid sharding and host-RAM-per-node figures).
    """

    method: Method = "full"
    precision: Precision = "bf16-amp"
    optimizer: Optimizer = "adamw"
    optimizer_impl: OptimizerImpl | None = None
    batch: int = 1
    seq: int = 512
    grad_accum: int = 1
    checkpointing: bool = False
    attention: Attention = "sdpa"
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    quant: Quant = "nf4"
    double_quant: bool = True
    compute_dtype: ComputeDtype = "bf16"
    trainable_layers: int = 1
    prompt_tokens: int = 20
    gpus: int = 1
    shard: Shard = "none"
    offload: Offload = "none"
    tp: int = 1
    pp: int = 1
    ep: int = 1
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        _choice("method", self.method, METHODS)
        _choice("precision", self.precision, PRECISIONS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.optimizer_impl is not None:
            _choice("optimizer_impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        _choice("attention", self.attention, ATTENTIONS)
        _choice("quant", self.quant, QUANTS)
        _choice("compute_dtype", self.compute_dtype, COMPUTE_DTYPES)
        _int_range("batch", self.batch, 1, MAX_BATCH)
        _int_range("seq", self.seq, 1, MAX_SEQ)
        _int_range("grad_accum", self.grad_accum, 1, MAX_BATCH)
        _int_range("lora_rank", self.lora_rank, 1, MAX_RANK)
        _int_range("trainable_layers", self.trainable_layers, 0, 1 << 12)
        _int_range("prompt_tokens", self.prompt_tokens, 1, MAX_SEQ)
        _choice("shard", self.shard, SHARDS)
        _choice("offload", self.offload, OFFLOADS)
        for name in ("gpus", "tp", "pp", "ep", "gpus_per_node"):
            _int_range(name, getattr(self, name), 1, 1 << 20)
        number("lora_alpha", self.lora_alpha, minimum=0.0, strict=True)
        if isinstance(self.lora_targets, str):
            object.__setattr__(self, "lora_targets", parse_targets(self.lora_targets))
        elif isinstance(self.lora_targets, list):
            object.__setattr__(self, "lora_targets", tuple(str(t) for t in self.lora_targets))
        if not isinstance(self.lora_targets, tuple):
            raise InvalidValueError("not_string", "lora_targets", value=self.lora_targets)
        for flag in ("checkpointing", "double_quant"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidValueError("not_bool", flag, value=getattr(self, flag))

    # ---- derived quantities -------------------------------------------------------------
    @property
    def effective_batch(self) -> int:
        """Sequences per optimizer step: micro-batch × accumulation steps."""
        return self.batch * self.grad_accum

    @property
    def tokens(self) -> int:
        """Tokens on the GPU at once: micro-batch × sequence length."""
        return self.batch * self.seq

    @property
    def resolved_optimizer_impl(self) -> str:
        """The AdamW implementation PyTorch uses: ``foreach`` on CUDA unless told otherwise."""
        if self.optimizer_impl is not None:
            return self.optimizer_impl
        return "foreach"

    @property
    def distributed(self) -> bool:
        """True when memory is split or replicated over several GPUs (or offloaded)."""
        return self.gpus > 1 or self.shard != "none" or self.offload != "none" or self.tp > 1 or self.pp > 1

    @property
    def adapters(self) -> bool:
        return self.method in ("lora", "qlora")

    def with_(self, **changes: object) -> TrainingSetup:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out


def parse_targets(text: str) -> tuple[str, ...]:
    """``"q_proj,v_proj"`` -> ``("q_proj", "v_proj")``; ``"all-linear"`` stays one token."""
    parts = tuple(p.strip() for p in str(text).replace("+", ",").split(",") if p.strip())
    if not parts:
        raise InvalidValueError("empty_list", "lora_targets")
    return parts


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InvalidValueError("bad_choice", name, value=value, allowed=", ".join(allowed))


def _int_range(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValueError("not_integer", name, value=value)
    if value < lo or value > hi:
        raise InvalidValueError("out_of_range", name, value=value, minimum=lo, maximum=hi)


def number(
    name: str,
    value: object,
    *,
    minimum: float = 0.0,
    maximum: float = 1e15,
    strict: bool = False,
) -> float:
    """Validate a finite real number in range; ``strict`` means ``value > minimum``."""
    if isinstance(value, bool):
        raise InvalidValueError("not_number", name, value=value)
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidValueError("not_number", name, value=value) from None
    if math.isnan(x) or math.isinf(x):
        raise InvalidValueError("not_finite", name, value=value)
    if (strict and x <= minimum) or x < minimum:
        code = "must_be_positive" if strict and minimum == 0 else "out_of_range"
        raise InvalidValueError(code, name, value=value, minimum=minimum, maximum=maximum)
    if x > maximum:
        raise InvalidValueError("out_of_range", name, value=value, minimum=minimum, maximum=maximum)
    return x
