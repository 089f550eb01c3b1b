"""The training setup: how a model is trained (method, precision, optimizer, shapes).

A :class:`TrainingSetup` is a frozen, validated value. Every interface (CLI, Python
API, HTTP API, web page, trace) builds one of these and hands it to the core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from cabe import fp8, optimizer, schema, transformers_line
from cabe.errors import InvalidValueError
from cabe.schema import MAX_BATCH, MAX_RANK, MAX_SEQ
from cabe.vision.images import parse_image_size

__all__ = ["MAX_BATCH", "MAX_RANK", "MAX_SEQ", "TrainingSetup", "number", "parse_targets"]

# NOTE: the Literal types are for type checkers; the allowed values are cabe.schema's (a test pins them
# equal, tests/test_schema.py).
Method = Literal["full", "lora", "qlora", "freeze", "prompt-tuning"]
Precision = Literal["fp32", "fp16-amp", "bf16-amp", "bf16", "fp16", "bf16-mixed", "fp16-mixed"]
Fp8 = Literal["none", "tensorwise", "rowwise", "rowwise-gw-hp", "te-delayed", "te-current", "te-mxfp8"]
Dtype = Literal["auto", "fp32", "bf16", "fp16"]
Autocast = Literal["none", "bf16", "fp16"]
# NOTE: the optimizer field also takes the HF Trainer's ``optim`` names (cabe.optimizer.ACCEPTED); __post_init__
# turns them into the registry's name, so a built setup holds one of these
Optimizer = str
OptimizerImpl = Literal["foreach", "fused", "for-loop"]
Attention = Literal["eager", "sdpa", "flash"]
Quant = Literal["nf4", "fp4"]
Packing = Literal["none", "packed", "padding-free"]
FsdpWrap = Literal["accelerate", "layers"]
ComputeDtype = Literal["bf16", "fp16", "fp32"]
Shard = Literal["none", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-hybrid"]
Offload = Literal["none", "optimizer", "parameters", "both"]
Recipe = Literal["hf-trainer", "trl-sft", "axolotl", "llama-factory", "torchtune", "unsloth", "litgpt"]
Loss = Literal["hf", "chunked", "liger", "cce", "litgpt"]
Objective = Literal["sft", "dpo", "orpo", "kto", "grpo"]
VllmMode = Literal["colocate", "server"]
RefModel = Literal["auto", "copy", "adapter-off"]
#: TRL's DPO then KTO loss types (cabe.schema.LOSS_TYPES)
LossType = Literal[
    "auto", "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot", "aot_unpaired",
    "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm", "kto", "apo_zero_unpaired",
]  # fmt: skip
ParamDtype = Literal["none", "bf16", "fp16"]
AdapterDtype = Literal["fp32", "model"]
CpImpl = Literal["allgather", "alltoall", "ulysses"]


def _choices(name: str) -> tuple[str, ...]:
    return schema.field(name).choices or ()


METHODS = _choices("method")
PRECISIONS = _choices("precision")
OPTIMIZERS = _choices("optimizer")
OPTIMIZER_IMPLS = _choices("optimizer_impl")
ATTENTIONS = _choices("attention")
QUANTS = _choices("quant")
COMPUTE_DTYPES = _choices("compute_dtype")
SHARDS = _choices("shard")
OFFLOADS = _choices("offload")

#: LoRA targets when none are given: PEFT's default for the model type
#: (peft.utils.constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING). An empty tuple means "that default".
DEFAULT_LORA_TARGETS: tuple[str, ...] = schema.field("lora_targets").default

_D = schema.defaults("api.estimate")


@dataclass(frozen=True)
class TrainingSetup:
    """How the model is trained. All sizes are counts (tokens, sequences), not bytes.

    Args:
        method: ``full`` fine-tuning, ``lora``, ``qlora`` (4-bit frozen base + LoRA),
            ``freeze`` (train only the last ``trainable_layers`` blocks), or ``prompt-tuning``.
        dtype: the dtype the weights are loaded in (``from_pretrained(dtype=...)``); ``auto`` is the
            checkpoint's (the config's ``dtype`` / ``torch_dtype``), as transformers 5 does by default.
        autocast: the Trainer's autocast (``bf16=True`` / ``fp16=True``), or ``none``.
        precision: a shorthand for a (dtype, autocast) pair (:data:`cabe.schema.PRECISIONS`): ``fp32``;
            ``bf16-amp`` / ``fp16-amp`` (fp32 weights under autocast); ``bf16`` / ``fp16`` (16-bit weights,
            no autocast); ``bf16-mixed`` / ``fp16-mixed`` (16-bit weights under autocast). When given it
            sets both; ``None`` means "as dtype and autocast say".
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
        recipe: the trainer whose defaults the request takes (:mod:`cabe.recipes`), or ``None``.
        fp8: fp8 training of the linear layers: torchao's ``tensorwise`` / ``rowwise`` / ``rowwise-gw-hp`` recipes or
            Transformer Engine's ``te-delayed`` / ``te-current`` / ``te-mxfp8`` (:mod:`cabe.fp8`); ``none``.
        objective: ``sft`` (next-token cross-entropy), or TRL's ``dpo`` / ``orpo`` / ``kto`` / ``grpo`` trainer,
            whose phases :mod:`cabe.objectives` walks.
        ref_model: a preference trainer's reference: ``copy`` (a separate frozen model), ``adapter-off`` (the
            policy's PEFT base with its adapters disabled), ``auto`` (TRL's: adapters off for LoRA / QLoRA, else a copy).
        precompute_ref_log_probs: TRL's: the reference's log-probabilities computed before training, none kept.
        prompt_length: the prompt's tokens: for DPO / ORPO / KTO, of each row's ``seq`` tokens (TRL's fused LM head
            scores the completion only); for GRPO, the longest prompt of a generation batch; ``None``: the objective's
            default (:attr:`resolved_prompt_length`).
        loss_type: TRL's DPO / KTO ``loss_type`` (``auto``: sigmoid for DPO, kto for KTO).
        use_weighting: DPO's WPO weighting (one more per-position output of the fused LM head).
        loss: the loss kernel: ``hf`` (transformers' ForCausalLMLoss: whole logits upcast to fp32),
            ``chunked`` (torchtune's CEWithChunkedOutputLoss), ``liger`` (Liger's fused linear
            cross-entropy), ``cce`` (Apple's cut cross-entropy), ``litgpt`` (LitGPT's lm_head over chunks of 128
            positions, cross-entropy in the logits' dtype, the logits kept by its loop); ``None``: the recipe's,
            else ``hf``.
        loss_chunks: ``chunked``: how many pieces the logits are upcast in (torchtune's default 8).
        dora: PEFT's DoRA (``LoraConfig(use_dora=True)``): a trained magnitude vector per adapted module.
        lora_dropout: PEFT's ``lora_dropout``, the probability in [0, 1) of the ``nn.Dropout`` before lora_A.
        checkpoint_every: with ``checkpointing``, checkpoint only every k-th decoder layer (the bottom one
            first, as transformers' ``every_n_layers``); the others keep their activations. 1: every layer.
        offload_activations: with ``checkpointing``, the checkpointed layers' inputs wait in pinned host
            memory and come back for backward (transformers' ``offload=True``, torchtune's
            ``enable_activation_offloading``).
        packing: ``none`` (padded rows of ``seq`` tokens), ``packed`` (rows of exactly ``seq`` tokens holding
            several documents) or ``padding-free`` (the batch flattened to one row of batch × seq tokens);
            documents are told apart by position_ids, so SDPA gets a block-diagonal mask.
        images: images in each sequence (a model with a vision tower cabe models: Qwen2.5-VL); their tokens are
            part of ``seq`` (:mod:`cabe.vision`). 0: text-only batches.
        image_size: the images' size in pixels, ``"HxW"``, before the processor's resize.
        kbit_prep: QLoRA: PEFT's ``prepare_model_for_kbit_training`` runs (every parameter that is not 4-bit
            cast to fp32), as TRL / axolotl call it; ``False``: the rest of the model stays in the compute
            dtype (unsloth, LLaMA-Factory).
        modules_to_save: PEFT's ``modules_to_save``: the token embedding and / or the lm_head trained whole beside
            the adapters (a trainable copy of each; the original stays, frozen).
        trainable_fp32: freeze: the trained layers cast to fp32, the frozen ones left as loaded (LLaMA-Factory).
        gpus: data-parallel world size × cp × tp × pp (total GPUs); memory is reported per GPU.
        shard: ``none`` (one GPU), ``ddp``, DeepSpeed ``zero1``/``zero2``/``zero3``, ``fsdp``
            (full sharding), ``fsdp-hybrid`` (shard within a node, replicate across nodes).
        offload: CPU offload of optimizer state and/or parameters (ZeRO-Offload / FSDP offload).
        param_dtype: a sharding engine's mixed precision (FSDP ``MixedPrecision`` / FSDP2
            ``MixedPrecisionPolicy`` ``param_dtype``, DeepSpeed ``bf16`` / ``fp16``): the parameters are
            computed with in this dtype while the stored, sharded ones keep ``dtype``; ``none``: no such mode.
        tp, pp, ep: tensor-, pipeline- and expert-parallel degrees.
        cp, cp_impl: context-parallel degree and how its attention communicates (cabe.parallel.context).
        gpus_per_node: GPUs in one node (hybrid sharding and host-RAM-per-node figures).
        cpu_ram_efficient_loading: FSDP through accelerate: rank 0's weights are broadcast one tensor at a time into
            shards made on the meta device (accelerate's default); ``False``: each wrapped unit is moved to the GPU
            whole, then sharded (:mod:`cabe.parallel.loading`).
        reshard_after_forward: FSDP2's ``fully_shard`` argument on each decoder-layer unit: ``True`` (its default)
            frees a unit's all-gathered parameters after its forward and gathers them again for its backward;
            ``False`` keeps them from the unit's forward to its backward (FSDP1's ``SHARD_GRAD_OP``).
        fsdp_wrap: FSDP's units: ``accelerate`` (accelerate >= 1.14: each decoder layer, the input embedding,
            [final norm, lm_head] kept gathered from forward to backward, the root) or ``layers`` (each decoder layer
            and the root holding the rest: accelerate <= 1.13, FSDP1).
        adapter_dtype: the LoRA adapters' dtype: ``fp32`` (PEFT's default, ``autocast_adapter_dtype=True``) or
            ``model``, the base weights' dtype (``autocast_adapter_dtype=False``; torchtune's, LitGPT's bf16-true).
        optimizer_in_backward: the optimizer steps each parameter inside backward and frees its gradient there
            (torchtune's ``optimizer_in_bwd``); the Trainer's ``*_layerwise`` GaLore optimizers always do.
        transformers: the transformers line the run uses, ``"4"``, ``"5"`` or a version (``"4.51.3"``); ``None``:
            the installed one's, else 5 (:mod:`cabe.transformers_line`: what differs between the lines).
    """

    method: Method = _D["method"]
    dtype: Dtype = _D["dtype"]
    autocast: Autocast = _D["autocast"]
    precision: Precision | None = _D["precision"]
    fp8: Fp8 = _D["fp8"]
    optimizer: Optimizer = _D["optimizer"]
    optimizer_impl: OptimizerImpl | None = _D["optimizer_impl"]
    batch: int = _D["batch"]
    seq: int = _D["seq"]
    grad_accum: int = _D["grad_accum"]
    checkpointing: bool = _D["checkpointing"]
    attention: Attention = _D["attention"]
    lora_rank: int = _D["lora_rank"]
    lora_alpha: float = _D["lora_alpha"]
    lora_targets: tuple[str, ...] = _D["lora_targets"]
    quant: Quant = _D["quant"]
    double_quant: bool = _D["double_quant"]
    compute_dtype: ComputeDtype = _D["compute_dtype"]
    trainable_layers: int = _D["trainable_layers"]
    prompt_tokens: int = _D["prompt_tokens"]
    recipe: Recipe | None = _D["recipe"]
    num_generations: int = _D["num_generations"]
    max_completion_length: int = _D["max_completion_length"]
    generation_batch_size: int | None = _D["generation_batch_size"]
    steps_per_generation: int | None = _D["steps_per_generation"]
    use_vllm: bool = _D["use_vllm"]
    vllm_mode: VllmMode = _D["vllm_mode"]
    vllm_gpu_memory_utilization: float = _D["vllm_gpu_memory_utilization"]
    vllm_enable_sleep_mode: bool = _D["vllm_enable_sleep_mode"]
    beta: float = _D["beta"]
    loss: Loss | None = _D["loss"]
    objective: Objective = _D["objective"]
    ref_model: RefModel = _D["ref_model"]
    precompute_ref_log_probs: bool = _D["precompute_ref_log_probs"]
    prompt_length: int | None = _D["prompt_length"]
    loss_type: LossType = _D["loss_type"]
    use_weighting: bool = _D["use_weighting"]
    loss_chunks: int = _D["loss_chunks"]
    galore_rank: int = _D["galore_rank"]
    galore_targets: tuple[str, ...] = _D["galore_targets"]
    dora: bool = _D["dora"]
    lora_dropout: float = _D["lora_dropout"]
    checkpoint_every: int = _D["checkpoint_every"]
    offload_activations: bool = _D["offload_activations"]
    packing: Packing = _D["packing"]
    images: int = _D["images"]
    image_size: str = _D["image_size"]
    kbit_prep: bool = _D["kbit_prep"]
    modules_to_save: tuple[str, ...] = _D["modules_to_save"]
    trainable_fp32: bool = _D["trainable_fp32"]
    transformers: str | None = _D["transformers"]
    adapter_dtype: AdapterDtype = _D["adapter_dtype"]
    optimizer_in_backward: bool = _D["optimizer_in_backward"]
    gpus: int = _D["gpus"]
    shard: Shard = _D["shard"]
    offload: Offload = _D["offload"]
    param_dtype: ParamDtype = _D["param_dtype"]
    tp: int = _D["tp"]
    pp: int = _D["pp"]
    ep: int = _D["ep"]
    gpus_per_node: int = _D["gpus_per_node"]
    loss_parallel: bool = _D["loss_parallel"]
    sequence_parallel: bool = _D["sequence_parallel"]
    cpu_ram_efficient_loading: bool = _D["cpu_ram_efficient_loading"]
    reshard_after_forward: bool = _D["reshard_after_forward"]
    cp: int = _D["cp"]
    cp_impl: CpImpl = _D["cp_impl"]
    fsdp_wrap: FsdpWrap = _D["fsdp_wrap"]

    def __post_init__(self) -> None:
        validate(self)
        _canonical_optimizer(self)
        if self.precision is not None:
            dtype, autocast = schema.PRECISIONS[self.precision]
            for name, implied in (("dtype", dtype), ("autocast", autocast)):
                given = getattr(self, name)
                if given != implied and given != _D[name]:
                    raise InvalidValueError(
                        "precision_conflict", name, value=given, precision=self.precision, implied=implied
                    )
                object.__setattr__(self, name, implied)
        elif (short := schema.precision_name(self.dtype, self.autocast)) is not None:
            object.__setattr__(self, "precision", short)
        if self.fp8 != "none":  # the methods, dtypes and plans fp8 training is modelled for (cabe.fp8)
            fp8.setup_refusal(self)
        if self.optimizer_in_backward and self.autocast == "fp16" and not optimizer.get(self.optimizer).layerwise:
            # fp16 autocast runs the Trainer's GradScaler, which unscales and steps every gradient after backward
            # (torch/amp/grad_scaler.py, unscale_ / step over optimizer.param_groups): an optimizer that already
            # stepped each parameter inside backward has none left to give it (torchtune's recipes run it in bf16)
            raise InvalidValueError("in_backward_grad_scaler", "optimizer_in_backward", value=True)

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
    def optimizer_given(self) -> str:
        """The optimizer's name as it was given (an HF Trainer ``optim`` name, or the registry's)."""
        return str(getattr(self, "_optimizer_given", self.optimizer))

    @property
    def resolved_optimizer_impl(self) -> str:
        """The AdamW implementation PyTorch uses: ``foreach`` on CUDA unless told otherwise."""
        if self.optimizer_impl is not None:
            return self.optimizer_impl
        return "foreach"

    @property
    def transformers_line(self) -> int:
        """The transformers line the run uses: 4 or 5 (the installed one's, else 5, when not given)."""
        return transformers_line.major(self.transformers)

    @property
    def resolved_ref_model(self) -> str:
        """The reference of a DPO / KTO step: ``precomputed``, ``adapter-off`` or ``copy`` (TRL's choice when
        ``auto``: the adapters disabled with PEFT, else a copy, trl 1.16.0 dpo_trainer.py:396-417); ``none`` for
        the objectives without one (SFT, ORPO)."""
        if self.objective not in ("dpo", "kto"):
            return "none"
        if self.precompute_ref_log_probs:
            return "precomputed"
        if self.ref_model == "auto":
            return "adapter-off" if self.adapters else "copy"
        return self.ref_model

    @property
    def resolved_loss_type(self) -> str:
        """TRL's ``loss_type``: the one given, else the trainer's default (DPOConfig ``sigmoid``, KTOConfig ``kto``)."""
        if self.loss_type != "auto":
            return self.loss_type
        return {"dpo": "sigmoid", "kto": "kto"}.get(self.objective, "auto")

    @property
    def resolved_prompt_length(self) -> int:
        """The prompt's tokens: the one given, else the objective's default: GRPO's 512 (cabe.objectives.grpo: the
        longest prompt of a generation batch), a preference trainer's 0 (every position of a row scored)."""
        if self.prompt_length is not None:
            return self.prompt_length
        return 512 if self.objective == "grpo" else 0

    @property
    def resolved_loss(self) -> str:
        """The loss kernel: the one given (or the recipe's), else transformers' own (``hf``)."""
        return self.loss or "hf"

    @property
    def distributed(self) -> bool:
        """True when memory is split or replicated over several GPUs (or offloaded)."""
        # NOTE: ep > 1 too: expert parallelism on one GPU is refused by the layout (ep_not_divisor),
        # never dropped without a word
        return (
            self.gpus > 1
            or self.shard != "none"
            or self.offload != "none"
            or self.tp > 1
            or self.pp > 1
            or self.ep > 1
            or self.cp > 1
        )

    def with_dtype(self, dtype: str) -> TrainingSetup:
        """The same setup with the weights in ``dtype`` (the precision shorthand follows)."""
        return self.with_(dtype=dtype)

    @property
    def tokens_per_sequence(self) -> int:
        """Tokens one sequence carries through the layers: ``seq``, plus the virtual prompt that
        PEFT's prompt tuning prepends to every sequence."""
        return self.seq + (self.prompt_tokens if self.method == "prompt-tuning" else 0)

    @property
    def adapters(self) -> bool:
        return self.method in ("lora", "qlora")

    def with_(self, **changes: Any) -> TrainingSetup:
        """A copy with ``changes``; a new ``precision`` sets dtype and autocast, a new dtype or autocast
        names the precision again."""
        prec = changes.get("precision")
        if prec is not None and prec in schema.PRECISIONS:
            implied = dict(zip(("dtype", "autocast"), schema.PRECISIONS[prec], strict=True))
            changes = {**implied, **changes}
        elif "dtype" in changes or "autocast" in changes:
            changes = {"precision": None, **changes}
        return replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out


def _canonical_optimizer(setup: TrainingSetup) -> None:
    """An HF Trainer ``optim`` name becomes the registry's name and the implementation it implies (kept as
    ``optimizer_given``, echoed in the report's setup); a name cabe does not model, an implementation that
    contradicts the name, or a request the optimizer cannot run is a typed error."""
    given = setup.optimizer
    if given in optimizer.HF_NOT_MODELLED:
        raise InvalidValueError(
            "optimizer_not_modelled", "optimizer", value=given, allowed=", ".join(optimizer.HF_NAMES)
        )
    name, impl = optimizer.canonical(given)
    if impl is not None and setup.optimizer_impl not in (None, impl):
        raise InvalidValueError(
            "optimizer_impl_conflict", "optimizer_impl", value=setup.optimizer_impl, optimizer=given, implied=impl
        )
    object.__setattr__(setup, "optimizer", name)
    if impl is not None:
        object.__setattr__(setup, "optimizer_impl", impl)
    object.__setattr__(setup, "_optimizer_given", given)
    refused = optimizer.refusal(
        name,
        grad_accum=setup.grad_accum,
        gpus=setup.gpus,
        shard=setup.shard,
        tp=setup.tp,
        in_backward=bool(setup.optimizer_in_backward),
    )
    if refused is not None:
        field, code = refused
        raise InvalidValueError(code, field, value=getattr(setup, field), optimizer=name)


def validate(setup: TrainingSetup) -> None:
    """Check every field against :mod:`cabe.schema` (lists given as a comma string or a list become
    tuples), in the order errors are reported: per group, the choices then the integers; then the real
    numbers, the lists and the on/off flags."""
    for group in ("setup", "gpus"):
        _check_group(setup, group)
    for f in schema.SETUP_FIELDS:
        if f.type is float:
            lo, hi = float(f.minimum or 0.0), float(f.maximum or 1e15)
            given = getattr(setup, f.name)
            x = number(f.name, given, minimum=lo, maximum=hi, strict=f.exclusive_minimum)
            if isinstance(given, str):  # "0.05" (a form's text) is read as the number it names; 0 stays 0 (echoed)
                object.__setattr__(setup, f.name, x)
    for f in schema.SETUP_FIELDS:
        if f.type is tuple:
            _coerce_list(setup, f)
    for f in schema.SETUP_FIELDS:
        if f.type is bool and not isinstance(getattr(setup, f.name), bool):
            raise InvalidValueError("not_bool", f.name, value=getattr(setup, f.name))
    if setup.lora_dropout >= 1:  # nn.Dropout(p=1) zeroes lora_A's input: PEFT accepts it, nothing would train
        raise InvalidValueError("lora_dropout_not_below_one", "lora_dropout", value=setup.lora_dropout)
    _check_savers(setup)
    if setup.method == "prompt-tuning" and setup.packing != "none":
        # PEFT drops position_ids under prompt tuning (peft 0.21.2 peft_model.py:1668-1674, "Position ids are not
        # supported ... Ignoring position ids"): no document would be told apart, the packing would do nothing
        raise InvalidValueError("packing_prompt_tuning", "packing", value=setup.packing)
    parse_image_size(setup.image_size)  # "HxW" pixels, or a typed error
    if setup.transformers is not None:
        object.__setattr__(setup, "transformers", transformers_line.parse(setup.transformers))
    _check_transformers4(setup)
    if setup.method == "freeze" and setup.trainable_fp32 and setup.autocast == "none" and setup.dtype != "fp32":
        # fp32 trained layers above 16-bit ones without autocast: the 16-bit lm_head meets their fp32 output
        # (F.linear refuses mixed dtypes); LLaMA-Factory casts them for a run under the Trainer's bf16 / fp16
        raise InvalidValueError("trainable_fp32_needs_autocast", "trainable_fp32", value=True, dtype=setup.dtype)
    if setup.method == "freeze" and setup.trainable_layers < 1:  # nothing would train: the trace refuses it too
        raise InvalidValueError("freeze_needs_layers", "trainable_layers", value=setup.trainable_layers)


def _check_transformers4(setup: TrainingSetup) -> None:
    """What transformers 4.x cannot run as asked (cabe.transformers_line): ``gradient_checkpointing_enable`` takes
    neither ``every_n_layers`` nor ``offload`` there (modeling_utils.py 4.57.6:3671-3718) for the trainers that
    call it as they are, and its reentrant checkpointing leaves freeze's trained layers without a gradient: the
    inputs require grad only on a PEFT model (4.57.6:3714), so a checkpointed layer above frozen ones returns an
    output that needs none ("None of the inputs have requires_grad=True"). LLaMA-Factory calls
    ``enable_input_require_grads`` itself (model_utils/checkpointing.py) and sets its own savers."""
    if transformers_line.major(setup.transformers) >= 5 or setup.recipe not in (None, "hf-trainer", "trl-sft"):
        return
    if setup.checkpoint_every > 1:
        raise InvalidValueError("transformers4_no_saver", "checkpoint_every", value=setup.checkpoint_every)
    if setup.offload_activations:
        raise InvalidValueError("transformers4_no_saver", "offload_activations", value=True)
    if setup.method == "freeze" and setup.checkpointing:
        raise InvalidValueError("transformers4_freeze_checkpointing", "checkpointing", value=True)


def _check_savers(setup: TrainingSetup) -> None:
    """Selective checkpointing and activation offloading act on checkpointed layers, on one GPU."""
    if setup.checkpoint_every > 1 and not setup.checkpointing:
        raise InvalidValueError("savers_need_checkpointing", "checkpoint_every", value=setup.checkpoint_every)
    if setup.offload_activations and not setup.checkpointing:
        raise InvalidValueError("savers_need_checkpointing", "offload_activations", value=True)
    if (setup.checkpoint_every > 1 or setup.offload_activations) and setup.distributed:
        # NOTE: the per-GPU recount (cabe.parallel) works on one per-layer figure, not on the layer runs
        raise InvalidValueError(
            "savers_one_gpu", "checkpoint_every" if setup.checkpoint_every > 1 else "offload_activations"
        )


def _check_group(setup: TrainingSetup, group: str) -> None:
    """One schema group: its choices, then its integers."""
    for f in schema.SETUP_FIELDS:
        if f.group == group and f.type is str and f.choices is not None:
            _check_choice(f, getattr(setup, f.name))
    for f in schema.SETUP_FIELDS:
        if f.group == group and f.type is int and not (f.default is None and getattr(setup, f.name) is None):
            _int_range(f.name, getattr(setup, f.name), int(f.minimum or 0), int(f.maximum or 0))


def _coerce_list(setup: TrainingSetup, f: schema.Field) -> None:
    """A list field given as a comma string or a list becomes a tuple (the setup is frozen)."""
    value = getattr(setup, f.name)
    if isinstance(value, (str, list, tuple)):
        object.__setattr__(setup, f.name, _targets(value))
    elif not isinstance(value, tuple):
        raise InvalidValueError("not_string", f.name, value=value)


def _check_choice(f: schema.Field, value: Any) -> None:
    if value is None and f.default is None:
        return  # not given is a state of its own (optimizer_impl: what PyTorch picks)
    _choice(f.name, value, f.choices or ())


def _targets(value: str | list[Any] | tuple[Any, ...]) -> tuple[str, ...]:
    return parse_targets(value) if isinstance(value, str) else tuple(str(t) for t in value)


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
    except OverflowError:  # an integer past float's range (10**400)
        raise InvalidValueError("out_of_range", name, value=value, minimum=minimum, maximum=maximum) from None
    if math.isnan(x) or math.isinf(x):
        raise InvalidValueError("not_finite", name, value=value)
    if (strict and x <= minimum) or x < minimum:
        code = "must_be_positive" if strict and minimum == 0 else "out_of_range"
        raise InvalidValueError(code, name, value=value, minimum=minimum, maximum=maximum)
    if x > maximum:
        raise InvalidValueError("out_of_range", name, value=value, minimum=minimum, maximum=maximum)
    return x
