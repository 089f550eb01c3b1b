"""Optimizers: one registry entry each — state bytes, step temporaries, the lesson's bytes per parameter,
the extras they need, the names other tools give them, and how the trace builds them.

State lives in the parameter's dtype for torch optimizers (``zeros_like(p)``): fp32 params keep
fp32 moments, pure-bf16 params keep bf16 moments. bitsandbytes' 32-bit optimizers (Lion, paged AdamW)
keep fp32 state whatever the parameter dtype. bitsandbytes 8-bit optimizers keep uint8
moments with an fp32 absmax per block of 256 for tensors of at least 4096 elements (smaller
tensors get 32-bit state). Paged optimizers allocate their state in CUDA unified memory
(cudaMallocManaged): it is not counted by PyTorch's allocator and can be evicted to host memory,
so cabe reports it beside the peak rather than inside it.

torchao's low-bit AdamW (``AdamW4bit`` / ``AdamW8bit`` / ``AdamWFp8``, torchao 0.18 ``optim/adam.py``) quantizes
a moment block-wise only when the tensor has at least 4096 elements and a multiple of ``block_size`` (else
``zeros_like(p)``); GaLore (galore-torch 1.0) keeps the moments of the gradient projected to rank ``r`` and the
projection matrix of each targeted 2-D weight, and full state for the other parameters; its layer-wise
variants step each parameter inside its post-accumulate-grad hook (transformers ``trainer_optimizer.py``,
``_setup_low_rank_optimizer``), so the gradients never all live at once. Entries without a trace factory are
modelled from their source, not traced (the ``optimizer_modelled`` note).

Adding an optimizer: one :class:`Optimizer` entry in :data:`REGISTRY` (its state rule below, or a new one),
the catalog sentences ``step.optimizer.<name>`` and ``step.lesson.optimizer.<name>`` (en, es), and the trace
factory in :mod:`cabe.trace.optim` named by ``trace_factory``.

This module imports nothing heavy: :mod:`cabe.schema` reads the names from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from cabe.tensors import Tensor
from cabe.units import round_alloc


class LowRankSetup(Protocol):
    """What a GaLore optimizer's state reads of the request (a :class:`cabe.training.TrainingSetup`)."""

    @property
    def galore_targets(self) -> tuple[str, ...]: ...

    @property
    def galore_rank(self) -> int: ...


BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes Optimizer8bit min_8bit_size
BNB_BLOCK = 256  # blockwise quantization block for 8-bit optimizer state
BNB_PAGED_MIN = 100_000  # Optimizer.get_state_buffer pages only tensors of at least 1e5 elements
# torchao 0.18 optim/adam.py:75 (_AdamBase._new_buffer): "follow bitsandbytes, only quantize tensors >= 4096
# values", and only when numel % block_size == 0; the block sizes are the classes' defaults (adam.py:319, 352,
# 385: AdamW8bit 256, AdamW4bit 128, AdamWFp8 256); the HF Trainer passes block_size 256 to both AdamW4bit and
# AdamW8bit (transformers trainer_optimizer.py:471, _get_torchao_optimizer)
TORCHAO_MIN_SIZE = 4096
TORCHAO_BLOCK_4BIT = 128
TORCHAO_BLOCK_8BIT = 256
HF_TORCHAO_BLOCK = 256
# GaLore's defaults as the HF Trainer sets them from optim_args (trainer_optimizer.py:370-373): rank 128,
# update_proj_gap 200, scale 0.25, proj_type "std"
GALORE_RANK = 128


# ---- state rules: bytes of one copy of a tensor's optimizer state --------------------------------
#: ``(tensor, parameter bytes per element, optimizer_impl) -> bytes`` for one of ``tensor.count`` copies.
StateRule = Callable[[Tensor, int, str], int]


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


def _bnb_one_8bit(t: Tensor, b: int, impl: str) -> int:
    """bitsandbytes' one-state optimizers (Lion, RMSprop) at 8 bits: a uint8 state and an fp32 absmax per block
    of 256 for tensors of at least 4096 elements, else an fp32 state (bitsandbytes/optim/optimizer.py,
    ``Optimizer1State.init_state``: ``state1`` through ``get_state_buffer``, ``absmax1`` by ``torch.zeros``)."""
    if t.numel >= BNB_MIN_8BIT_SIZE:
        return round_alloc(t.numel) + _bnb_1state_absmax(t, b, impl)
    return round_alloc(4 * t.numel)


def _bnb_1state_absmax(t: Tensor, b: int, impl: str) -> int:
    if t.numel < BNB_MIN_8BIT_SIZE:
        return 0
    return round_alloc(4 * -(-t.numel // BNB_BLOCK))


def _hf_adam(t: Tensor, b: int, impl: str) -> int:
    # galore_torch/adamw.py:101-103: exp_avg and exp_avg_sq = zeros_like(grad); "step" is a Python int
    return 2 * round_alloc(t.numel * b)


def _torchao_moment(numel: int, b: int, bits: str, block: int) -> int:
    """One torchao moment: quantized (codes, fp32 scale per block, the qmap) or ``zeros_like(p)``."""
    if numel < TORCHAO_MIN_SIZE or numel % block:
        return round_alloc(numel * b)  # adam.py:78: out = torch.zeros_like(local_p)
    # the scale is torch.zeros(n // block_size) in the default dtype, fp32 (subclass_4bit.py:127,
    # subclass_8bit.py:113, subclass_fp8.py:94)
    scale = round_alloc(4 * (numel // block))
    if bits == "4bit":
        # subclass_4bit.py:126 codes: n // 2 uint8 (two codes a byte); :129 qmap: 16 fp32 (linspace(0, 1, 17)[1:])
        return round_alloc(numel // 2) + scale + round_alloc(16 * 4)
    if bits == "8bit":
        # subclass_8bit.py:112 codes: n uint8; :115 qmap: 256 fp32
        return round_alloc(numel) + scale + round_alloc(256 * 4)
    return round_alloc(numel) + scale  # subclass_fp8.py:93 codes: n float8_e4m3fn, no qmap


def _torchao(bits: str, block: int) -> StateRule:
    def rule(t: Tensor, b: int, impl: str) -> int:
        # adam.py:120-121: exp_avg and exp_avg_sq through _new_buffer; "step" is a CPU scalar tensor
        return 2 * _torchao_moment(t.numel, b, bits, block)

    return rule


#: a ``galore_targets`` entry for every ``nn.Linear`` but the output layer: LLaMA-Factory's ``galore_target: all``
#: (``find_all_linear_modules``, src/llamafactory/model/model_utils/misc.py:28-52, lm_head forbidden)
ALL_BUT_HEAD = "all-but-lm-head"


def galore_targeted(t: Tensor, targets: tuple[str, ...]) -> bool:
    """Whether GaLore projects ``t``: a trainable ``nn.Linear`` weight whose module name matches
    ``optim_target_modules`` as transformers matches a list (trainer_utils.py:1042-1048, ``check_target_module_exists``:
    the name itself or a substring of the module's path, ``model.layers.N.self_attn.q_proj``); ``all-linear``
    takes every ``nn.Linear`` (trainer_optimizer.py:134, 140-147), the untied ``lm_head`` too, and PEFT's
    ``lora_A`` / ``lora_B`` (``nn.Linear`` modules under ``...self_attn.q_proj``). Fused MoE experts are 3-D
    parameters, not ``nn.Linear``, and stay unprojected."""
    if not (t.trainable and t.rows and t.cols) or t.kind not in ("base", "lm_head", "adapter"):
        return False
    if t.kind == "lm_head":
        return "all-linear" in targets or any(x in t.name for x in targets)
    # the module's path as the family's transformers code names it (cabe.parameters.linear_path): GPT-NeoX's
    # ``attention.query_key_value`` is no match for "attn"; "" for what is not an nn.Linear (GPT-2's Conv1D)
    # ALL_BUT_HEAD: LLaMA-Factory's galore_target "all" (model/model_utils/misc.py:28-52, every Linear but lm_head)
    return bool(t.path) and ("all-linear" in targets or ALL_BUT_HEAD in targets or any(x in t.path for x in targets))


def low_rank_shape(t: Tensor, rank: int) -> tuple[Tensor, int, int]:
    """The projected gradient of a targeted weight (rows = out, cols = in), the rank kept and min(rows, cols).

    galore_projector.py:15-22 (proj_type "std"): rows >= cols projects on the right, ``grad @ B.T`` with
    ``B = Vh[:r]`` -> (rows, r); otherwise on the left, ``A.T @ grad`` with ``A = U[:, :r]`` -> (r, cols).
    ``torch.linalg.svd(full_matrices=False)`` gives min(rows, cols) singular vectors, so r is capped there."""
    k = min(t.rows, t.cols)
    r = min(rank, k)
    rows, cols = (t.rows, r) if t.rows >= t.cols else (r, t.cols)
    return replace(t, numel=rows * cols, count=1, rows=rows, cols=cols), r, k


def galore_state(t: Tensor, b: int, impl: str, inner: StateRule, rank: int) -> int:
    """One targeted weight's GaLore state: the inner optimizer's state of the projected gradient (``b``: the
    gradient's bytes per element as the step sees it) plus the projection matrix. galore_projector.py:74-98: a
    16-bit gradient's SVD runs on an fp32 copy and the kept factor is cast back (``.type(original_type)``:
    r × min(rows, cols) in 16 bits); an fp32 gradient's factor is a slice (``Vh[:rank, :]`` / ``U[:, :rank]``)
    that keeps the whole min(rows, cols)² fp32 factor of the SVD alive."""
    low, r, k = low_rank_shape(t, rank)
    proj = round_alloc(r * k * b) if b != 4 else round_alloc(k * k * 4)
    return inner(low, b, impl) + proj


# ---- temporaries of optimizer.step(), by implementation ------------------------------------------
#: ``impl -> "all"`` (a copy of every trainable tensor at once), ``"largest"`` (two copies of a tensor beside the
#: previous tensor's one), ``"one"`` (one copy beside the previous tensor's) or nothing (see step_temporaries).
_ADAMW_TEMPS = {"foreach": "all", "for-loop": "largest"}  # torch._foreach_sqrt / exp_avg_sq.sqrt()
_ADAFACTOR_TEMPS = {"foreach": "all", "fused": "largest", "for-loop": "largest"}
# torch/optim/rmsprop.py (2.13): foreach avg = torch._foreach_sqrt(square_avgs), a copy of every state; for-loop
# avg = square_avg.sqrt() then avg.add_(eps) in place, one copy; no fused kernel (the trace runs foreach for it)
_RMSPROP_TEMPS = {"foreach": "all", "fused": "all", "for-loop": "one"}


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
        trace_factory: ``"module:function"`` that builds it on the traced model (:mod:`cabe.trace`); empty:
            modelled from the source, not traced.
        low_rank: GaLore: the targeted weights (``galore_targets``) keep ``state`` of their gradient projected to
            rank ``galore_rank`` plus the projection (:func:`galore_state`); the rest keep ``state``.
        layerwise: each parameter steps inside its post-accumulate-grad hook (the Trainer's ``*_layerwise``).
        clones_weight: GaLore's 8-bit AdamW clones each targeted weight inside its step.
        step_upcasts: the step works on an fp32 copy of a 16-bit gradient, and keeps its state in fp32
            (GaLore Adafactor: galore_torch/adafactor.py:178-179, state ``.to(grad)``).
        refused_with: requests it cannot serve, as ``(condition, error code)`` (see :func:`refusal`).
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
    low_rank: bool = False
    layerwise: bool = False
    clones_weight: bool = False
    step_upcasts: bool = False

    @property
    def modelled(self) -> bool:
        """Modelled from its source, not traced (no trace factory)."""
        return not self.trace_factory

    def tensor_state(self, t: Tensor, b: int, impl: str, setup: LowRankSetup | None = None) -> int:
        """One copy of ``t``'s state, GaLore's projection included when ``t`` is targeted."""
        g = 4 if self.step_upcasts else b
        if self.low_rank and setup is not None and galore_targeted(t, setup.galore_targets):
            return galore_state(t, g, impl, self.state, setup.galore_rank)
        return self.state(t, g, impl)

    def device_and_paged(self, t: Tensor, b: int, impl: str, setup: LowRankSetup | None = None) -> tuple[int, int]:
        """One copy of ``t``'s state split into (device memory, unified memory): a paged optimizer pages
        the state buffers of tensors of at least :data:`BNB_PAGED_MIN` elements, except its ``resident``
        part (8-bit absmax)."""
        per = self.tensor_state(t, b, impl, setup)
        # (a fused expert stack is one parameter: its size decides, not one expert's)
        if self.paged and t.param_numel >= BNB_PAGED_MIN:
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
        hf_optim=(("adamw_bnb_8bit", None), ("adamw_8bit", None)),
        classes=("bitsandbytes.optim.adamw8bit", "bitsandbytes.optim.adam8bit"),
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
    # ---- added for issue 11: the rest of the HF Trainer's ``optim`` choices cabe models -------------------
    Optimizer(
        "lion-8bit",
        moments=1,
        state=_bnb_one_8bit,
        lesson_bytes_per_param=1,
        extras=("bitsandbytes",),
        hf_optim=(("lion_8bit", None),),
        classes=("bitsandbytes.optim.lion8bit",),
        trace_factory="cabe.trace.optim:lion_8bit",
    ),
    Optimizer(
        "paged-lion",
        moments=1,
        state=_one_fp32_moment,
        paged=True,
        lesson_bytes_per_param=4,
        lesson_follows_dtype=True,
        extras=("bitsandbytes",),
        hf_optim=(("paged_lion_32bit", None),),
        classes=("bitsandbytes.optim.pagedlion", "bitsandbytes.optim.pagedlion32bit"),
        trace_factory="cabe.trace.optim:paged_lion",
    ),
    Optimizer(
        "paged-lion-8bit",
        moments=1,
        state=_bnb_one_8bit,
        paged=True,
        lesson_bytes_per_param=1,
        extras=("bitsandbytes",),
        hf_optim=(("paged_lion_8bit", None),),
        classes=("bitsandbytes.optim.pagedlion8bit",),
        resident=_bnb_1state_absmax,
        trace_factory="cabe.trace.optim:paged_lion_8bit",
    ),
    Optimizer(
        "rmsprop",
        moments=1,
        state=_one_moment,  # torch/optim/rmsprop.py: square_avg = zeros_like(p) (momentum 0, not centered)
        temporaries=tuple(_RMSPROP_TEMPS.items()),
        lesson_bytes_per_param=4,
        lesson_follows_dtype=True,
        hf_optim=(("rmsprop", None),),
        classes=("torch.optim.rmsprop",),
        impl_flags=("foreach",),
        trace_factory="cabe.trace.optim:rmsprop",
    ),
    Optimizer(
        "rmsprop-bnb",
        moments=1,
        state=_one_fp32_moment,  # bitsandbytes RMSprop(optim_bits=32): one fp32 state1
        lesson_bytes_per_param=4,
        lesson_follows_dtype=True,
        extras=("bitsandbytes",),
        hf_optim=(("rmsprop_bnb", None), ("rmsprop_bnb_32bit", None)),
        classes=("bitsandbytes.optim.rmsprop", "bitsandbytes.optim.rmsprop32bit"),
        trace_factory="cabe.trace.optim:rmsprop_bnb",
    ),
    Optimizer(
        "rmsprop-8bit",
        moments=1,
        state=_bnb_one_8bit,
        lesson_bytes_per_param=1,
        extras=("bitsandbytes",),
        hf_optim=(("rmsprop_bnb_8bit", None),),
        classes=("bitsandbytes.optim.rmsprop8bit",),
        trace_factory="cabe.trace.optim:rmsprop_8bit",
    ),
    Optimizer(
        "torchao-adamw-4bit",
        moments=2,
        state=_torchao("4bit", TORCHAO_BLOCK_4BIT),
        lesson_bytes_per_param=1,
        extras=("torchao",),
        classes=("torchao.optim.adamw4bit", "torchao.prototype.low_bit_optim.adamw4bit"),
    ),
    Optimizer(
        "adamw-torch-4bit",
        moments=2,
        state=_torchao("4bit", HF_TORCHAO_BLOCK),
        lesson_bytes_per_param=1,
        extras=("torchao",),
        hf_optim=(("adamw_torch_4bit", None),),
    ),
    Optimizer(
        "adamw-torch-8bit",
        moments=2,
        state=_torchao("8bit", TORCHAO_BLOCK_8BIT),
        lesson_bytes_per_param=2,
        extras=("torchao",),
        hf_optim=(("adamw_torch_8bit", None),),
        classes=("torchao.optim.adamw8bit", "torchao.prototype.low_bit_optim.adamw8bit"),
    ),
    Optimizer(
        "adamw-fp8",
        moments=2,
        state=_torchao("fp8", TORCHAO_BLOCK_8BIT),
        lesson_bytes_per_param=2,
        extras=("torchao",),
        classes=("torchao.optim.adamwfp8", "torchao.prototype.low_bit_optim.adamwfp8"),
    ),
    *(
        Optimizer(
            name + suffix,
            moments=moments,
            state=rule,
            lesson_bytes_per_param=lesson,
            # galore_torch/__init__.py imports its 8-bit AdamW, hence bitsandbytes, whichever one is used
            extras=("galore-torch", "bitsandbytes"),
            hf_optim=((name.replace("-", "_") + suffix.replace("-", "_"), None),),
            classes=(cls,) if not suffix else (),
            low_rank=True,
            layerwise=bool(suffix),
            clones_weight="8bit" in name,
            step_upcasts="adafactor" in name,
            # the layer-wise step (hooks inside backward) is modelled; the others run in the trace
            # (GaLore's 8-bit AdamW hands bitsandbytes a tensor norm where it takes a float: not on fake tensors)
            trace_factory="" if suffix or "8bit" in name else "cabe.trace.optim:" + name.replace("-", "_"),
        )
        for name, moments, rule, lesson, cls in (
            ("galore-adamw", 2, _hf_adam, 8, "galore_torch.galoreadamw"),
            ("galore-adamw-8bit", 2, _bnb_adam_8bit, 2, "galore_torch.galoreadamw8bit"),
            ("galore-adafactor", 1, _factored, 0, "galore_torch.galoreadafactor"),
        )
        for suffix in ("", "-layerwise")
    ),
)

#: the HF Trainer's ``optim`` names (transformers 5.24 ``OptimizerNames``) cabe does not model: their packages
#: (torchdistx, apollo-torch, lomo-optim, grokadamw, schedulefree, torch-optimi) keep state of their own kinds
#: that no registry entry describes yet, and bitsandbytes' AdEMAMix keeps three states; refused by name
#: (``optimizer_not_modelled``) with the names that are modelled
HF_NOT_MODELLED: tuple[str, ...] = (
    "adamw_anyprecision",
    "ademamix",
    "ademamix_8bit",
    "paged_ademamix_32bit",
    "paged_ademamix_8bit",
    "adagrad",
    "lomo",
    "adalomo",
    "grokadamw",
    "schedule_free_radam",
    "schedule_free_adamw",
    "schedule_free_sgd",
    "apollo_adamw",
    "apollo_adamw_layerwise",
    "stable_adamw",
)

#: every optimizer name, in the registry's order
OPTIMIZERS: tuple[str, ...] = tuple(o.name for o in REGISTRY)
_BY_NAME = {o.name: o for o in REGISTRY}
#: the transformers ``optim`` names cabe models -> (registry name, optimizer_impl they imply or None)
HF_NAMES: dict[str, tuple[str, str | None]] = {hf: (o.name, impl) for o in REGISTRY for hf, impl in o.hf_optim}
#: what ``--optimizer`` accepts: cabe's names, then the HF Trainer's ``optim`` names (modelled or refused by name)
ACCEPTED: tuple[str, ...] = OPTIMIZERS + tuple(n for n in HF_NAMES if n not in _BY_NAME) + HF_NOT_MODELLED
#: the accepted names (cabe's and the HF Trainer's) of the low-rank (GaLore) entries: the only ones that read
#: ``galore_rank`` / ``galore_targets`` (the Trainer reads optim_target_modules / optim_args "rank" for its GaLore
#: optims only: transformers trainer_optimizer.py:121, 370)
LOW_RANK_NAMES: frozenset[str] = frozenset(o.name for o in REGISTRY if o.low_rank) | frozenset(
    hf for hf, (name, _) in HF_NAMES.items() if _BY_NAME[name].low_rank
)


def get(name: str) -> Optimizer:
    """The registry entry of a (validated) optimizer name, cabe's or the HF Trainer's."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    return _BY_NAME[HF_NAMES[name][0]]


def canonical(name: str) -> tuple[str, str | None]:
    """An accepted name -> (registry name, optimizer_impl the name implies or None)."""
    if name in _BY_NAME:
        return name, None
    return HF_NAMES[name]


def from_hf_optim(name: str) -> tuple[str, str | None] | None:
    """A transformers ``optim`` name -> (cabe optimizer, optimizer_impl or None), or None if unknown."""
    return HF_NAMES.get(name)


def from_class(path: str) -> str | None:
    """A lower-case optimizer class path (``torch.optim.adamw``) -> cabe optimizer, or None."""
    return next((o.name for o in REGISTRY if path in o.classes), None)


def from_deepspeed(kind: str) -> str | None:
    """A lower-case DeepSpeed ``optimizer.type`` -> cabe optimizer, or None."""
    return next((o.name for o in REGISTRY if kind in o.deepspeed_types), None)


def refusal(
    name: str, *, grad_accum: int, gpus: int, shard: str, tp: int, in_backward: bool = False
) -> tuple[str, str] | None:
    """Why the setup's optimizer cannot run it, as ``(field, error code)``, or None.

    The HF Trainer's layer-wise GaLore refuses gradient accumulation and DDP (transformers
    trainer_optimizer.py:116-117, 161-162); GaLore's projector needs whole 2-D weights (galore_projector.py:15
    reads ``shape[1]``), which ZeRO / FSDP flat shards and tensor-parallel cuts are not. Any optimizer stepped in
    backward (``in_backward``, torchtune's ``optimizer_in_bwd``) refuses gradient accumulation ("optimizer_in_bwd ...
    Requires gradient_accumulation_steps=1", recipes/configs/llama3_2/1B_full_single_device.yaml; the recipe raises,
    full_finetune_single_device.py, commit bd2a0fc), and cabe plans it on one GPU."""
    opt = get(name)
    if in_backward and not opt.layerwise:
        if grad_accum != 1:
            return "grad_accum", "in_backward_no_grad_accum"
        if gpus > 1 or shard != "none" or tp > 1:
            return "optimizer_in_backward", "in_backward_single_gpu"
    if not opt.low_rank:
        return None
    if opt.layerwise and grad_accum != 1:
        return "grad_accum", "layerwise_no_grad_accum"
    if opt.layerwise and gpus > 1:
        return "gpus", "layerwise_single_gpu"
    if shard not in ("none", "ddp") or tp > 1:
        return "shard", "galore_whole_weights"
    return None
