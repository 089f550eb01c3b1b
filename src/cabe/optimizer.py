"""Optimizers: one registry entry each — state bytes, step temporaries, the lesson's bytes per parameter,
the extras they need, the names other tools give them, and how the trace builds them.

State lives in the parameter's dtype for torch optimizers (``zeros_like(p)``): fp32 params keep
fp32 moments, pure-bf16 params keep bf16 moments. bitsandbytes' 32-bit optimizers (Lion, paged AdamW)
keep fp32 state whatever the parameter dtype. bitsandbytes 8-bit optimizers keep uint8
moments with an fp32 absmax per block of 256 for tensors of at least 4096 elements (smaller
tensors get 32-bit state). Paged optimizers allocate their state in CUDA unified memory
(cudaMallocManaged): it is not counted by PyTorch's allocator and can be evicted to host memory,
so cabe reports it beside the peak rather than inside it.

Adding an optimizer: one :class:`Optimizer` entry in :data:`REGISTRY` (its state rule below, or a new one),
the catalog sentences ``step.optimizer.<name>`` and ``step.lesson.optimizer.<name>`` (en, es), and the trace
factory in :mod:`cabe.trace.optim` named by ``trace_factory``.

This module imports nothing heavy: :mod:`cabe.schema` reads the names from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cabe.units import round_alloc

if TYPE_CHECKING:
    from cabe.method import Tensor
    from cabe.training import TrainingSetup

BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes Optimizer8bit min_8bit_size
BNB_BLOCK = 256  # blockwise quantization block for 8-bit optimizer state
BNB_PAGED_MIN = 100_000  # Optimizer.get_state_buffer pages only tensors of at least 1e5 elements


# ---- state rules: bytes of one copy of a tensor's optimizer state --------------------------------
#: ``(tensor, parameter bytes per element, optimizer_impl) -> bytes`` for one of ``tensor.count`` copies.
StateRule = Callable[["Tensor", int, str], int]


def _no_state(t: Tensor, b: int, impl: str) -> int:
    return 0


def _torch_adam(t: Tensor, b: int, impl: str) -> int:
    # torch keeps both moments in the parameter's dtype; fused keeps a step tensor on the device per param
    return 2 * round_alloc(t.numel * b) + (round_alloc(4) if impl == "fused" else 0)


def _bnb_adam_32bit(t: Tensor, b: int, impl: str) -> int:
    return 2 * round_alloc(t.numel * 4)


def _bnb_adam_8bit(t: Tensor, b: int, impl: str) -> int:
    if t.numel >= BNB_MIN_8BIT_SIZE:
        return 2 * round_alloc(t.numel) + _bnb_8bit_absmax(t, b, impl)
    return 2 * round_alloc(4 * t.numel)


def _bnb_8bit_absmax(t: Tensor, b: int, impl: str) -> int:
    """The two fp32 absmax vectors of a block-wise 8-bit state. bitsandbytes allocates them with
    ``torch.zeros(..., device=p.device)`` (bitsandbytes/optim/optimizer.py, ``Optimizer2State.init_state``),
    not through ``get_state_buffer``: a paged optimizer keeps them in device memory."""
    if t.numel < BNB_MIN_8BIT_SIZE:
        return 0
    return 2 * round_alloc(4 * -(-t.numel // BNB_BLOCK))


def _one_moment(t: Tensor, b: int, impl: str) -> int:
    return round_alloc(t.numel * b)


def _one_fp32_moment(t: Tensor, b: int, impl: str) -> int:
    # bitsandbytes' Lion (the Trainer's lion_32bit): one fp32 momentum, whatever the parameter dtype
    return round_alloc(t.numel * 4)


def _factored(t: Tensor, b: int, impl: str) -> int:
    if t.rows and t.cols:
        return round_alloc(t.rows * b) + round_alloc(t.cols * b)
    return round_alloc(t.numel * b)


# ---- temporaries of optimizer.step(), by implementation ------------------------------------------
#: ``impl -> "all"`` (a copy of every trainable tensor at once), ``"largest"`` (two copies of the
#: largest tensor) or nothing.
_ADAMW_TEMPS = {"foreach": "all", "for-loop": "largest"}  # torch._foreach_sqrt / exp_avg_sq.sqrt()
_ADAFACTOR_TEMPS = {"foreach": "all", "fused": "largest", "for-loop": "largest"}


@dataclass(frozen=True)
class Optimizer:
    """One optimizer as cabe models it.

    Args:
        name: the name on every interface (``--optimizer``, ``"optimizer"`` in JSON).
        moments: state tensors per parameter (for explanations).
        state: bytes of one tensor's state (:data:`StateRule`).
        paged: state of tensors of at least :data:`BNB_PAGED_MIN` elements lives in unified memory.
        temporaries: ``optimizer_impl -> "all" | "largest"``: what ``optimizer.step()`` allocates.
        lesson_bytes_per_param: the lesson's state bytes per parameter with fp32 moments.
        lesson_follows_dtype: the lesson halves the state for pure 16-bit parameters.
        extras: Python packages it needs beyond torch (pip names).
        hf_optim: transformers ``TrainingArguments.optim`` names -> the ``optimizer_impl`` they imply.
        classes: optimizer classes (lower-case dotted paths, torchtune ``_component_``) that are this one.
        deepspeed_types: DeepSpeed ``optimizer.type`` values (lower case) that are this one.
        impl_flags: the implementation switches a config may set (``fused=True``, ``foreach=True``).
        with_momentum: the entry a ``momentum > 0`` turns it into (``sgd`` -> ``sgd-momentum``).
        trace_factory: ``"module:function"`` that builds it on the traced model (:mod:`cabe.trace`).
    """

    name: str
    moments: int
    state: StateRule
    paged: bool = False
    temporaries: tuple[tuple[str, str], ...] = ()
    lesson_bytes_per_param: int = 0
    lesson_follows_dtype: bool = False
    extras: tuple[str, ...] = ()
    hf_optim: tuple[tuple[str, str | None], ...] = ()
    classes: tuple[str, ...] = ()
    deepspeed_types: tuple[str, ...] = ()
    impl_flags: tuple[str, ...] = ()
    with_momentum: str = ""
    trace_factory: str = ""
    resident: StateRule = _no_state

    def device_and_paged(self, t: Tensor, b: int, impl: str) -> tuple[int, int]:
        """One copy of ``t``'s state split into (device memory, unified memory): a paged optimizer pages
        the state buffers of tensors of at least :data:`BNB_PAGED_MIN` elements, except its ``resident``
        part (8-bit absmax)."""
        per = self.state(t, b, impl)
        if self.paged and t.numel >= BNB_PAGED_MIN:
            kept = self.resident(t, b, impl)
            return kept, per - kept
        return per, 0


REGISTRY: tuple[Optimizer, ...] = (
    Optimizer(
        "adamw",
        moments=2,
        state=_torch_adam,
        temporaries=tuple(_ADAMW_TEMPS.items()),
        lesson_bytes_per_param=8,
        lesson_follows_dtype=True,
        hf_optim=(
            ("adamw_torch", None),
            ("adamw_hf", "for-loop"),
            ("adamw_torch_fused", "fused"),
            ("adamw_apex_fused", "fused"),
            ("adamw_torch_xla", None),
            ("adamw_torch_npu_fused", "fused"),
            ("adamw", None),
        ),
        classes=("torch.optim.adamw", "torch.optim.adam"),
        deepspeed_types=("adamw", "adam"),
        impl_flags=("fused", "foreach"),
        trace_factory="cabe.trace.optim:adamw",
    ),
    Optimizer(
        "adamw-8bit",
        moments=2,
        state=_bnb_adam_8bit,
        lesson_bytes_per_param=2,
        extras=("bitsandbytes",),
        hf_optim=(("adamw_bnb_8bit", None), ("adamw_8bit", None), ("adamw_torch_8bit", None)),
        classes=(
            "bitsandbytes.optim.adamw8bit",
            "bitsandbytes.optim.adam8bit",
            "torchao.optim.adamw8bit",
            "torchao.prototype.low_bit_optim.adamw8bit",
        ),
        trace_factory="cabe.trace.optim:adamw_8bit",
    ),
    Optimizer(
        "paged-adamw",
        moments=2,
        state=_bnb_adam_32bit,
        paged=True,
        lesson_bytes_per_param=8,
        lesson_follows_dtype=True,
        extras=("bitsandbytes",),
        hf_optim=(("paged_adamw_32bit", None), ("paged_adamw", None)),
        classes=("bitsandbytes.optim.pagedadamw", "bitsandbytes.optim.pagedadamw32bit"),
        trace_factory="cabe.trace.optim:paged_adamw",
    ),
    Optimizer(
        "paged-adamw-8bit",
        moments=2,
        state=_bnb_adam_8bit,
        paged=True,
        lesson_bytes_per_param=2,
        extras=("bitsandbytes",),
        hf_optim=(("paged_adamw_8bit", None),),
        classes=("bitsandbytes.optim.pagedadamw8bit",),
        resident=_bnb_8bit_absmax,
        trace_factory="cabe.trace.optim:paged_adamw_8bit",
    ),
    Optimizer(
        "sgd",
        moments=0,
        state=_no_state,
        hf_optim=(("sgd", None),),
        classes=("torch.optim.sgd",),
        deepspeed_types=("sgd",),
        with_momentum="sgd-momentum",
        trace_factory="cabe.trace.optim:sgd",
    ),
    Optimizer(
        "sgd-momentum",
        moments=1,
        state=_one_moment,
        lesson_bytes_per_param=4,
        lesson_follows_dtype=True,
        trace_factory="cabe.trace.optim:sgd_momentum",
    ),
    Optimizer(
        "adafactor",
        moments=1,
        state=_factored,
        temporaries=tuple(_ADAFACTOR_TEMPS.items()),
        hf_optim=(("adafactor", None),),
        trace_factory="cabe.trace.optim:adafactor",
    ),
    Optimizer(
        "lion",
        moments=1,
        state=_one_fp32_moment,
        lesson_bytes_per_param=4,
        lesson_follows_dtype=True,
        extras=("bitsandbytes",),
        hf_optim=(("lion_32bit", None), ("lion", None)),
        classes=("bitsandbytes.optim.lion", "bitsandbytes.optim.lion32bit"),
        deepspeed_types=("lion",),
        trace_factory="cabe.trace.optim:lion",
    ),
)

#: every optimizer name, in the registry's order (the choices of ``--optimizer``)
OPTIMIZERS: tuple[str, ...] = tuple(o.name for o in REGISTRY)
_BY_NAME = {o.name: o for o in REGISTRY}


def get(name: str) -> Optimizer:
    """The registry entry of a (validated) optimizer name."""
    return _BY_NAME[name]


def from_hf_optim(name: str) -> tuple[str, str | None] | None:
    """A transformers ``optim`` name -> (cabe optimizer, optimizer_impl or None), or None if unknown."""
    for o in REGISTRY:
        for hf, impl in o.hf_optim:
            if hf == name:
                return o.name, impl
    return None


def from_class(path: str) -> str | None:
    """A lower-case optimizer class path (``torch.optim.adamw``) -> cabe optimizer, or None."""
    return next((o.name for o in REGISTRY if path in o.classes), None)


def from_deepspeed(kind: str) -> str | None:
    """A lower-case DeepSpeed ``optimizer.type`` -> cabe optimizer, or None."""
    return next((o.name for o in REGISTRY if kind in o.deepspeed_types), None)


@dataclass(frozen=True)
class OptimizerMemory:
    state_bytes: int  # on-GPU optimizer state counted by the allocator
    paged_bytes: int  # unified-memory state (paged optimizers), not counted by the allocator
    temp_bytes: int  # extra memory live during optimizer.step()
    moments: int  # state tensors per parameter (for explanations)
    state_bytes_per_param: float  # for explanations


def optimizer_memory(tensors: list[Tensor], setup: TrainingSetup, param_bytes_of: dict[str, int]) -> OptimizerMemory:
    """State and step temporaries for the trainable tensors.

    ``param_bytes_of`` maps a tensor ``kind`` to its stored bytes per element.
    """
    opt = get(setup.optimizer)
    impl = setup.resolved_optimizer_impl
    trainable = [t for t in tensors if t.trainable]
    state = 0
    paged = 0
    largest = 0
    total_numel = 0
    for t in trainable:
        b = param_bytes_of[t.kind]
        total_numel += t.total
        largest = max(largest, t.numel * b)
        on_device, in_unified = opt.device_and_paged(t, b, impl)
        state += on_device * t.count
        paged += in_unified * t.count
    temps = dict(opt.temporaries).get(impl)
    if temps == "all":
        temp = sum(round_alloc(t.numel * param_bytes_of[t.kind]) * t.count for t in trainable)
    elif temps == "largest":
        temp = 2 * round_alloc(largest)
    else:
        temp = 0
    per_param = (state + paged) / total_numel if total_numel else 0.0
    return OptimizerMemory(state, paged, temp, opt.moments, per_param)
