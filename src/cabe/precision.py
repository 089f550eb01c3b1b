"""Precision: which dtype each kind of tensor has, from the two axes transformers has.

* ``dtype``: what the weights are loaded in — ``from_pretrained(dtype=...)``; transformers 5 defaults to
  ``"auto"``, the checkpoint's dtype (``config.dtype`` / ``torch_dtype``: bf16 for nearly every modern
  model), which :func:`resolve` reads from the model.
* ``autocast``: the Trainer's ``bf16=True`` / ``fp16=True`` — ``torch.autocast`` around the forward.

Bytes per element, never bits-as-float: 4-bit storage is handled in :mod:`cabe.method`.

=================  ========  =====  ===========  ========  ======================================
dtype + autocast   weights   grads  opt. state   residual  autocast weight copies
=================  ========  =====  ===========  ========  ======================================
fp32 + none        4         4      fp32         4         none
fp32 + bf16/fp16   4         4      fp32         4         2 B of every matmul weight; fp32 leaves
                                                            that train are cached until forward ends
bf16 + none        2         2      param dtype  2         none (LoRA adapters stay fp32)
bf16 + bf16        2         2      param dtype  2         none for the weights; fp32 adapters cast
fp16 + bf16        2         2      param dtype  2         2 B of every weight, never cached
=================  ========  =====  ===========  ========  ======================================

With a sharding engine's own mixed precision (``param_dtype`` bf16 / fp16: FSDP ``MixedPrecision``, FSDP2
``MixedPrecisionPolicy``, DeepSpeed's ``bf16`` / ``fp16`` mode, :func:`_engine_mixed`), the stored (sharded)
weights, gradients and optimizer state keep ``dtype`` while compute, activations and the residual stream are
``param_dtype``, with no autocast weight copies.

What follows from the source (each checked by :mod:`cabe.trace` on fake CUDA tensors):

* torch optimizers keep their state in the parameter's dtype (``torch.zeros_like(p)``).
* autocast (``aten/src/ATen/autocast_mode.cpp``, ``cached_cast``) casts a weight to the autocast dtype
  when it is another floating dtype, and caches the cast only when the weight is an fp32 leaf that
  requires grad; every other cast lives as long as autograd saves it for backward.
* PEFT keeps LoRA adapters in fp32 (``autocast_adapter_dtype=True``) and casts a layer's input to the
  adapter's dtype (``_cast_input_dtype``) before ``lora_A``.
* The residual stream is in the weights' dtype (the embedding's output); under autocast, matmuls write
  the autocast dtype and fp32-listed ops (``layer_norm``, ``softmax``, ``log_softmax``, ``pow``) fp32.

The lesson's "mixed precision" (16-bit weights + 16-bit gradients + fp32 master copy + fp32 Adam =
2 + 2 + 4 + 8 = 16 B/param) and PyTorch autocast on fp32 weights (fp32 weights + fp32 gradients + fp32
Adam = 16 B/param, plus a 16-bit copy of each weight) cost the same 16 B/param of model states; cabe
models what PyTorch does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cabe import memo, transformers_line
from cabe.errors import InvalidValueError

if TYPE_CHECKING:
    from cabe.training import TrainingSetup

FP32 = 4
HALF = 2
BYTES = {"fp32": FP32, "bf16": HALF, "fp16": HALF}


@dataclass(frozen=True)
class Dtypes:
    """Bytes per element for each kind of tensor in a setup."""

    weight: int  # trainable / full-precision parameters as stored
    frozen: int  # frozen (non-quantized) base parameters as stored
    grad: int
    compute: int  # activations saved for backward (matmul inputs/outputs)
    residual: int  # the residual stream between layers
    adapter: int  # LoRA adapter weights (PEFT keeps them fp32 by default)
    weight_copies: bool  # autocast casts the (base) weights to another dtype: 16-bit copies exist
    autocast: bool = False  # torch.autocast is on
    #: the weights are fp32: autocast caches the casts of those that train (cached_cast's kFloat test)
    cached_copies: bool = False
    #: autocast casts a linear layer's input per op: the residual stream (the weights' dtype) is not
    #: the autocast dtype (fp32 weights, or bf16 weights under fp16 autocast)
    input_casts: bool = False
    #: a sharding engine's mixed precision (FSDP ``MixedPrecision(param_dtype=...)``, FSDP2
    #: ``MixedPrecisionPolicy``, DeepSpeed ``bf16`` / ``fp16``): bytes of the parameters it gathers / computes
    #: with while the stored (sharded) ones stay ``weight``; 0 without one
    gathered: int = 0

    @property
    def amp(self) -> bool:
        return self.input_casts

    @property
    def adapter_compute(self) -> int:
        """Bytes of the LoRA adapters as the module computes with them: a sharding engine's mixed precision casts
        every parameter of a unit, the adapters too (FSDP2 ``MixedPrecisionPolicy``: _fsdp_param.py:587-599;
        DeepSpeed's ``module.bfloat16()``), while their stored (sharded) masters stay ``adapter``."""
        return self.gathered or self.adapter


def resolve(setup: TrainingSetup, checkpoint_dtype: str | None) -> TrainingSetup:
    """``dtype="auto"`` (not given) read as ``from_pretrained`` reads no dtype: in transformers 5 the checkpoint's
    dtype (``ModelSpec.dtype``, or :func:`cabe.families.config_dtype` of a config; fp32 when the config does not
    say, transformers would then look at the weights' files); in 4.x fp32, fp16 under bitsandbytes
    (:func:`cabe.transformers_line.default_dtype`)."""
    if setup.dtype != "auto":
        return setup
    # a new TrainingSetup is validated on creation (tens of µs): the request less its shape is resolved once, and a
    # setup that differs from it in the batch or the sequence only (a solver's sweep) takes that one's fields
    key = (memo.request_key(setup), checkpoint_dtype)
    hit = _RESOLVED.get(key)
    if hit is None:
        if len(_RESOLVED) > memo.MAX_ENTRIES:
            _RESOLVED.clear()
        line = setup.transformers_line
        # NOTE: 4.x loads fp32 (fp16 under bitsandbytes) when from_pretrained gets no dtype
        dtype = transformers_line.default_dtype(line, setup.method) if line < 5 else checkpoint_dtype or "fp32"
        hit = _RESOLVED[key] = setup.with_dtype(dtype)
    return memo.reshaped(hit, setup.batch, setup.seq)


_RESOLVED: dict[object, TrainingSetup] = {}


def dtype_source(setup: TrainingSetup, checkpoint_dtype: str | None) -> str:
    """Where the weights' dtype came from: ``given``, ``config``, ``default`` (a config without one) or
    ``transformers4`` (4.x's default for no dtype)."""
    if setup.dtype != "auto":
        return "given"
    if setup.transformers_line < 5:
        return "transformers4"
    return "config" if checkpoint_dtype else "default"


def loaded_dtype(setup: TrainingSetup) -> str:
    """The name of the dtype the weights that are not 4-bit are loaded in (the embeddings, and so an eager causal
    mask, among them): ``dtype``, except under QLoRA without prepare_model_for_kbit_training, which keeps them in the
    compute dtype (cabe.trace.build.load_dtype). ``setup`` is resolved (:func:`resolve`)."""
    return setup.compute_dtype if setup.method == "qlora" and not setup.kbit_prep else setup.dtype


_DTYPES: dict[object, Dtypes] = {}


def dtypes_for(setup: TrainingSetup) -> Dtypes:
    """Bytes per element for a setup whose ``dtype`` is resolved (:func:`resolve`)."""
    # asked for by every room of an estimate: once per request less its shape (cabe.memo), one object for all of them
    key = memo.request_key(setup)
    hit = _DTYPES.get(key)
    if hit is None:
        if len(_DTYPES) > memo.MAX_ENTRIES:
            _DTYPES.clear()
        hit = _DTYPES[key] = _dtypes_for(setup)
    return hit


def _trl_bf16_adapters(setup: TrainingSetup) -> bool:
    """TRL's DPO and KTO trainers cast a quantized model's trained parameters to bf16 (but DoRA's magnitude), after
    PEFT made them fp32 (trl 1.16.0 dpo_trainer.py:720-729, kto_trainer.py:776-780)."""
    return setup.method == "qlora" and setup.objective in ("dpo", "kto")


def _dtypes_for(setup: TrainingSetup) -> Dtypes:
    if setup.param_dtype != "none" and not setup.shard.startswith(("zero", "fsdp")):
        raise InvalidValueError("param_dtype_needs_sharding", "param_dtype", value=setup.param_dtype, shard=setup.shard)
    if setup.method == "qlora" and not setup.kbit_prep:
        # NOTE: QLoRA without prepare_model_for_kbit_training (unsloth, LLaMA-Factory): what is not 4-bit stays in
        # the compute dtype it was loaded in (cabe.trace.build.load_dtype), the adapters fp32 (PEFT's
        # autocast_adapter_dtype; unsloth's float32_mixed_precision, unsloth_zoo training_utils.py:391-399): the
        # dtypes of LoRA on a base in the compute dtype; the 4-bit weights are handled in cabe.method
        # (TRL's preference trainers cast a quantized model's trained parameters to bf16: _trl_bf16_adapters)
        adapters = "model" if _trl_bf16_adapters(setup) else setup.adapter_dtype
        return dtypes_for(setup.with_(method="lora", dtype=loaded_dtype(setup), adapter_dtype=adapters))
    if setup.method == "qlora":
        # NOTE: QLoRA as transformers + PEFT run it: 4-bit linear weights, the rest of the model
        # cast to fp32 by prepare_model_for_kbit_training, compute in compute_dtype.
        # The Trainer runs QLoRA under autocast (bf16=True): fp32 residual stream (fp32 embeddings),
        # 16-bit casts of the fp32 lm_head and adapters saved for backward.
        # without autocast the adapters and the rest run in fp32 (bitsandbytes casts to compute_dtype inside
        # its matmul and back to the input's dtype)
        on = setup.autocast != "none"
        compute = FP32 if setup.compute_dtype == "fp32" or not on else HALF
        return Dtypes(
            weight=FP32,
            frozen=FP32,
            grad=FP32,
            compute=compute,
            residual=FP32,
            adapter=HALF if _trl_bf16_adapters(setup) else FP32,
            weight_copies=compute != FP32,
            autocast=compute != FP32,
            cached_copies=compute != FP32,
            input_casts=compute != FP32,
        )
    if setup.dtype not in BYTES:
        raise ValueError(f"dtype {setup.dtype!r} not resolved: call cabe.precision.resolve first")
    if setup.method == "freeze" and setup.trainable_fp32 and setup.autocast != "none" and setup.dtype != "fp32":
        return _trained_fp32(setup)
    if setup.param_dtype != "none":
        return _engine_mixed(setup)
    w = BYTES[setup.dtype]
    on = setup.autocast != "none"
    # fp16 + bf16 promotes to fp32: with 16-bit weights of the other half type, the residual stream
    # (embedding output + the layers' autocast outputs) is fp32 from the first layer's output on
    mixed_halves = on and w == HALF and setup.dtype != setup.autocast
    return Dtypes(
        weight=w,
        frozen=w,
        grad=w,
        compute=HALF if on else w,
        residual=FP32 if mixed_halves else w,
        # PEFT's autocast_adapter_dtype: fp32 adapters on a 16-bit base too; adapter_dtype "model": the base's
        adapter=w if setup.adapter_dtype == "model" else FP32,
        weight_copies=on and setup.dtype != setup.autocast,
        autocast=on,
        cached_copies=on and setup.dtype == "fp32",
        input_casts=on and setup.dtype != setup.autocast,
    )


def _trained_fp32(setup: TrainingSetup) -> Dtypes:
    """Freeze with the trained layers cast to fp32 (LLaMA-Factory, model/adapter.py:129-134): their weights,
    gradients and optimizer state are fp32 leaves that autocast casts (and caches: they require grad); their norms'
    fp32 weights make fp32 outputs, so their linear layers' inputs are cast per op; the frozen layers, the embedding
    and the residual stay in the loaded 16-bit dtype."""
    w = BYTES[setup.dtype]
    return Dtypes(
        weight=FP32,
        frozen=w,
        grad=FP32,
        compute=HALF,
        residual=w,
        adapter=FP32,
        weight_copies=True,
        autocast=True,
        cached_copies=True,
        input_casts=True,
    )


def _engine_mixed(setup: TrainingSetup) -> Dtypes:
    """A sharding engine's mixed precision, as the engines implement it (not autocast on fp32 weights).

    * FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16)`` (torch 2.13 ``distributed/fsdp/_fully_shard/
      _fsdp_param.py:587-599``): the all-gather casts each unit's parameters to ``param_dtype``, so the
      module computes with 16-bit parameters: the embedding's output (the residual stream) and every
      saved activation are 16-bit, and autocast, when also on, finds 16-bit weights and copies none. The
      sharded parameters, their gradients (reduce-scattered, then cast to ``orig_dtype``) and the optimizer
      state keep the stored dtype. FSDP1 ``MixedPrecision`` does the same on its flat parameter.
    * accelerate (1.16, ``utils/fsdp_utils.py:800-806`` for FSDP2, ``accelerator.py:1969-2010`` for FSDP1)
      upcasts low-precision trainable parameters to fp32 when ``mixed_precision != "no"`` and sets
      ``param_dtype`` to the 16-bit dtype: stored fp32 masters, 16-bit compute; it also wraps forward in
      autocast (``accelerator.py:1791-1799``).
    * DeepSpeed ``bf16`` / ``fp16`` (``runtime/engine.py`` ``_configure_distributed_model`` casts the module
      with ``module.bfloat16()`` / ``.half()``; ``zero/stage_1_and_2.py`` / ``stage3.py`` build fp32
      partitions for the optimizer): a 16-bit module, fp32 master partitions (:mod:`cabe.parallel.zero`).
    """
    w = BYTES[setup.dtype]
    half = BYTES[setup.param_dtype]
    # autocast in the other 16-bit dtype than param_dtype (fp16 autocast over bf16 gathers): it casts every gathered
    # weight per op (copies saved for backward, never cached: only fp32 leaves are), and the residual stream, the
    # embedding's bf16 output plus the layers' fp16 outputs, promotes to fp32 (rank 0 of FSDP2 traced on a fake
    # group: llama-3.2-1b freeze fp16-mixed, param_dtype bf16, 8 GPUs, -30% without them)
    other = setup.autocast not in ("none", setup.param_dtype)
    return Dtypes(
        weight=w,
        frozen=w,
        grad=w,
        compute=half,
        residual=FP32 if other else half,
        adapter=FP32,
        weight_copies=other,
        autocast=setup.autocast != "none",
        cached_copies=False,
        input_casts=other,
        gathered=half,
    )
