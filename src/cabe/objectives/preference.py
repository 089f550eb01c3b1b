"""TRL's preference trainers, phase by phase (trl 1.16.0: ``DPOTrainer`` and ``KTOTrainer`` in trl/trainer,
``ORPOTrainer`` moved to trl/experimental/orpo; trl/experimental/kto only re-exports the stable KTO with a
deprecation warning, experimental/kto/__init__.py:25-48). The policy's step is the SFT estimate over the rows the
trainer really runs, with TRL's fused LM head (:mod:`cabe.objectives.fused_head`); the other phases are built on it:

* DPO (dpo_trainer.py:1285-1612): chosen and rejected rows concatenated, ``2 × batch`` rows of ``seq`` tokens
  (``DataCollatorForPreference``, l. 146-209); the policy's forward, then the reference's under ``torch.no_grad``
  *while the policy's graph is alive* (l. 1302-1333), then the loss and backward. The reference is a separate
  frozen copy resident beside the policy's states (l. 396-417), the policy's PEFT base with its adapters disabled
  (``use_adapter(..., None)``, l. 1320-1331), or log-probabilities computed before training from the batch
  (``precompute_ref_log_probs``, l. 1168-1241: a no-grad pass over the data set before the optimizer exists).
* KTO (kto_trainer.py:1370-1440): ``batch`` unpaired rows; with ``loss_type="kto"`` a KL batch of mismatched
  pairs (as many rows) runs through the policy without gradients *before* its forward (l. 1337-1379), and the
  reference runs both batches after it (l. 1426-1436).
* ORPO (experimental/orpo/orpo_trainer.py:745-822): no reference; the policy's concatenated forward returns the
  whole logits (``outputs.logits``, l. 777), the chosen half's NLL and ``selective_log_softmax`` over every row
  (l. 738): transformers' own loss head (the logits and their fp32 log-softmax) over the 2 × batch rows.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cabe import generation
from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.facts import head_facts
from cabe.objectives.fused_head import fused_head, policy_outputs
from cabe.objectives.phases import compose
from cabe.precision import dtypes_for, resolve
from cabe.report import Report
from cabe.schema import DPO_LOSS_TYPES, KTO_LOSS_TYPES
from cabe.training import TrainingSetup

_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def check(spec: ModelSpec, setup: TrainingSetup) -> None:
    """Refuse a combination TRL refuses or that would not act (one sentence each, cabe.errors)."""
    o = setup.objective
    if setup.loss_type != "auto":
        allowed = {"dpo": "DPO", "kto": "KTO"}.get(o)
        own = DPO_LOSS_TYPES if o == "dpo" else KTO_LOSS_TYPES if o == "kto" else ()
        if allowed is None or setup.loss_type not in own:
            raise InvalidValueError("loss_type_objective", "loss_type", value=setup.loss_type, objective=o)
    if o == "orpo" and (setup.precompute_ref_log_probs or setup.ref_model != "auto"):
        # ORPOTrainer has no reference model (orpo_trainer.py: odds ratio on the policy's own log-probs)
        name = "precompute_ref_log_probs" if setup.precompute_ref_log_probs else "ref_model"
        raise InvalidValueError("orpo_no_reference", name, value=getattr(setup, name))
    if setup.ref_model == "adapter-off" and not setup.adapters:
        raise InvalidValueError("ref_adapter_off_needs_adapter", "ref_model", value="adapter-off", method=setup.method)
    if setup.resolved_ref_model == "copy" and setup.method == "qlora":
        raise InvalidValueError("ref_copy_quantized", "ref_model", value="copy", method=setup.method)
    saver = (
        "checkpoint_every" if setup.checkpoint_every > 1 else "offload_activations" if setup.offload_activations else ""
    )
    if saver and setup.checkpointing and o in ("dpo", "kto") and setup.resolved_ref_model != "precomputed":
        # the reference's forward runs inside disable_gradient_checkpointing (dpo_trainer.py:1318, kto_trainer.py:
        # 1426), which re-enables it with gradient_checkpointing_enable(kwargs) (trl/models/utils.py:397-414): every
        # layer checkpointed, nothing offloaded, from the first step's reference forward on
        raise InvalidValueError("trl_checkpointing_reset", saver, value=getattr(setup, saver), objective=o)
    if setup.use_weighting and o != "dpo":
        raise InvalidValueError("dpo_only", "use_weighting", value=True, objective=o)
    if setup.resolved_prompt_length >= setup.seq:
        raise InvalidValueError(
            "prompt_not_below_seq", "prompt_length", value=setup.resolved_prompt_length, seq=setup.seq
        )
    if o in ("dpo", "kto") and head_facts(spec, setup).lm_head_adapted:
        # TRL reads lm_head.weight itself: a LoRA on it would never train (dpo_trainer.py:834-841 refuses it)
        raise InvalidValueError("lm_head_lora_fused_head", "lora_targets", value="lm_head", objective=o)
    if setup.loss is not None and setup.loss != "hf" and o in ("dpo", "kto"):
        # the trainer patches the model's forward with its own head (dpo_trainer.py:955-962): no other loss kernel
        raise InvalidValueError("loss_with_trl_head", "loss", value=setup.loss, objective=o)


def without_dropout(spec: ModelSpec, setup: TrainingSetup) -> tuple[ModelSpec, TrainingSetup]:
    """DPOConfig / KTOConfig / ORPOConfig ``disable_dropout=True``: every ``nn.Dropout`` of the model (PEFT's LoRA
    dropout too) set to p=0 (``disable_dropout_in_model``, trl/trainer/utils.py:194-197; dpo_trainer.py:420-423,
    kto_trainer.py:941-946): no dropout masks. NOTE: a family whose attention reads a float from its config rather
    than an ``nn.Dropout`` keeps its attention dropout (the configs cabe knows set it to 0)."""
    plain = replace(spec, attention_dropout=0.0, hidden_dropout=0.0, embedding_dropout=0.0)
    return plain, setup.with_(lora_dropout=0.0) if setup.lora_dropout else setup


def rows(setup: TrainingSetup) -> int:
    """Rows of the policy's forward: chosen and rejected (DPO, ORPO), or the unpaired batch (KTO)."""
    return setup.batch if setup.objective == "kto" else 2 * setup.batch


def _kl_batch(setup: TrainingSetup) -> bool:
    """KTO's KL term (``calculate_kl``: every loss type but apo_zero_unpaired, kto_trainer.py:815)."""
    return setup.objective == "kto" and setup.resolved_loss_type == "kto"


def _no_grad_forward(spec: ModelSpec, setup: TrainingSetup, model_setup: TrainingSetup, outputs: int) -> int:
    """The peak of a forward under ``torch.no_grad`` over ``model_setup``'s rows: the largest decoder layer's working
    set (:func:`cabe.generation.layer_working`), or TRL's fused head with what it returns."""
    dt = dtypes_for(model_setup)
    # QLoRA's prepared model: bitsandbytes' Linear4bit returns its input's dtype (bitsandbytes 0.50.2
    # nn/modules.py:626-637), the fp32 of the embeddings and norms prepare_model_for_kbit_training cast, so the
    # residual stream, the MLP's outputs and the activation and product of them stay fp32 under autocast (no op of
    # its lists): the hidden copies and the MLP's tensors are 4 bytes (gpt2 QLoRA under bf16 autocast, DPO b4 × 256:
    # the reference's residual, c_fc output, pow and two products fp32 in the trace; its reference phase −10% with
    # them 16-bit)
    prepared = model_setup.method == "qlora" and model_setup.kbit_prep
    wide = dt.residual if prepared else dt.compute
    layer = generation.layer_working(
        spec, model_setup.batch, model_setup.seq, dt.compute, mlp_bytes=wide, residual_bytes=wide
    )
    head = fused_head(spec, model_setup, dt, outputs, top1=outputs > 1, grad=False)
    return max(layer, head.hidden_states + head.kept + head.forward_transient)


def _copy_bytes(spec: ModelSpec, setup: TrainingSetup) -> int:
    """A separate reference: the policy's parameters in its load dtype (dpo_trainer.py:412), frozen, on each GPU:
    sharded as the policy is under ZeRO-3 (trl/models/utils.py:285-286 keeps stage 3, every other stage becomes 0:
    a whole copy) and FSDP (``prepare_fsdp``, l. 292-330, the plugin's sharding: within a node for hybrid)."""
    whole = spec.parameter_count * _BYTES.get(setup.dtype, 2)
    group = {"zero3": setup.gpus, "fsdp": setup.gpus, "fsdp-hybrid": min(setup.gpus, setup.gpus_per_node)}
    return -(-whole // group.get(setup.shard, 1)) + spec.buffer_bytes


def estimate(spec: ModelSpec, setup: TrainingSetup, sft: Any, model_meta: dict[str, Any] | None) -> Report:
    """The peak of one DPO / KTO / ORPO step (see the module docstring)."""
    check(spec, setup)
    setup = resolve(setup, spec.dtype)
    spec, setup = without_dropout(spec, setup)
    policy_setup = setup.with_(batch=rows(setup))
    policy: Report = sft(spec, policy_setup, model_meta=model_meta)
    ref = setup.resolved_ref_model
    resident = _copy_bytes(spec, setup) if ref == "copy" else 0
    dt = dtypes_for(policy_setup)
    extra: dict[str, int] = {}
    if setup.objective in ("dpo", "kto"):
        # the policy's head forward transient is over by the time the reference runs: only what it keeps stays
        n_out, top1 = policy_outputs(setup)
        own = fused_head(spec, policy_setup, dt, n_out, top1=top1)
        forward_end = _moment(policy, "forward", "loss") - own.forward_transient
        outputs = 1 if ref == "copy" else (4 if setup.objective == "dpo" else 3)  # a copy asks for log-probs only
        ref_rows = policy_setup.with_(batch=policy_setup.batch)
        if ref != "precomputed":
            extra["reference"] = forward_end + resident + _no_grad_forward(spec, setup, ref_rows, outputs)
        states = policy.components.get("weights", 0) + policy.components.get("optimizer", 0)
        if _kl_batch(setup):  # the KL rows through the policy without gradients, before its forward
            extra["kl"] = states + resident + _no_grad_forward(spec, setup, policy_setup, 3)
        if ref == "precomputed":  # before training: the policy's weights and a no-grad pass over the batch
            extra["precompute"] = policy.components.get("weights", 0) + _no_grad_forward(spec, setup, policy_setup, 4)
    report = compose(policy, resident, extra, notes=("objective_" + setup.objective,))
    return _as_requested(report, setup, rows(setup))


def _as_requested(report: Report, setup: TrainingSetup, n_rows: int) -> Report:
    """The report echoing the request (its batch: pairs or examples; the policy ran ``n_rows`` rows) and the loss
    the trainer runs: TRL's fused LM head for DPO / KTO (not transformers' loss, so no note assumes it), the
    ORPO trainer's whole logits."""
    echo = {**report.setup, "batch": setup.batch, "effective_batch": setup.effective_batch, "rows": n_rows}
    loss = dict(report.extra.get("loss") or {})
    loss.update(loss="trl-fused-head" if setup.objective in ("dpo", "kto") else "orpo-logits", loss_chunks=None)
    loss["assumed"] = [k for k in loss.get("assumed", []) if k != "loss"]
    notes = tuple(n for n in report.notes if n != "loss_assumed_hf")
    return replace(report, setup=echo, notes=notes, extra={**report.extra, "loss": loss})


def _moment(report: Report, phase: str, where: str) -> int:
    """The total of one moment of an SFT report (its ``extra["moments"]``), else its phase's peak."""
    for m in report.extra.get("moments", ()):
        if m["phase"] == phase and m["where"] == where:
            return int(m["total_bytes"])
    return int(report.phase_peaks.get(phase, report.total_bytes))
