"""A DPO or KTO step on fake CUDA tensors with TRL's own code (trl 1.16.0): the policy built as every trace builds it
(:func:`cabe.trace.build.build_model`), the reference a second frozen copy (``ref_model``), the policy's PEFT base
with its adapters disabled, or precomputed log-probabilities in the batch; TRL's fused LM head
(``add_fused_lm_head``, trl/trainer/utils.py:1548) put on both as ``DPOTrainer.__init__`` does
(trl/trainer/dpo_trainer.py:955-962), and every micro-batch run by ``DPOTrainer._compute_loss``
(dpo_trainer.py:1285-1612) itself — the policy's forward over chosen and rejected rows concatenated (2B rows,
``DataCollatorForPreference``, dpo_trainer.py:146-209), the reference's under ``torch.no_grad`` while the policy's
graph is alive, the loss and TRL's metrics — then ``loss.backward()`` and the optimizer step of
:mod:`cabe.trace.step`. KTO's micro-batch is ``KTOTrainer._compute_loss`` (kto_trainer.py:1370-1563): the unpaired
rows, the KL rows through the policy without gradients first, the reference on both after the policy's forward.
ORPO (trl.experimental) is not traced: :func:`check` refuses it.

What the fake device cannot run is stood in for, memory unchanged:

* TRL's Triton kernels (``_forward_kernel`` / ``_backward_kernel``, trl/kernels/chunked_logprob.py:67,150) fold each
  logits tile into per-token statistics in place: they allocate nothing, so they run as no-ops on the tiles
  ``ChunkedLogProbFunction`` allocates itself (chunked_logprob.py:292-465); on a CUDA machine with Triton TRL scores
  only the positions with a label (``compact``, trl/trainer/utils.py:1642), as here.
* Boolean-mask indexing (``hidden_states[mask]``, trl/trainer/utils.py:1645; ``masked_select`` in
  ``masked_scatter``'s backward; the metrics' ``chosen_mean_logits[chosen_mask.bool()]``) has a data-dependent
  shape: the trace built the masks (every row the same prompt and completion lengths), so it knows how many
  positions each selects, and the op returns that many rows, with CUDA's int64 ``nonzero`` indices as a transient.
* Host reads of device values (``.item()`` in TRL's metrics) read 0, as every trace does
  (:func:`cabe.trace.attention.intercept`).

* The collator's attention masks are all ones (the trace's rows are all ``seq`` tokens long: a batch at
  ``max_length``); transformers drops such a mask after reading its values (masking_utils.py:329
  ``_ignore_causal_mask_sdpa``, l. 658 ``flash_attention_mask``), which fake tensors do not have: those two are asked
  with no mask, the answer they give for a mask of ones (:func:`ones_masks`).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

from cabe.errors import ConfigError
from cabe.training import TrainingSetup

#: the objectives whose step the trace runs with TRL's code
TRACEABLE = ("dpo", "kto")


def check(setup: TrainingSetup) -> None:
    """Refuse an objective the trace cannot run (never trace an SFT step in its place)."""
    if setup.objective not in TRACEABLE:
        raise ConfigError(
            "objective_not_traceable",
            "objective",
            value=setup.objective,
            traceable=", ".join(("sft",) + TRACEABLE + ("grpo",)),
        )
    if setup.distributed:  # the engines' rank 0 runs an SFT step (cabe.trace.distributed): no DPO step there
        raise ConfigError("objective_one_gpu", "objective", value=setup.objective)


def completion_positions(setup: TrainingSetup) -> int:
    """Positions of a row whose next-token label is a completion token: the labels shifted by one
    (trl/trainer/utils.py:1619-1620, ``labels[:, 1:]``) of a row of ``prompt_length`` prompt tokens then completion."""
    return setup.seq - max(setup.resolved_prompt_length, 1)


# ---- what the fake device cannot run ---------------------------------------------------------------------------
class _InPlaceKernel:
    """A Triton kernel launched as ``kernel[grid](...)`` that writes only into tensors it is given."""

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def fused_head_on_gpu() -> Iterator[None]:
    """TRL's fused LM head as it runs on a CUDA machine with Triton (``_use_triton``, chunked_logprob.py:48): the
    compact path and the kernels' launches, which allocate nothing."""
    from trl.kernels import chunked_logprob
    from trl.trainer import utils as trl_utils

    saved = {
        (trl_utils, "_use_triton"): trl_utils._use_triton,
        (chunked_logprob, "_use_triton"): chunked_logprob._use_triton,
        (chunked_logprob, "_forward_kernel"): chunked_logprob._forward_kernel,
        (chunked_logprob, "_backward_kernel"): chunked_logprob._backward_kernel,
        (chunked_logprob, "triton"): getattr(chunked_logprob, "triton", None),
    }

    def on_cuda(device: Any) -> bool:
        return bool(device.type in ("cuda", "xpu"))

    shim = types.SimpleNamespace(cdiv=lambda a, b: -(-a // b))
    trl_utils._use_triton = on_cuda
    chunked_logprob._use_triton = on_cuda
    chunked_logprob._forward_kernel = _InPlaceKernel()
    chunked_logprob._backward_kernel = _InPlaceKernel()
    chunked_logprob.triton = shim  # (triton.cdiv in the backward's launch grid)
    try:
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


@contextlib.contextmanager
def ones_masks() -> Iterator[None]:
    """transformers' mask functions asked as for a mask of ones (module docstring): SDPA's skip test and the
    flash mask (cabe's ``cabe_fa2`` registration, :func:`cabe.trace.attention.register_flash`) given no mask."""
    from cabe.trace import compat
    from cabe.trace.attention import register_flash

    every = compat.EVERY_FAMILY
    mu = compat.module("masking_utils", every)
    real_ignore = compat.require(mu, "_ignore_causal_mask_sdpa", every)
    registry = compat.require(mu, "ALL_MASK_ATTENTION_FUNCTIONS", every)
    name = register_flash()
    real_flash = registry[name]

    def ignore(padding_mask: Any, *args: Any, **kwargs: Any) -> Any:
        return real_ignore(None, *args, **kwargs)

    def flash(*args: Any, **kwargs: Any) -> Any:
        return real_flash(*args, **{**kwargs, "attention_mask": None})

    mu._ignore_causal_mask_sdpa = ignore
    registry.register(name, flash)
    try:
        yield
    finally:
        mu._ignore_causal_mask_sdpa = real_ignore
        registry.register(name, real_flash)


def mask_intercept(setup: TrainingSetup, inner: Any) -> Any:
    """The tracker's intercept with boolean-mask selection sized from the batch the trace built: a mask whose last
    dimension is a row's shifted positions selects ``completion_positions`` of each row."""
    import torch

    aten = torch.ops.aten
    width, picked = setup.seq - 1, completion_positions(setup)

    def selected(mask: Any) -> int:
        if mask.dim() == 0 or mask.shape[-1] != width:
            raise ConfigError("trace_mask_unknown", "objective", shape=tuple(mask.shape))
        return mask.numel() // width * picked

    def intercept(tr: Any, func: Any, args: tuple, kwargs: dict) -> Any:
        if func is aten.index.Tensor:
            src, indices = args[0], args[1]
            masks = [i for i in indices if i is not None and i.dtype == torch.bool]
            if not masks:
                return inner(tr, func, args, kwargs)
            mask = masks[0]
            k = selected(mask)
            idx = torch.empty((k, mask.dim()), dtype=torch.int64, device=src.device)  # CUDA's nonzero
            tr.record(idx, "nonzero")
            out = src.new_empty((k, *src.shape[mask.dim() :]))
            tr.record(out, "index")
            del idx
            return out
        if func is aten.nonzero.default and args[0].dim() == 1 and args[0].dtype == torch.bool:
            # KTO's desirable / undesirable split (kto_trainer.py:1409-1411): the trace's batch is half of each
            # (one of each for a batch of one); per-example scalars, no memory of note
            out = torch.empty((max(1, args[0].shape[0] // 2), 1), dtype=torch.int64, device=args[0].device)
            tr.record(out, "nonzero")
            return out
        if func is aten.masked_select.default:
            src, mask = args[0], args[1]
            k = selected(mask)
            out = src.new_empty((k,))
            tr.record(out, "masked_select")
            return out
        if func in (aten.index_put_.default, aten._index_put_impl_.default) and any(
            i is not None and i.dtype == torch.bool for i in args[1]
        ):
            return args[0]  # in place (index's backward into its zeros)
        if func is aten.index_put.default and any(i is not None and i.dtype == torch.bool for i in args[1]):
            out = args[0].clone()
            tr.record(out, "index_put")
            return out
        return inner(tr, func, args, kwargs)

    return intercept


# ---- the trainer and the batch -----------------------------------------------------------------------------------
class _Accelerator:
    """What ``DPOTrainer._compute_loss`` asks of accelerate's ``Accelerator`` on one process."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def gather_for_metrics(self, x: Any) -> Any:
        return x

    def gather(self, x: Any) -> Any:
        return x

    def unwrap_model(self, model: Any) -> Any:
        return model


def trainer(model: Any, ref: Any, setup: TrainingSetup, device: Any) -> Any:
    """A ``DPOTrainer`` / ``KTOTrainer`` with the attributes ``_compute_loss`` reads, set as their ``__init__`` sets
    them from a default ``DPOConfig`` / ``KTOConfig`` (dpo_trainer.py:780-800 and 955-990, kto_trainer.py:830-840):
    no Trainer machinery (datasets, tokenizer) is built."""
    import collections

    from trl import DPOTrainer, KTOTrainer

    common = dict(
        accelerator=_Accelerator(device),
        model=model,
        ref_model=ref,
        args=types.SimpleNamespace(gradient_checkpointing_kwargs=None, discopop_tau=0.05),
        precompute_ref_logps=setup.precompute_ref_log_probs,
        beta=0.1,
        aux_loss_enabled=False,
        router_aux_loss_coef=0.0,
        _metrics={"train": collections.defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
    )
    if setup.objective == "kto":
        kto = KTOTrainer.__new__(KTOTrainer)
        vars(kto).update(
            common,
            loss_type=setup.resolved_loss_type,
            calculate_KL=setup.resolved_loss_type != "apo_zero_unpaired",
            desirable_weight=1.0,
            undesirable_weight=1.0,
        )
        return kto
    t = DPOTrainer.__new__(DPOTrainer)
    vars(t).update(
        common,
        ld_alpha=None,
        f_divergence_type="reverse_kl",
        f_alpha_divergence_coef=0.5,
        loss_types=[setup.resolved_loss_type],
        loss_weights=[1.0],
        label_smoothing=0.0,
        use_weighting=setup.use_weighting,
    )
    return t


def add_heads(model: Any, ref: Any, setup: TrainingSetup) -> None:
    """TRL's fused LM head on the policy (its PEFT base) and on a separate reference, with the outputs
    ``DPOTrainer.__init__`` asks for (dpo_trainer.py:955-962)."""
    from trl.trainer.utils import add_fused_lm_head

    outputs: tuple[str, ...] = ("log_probs", "entropy", "mean_logits", "is_top1")
    if setup.objective == "kto":  # kto_trainer.py:967-970
        outputs = ("log_probs", "entropy", "mean_logits")
    if setup.use_weighting:
        outputs += ("log_sum_sq_probs",)
    add_fused_lm_head(model.get_base_model() if hasattr(model, "get_base_model") else model, outputs=outputs)
    if ref is not None:
        add_fused_lm_head(ref)


def make_batch(cfg: Any, setup: TrainingSetup, device: Any) -> dict[str, Any]:
    """``DataCollatorForPreference``'s batch (dpo_trainer.py:146-209): chosen rows then rejected rows, each
    ``prompt_length`` prompt tokens then completion, ``completion_mask`` marking the completion; precomputed
    reference log-probabilities (fp32, one per pair) when asked. KTO's: the unpaired rows, the KL rows."""
    import torch

    vocab = int(getattr(cfg, "vocab_size", 32000) or 32000)
    kto = setup.objective == "kto"
    rows = setup.batch if kto else 2 * setup.batch

    def sequences(prefix: str) -> dict[str, Any]:
        ids = torch.randint(0, vocab, (rows, setup.seq), device=device)
        completion = torch.ones((rows, setup.seq), dtype=torch.long, device=device)
        completion[:, : setup.resolved_prompt_length] = 0
        ones = torch.ones((rows, setup.seq), dtype=torch.long, device=device)
        return {f"{prefix}input_ids": ids, f"{prefix}attention_mask": ones, f"{prefix}completion_mask": completion}

    batch = sequences("")
    if kto:  # DataCollatorForUnpairedPreference (kto_trainer.py:146-206): the KL rows and the labels
        if setup.resolved_loss_type != "apo_zero_unpaired":
            batch.update(sequences("KL_"))
        batch["label"] = torch.ones(rows, dtype=torch.bool, device=device)
        if setup.precompute_ref_log_probs:
            batch["ref_logps"] = torch.zeros(rows, device=device)
            if "KL_input_ids" in batch:
                batch["ref_KL_logps"] = torch.zeros(rows, device=device)
        return batch
    if setup.precompute_ref_log_probs:
        batch["ref_chosen_logps"] = torch.zeros(setup.batch, device=device)
        batch["ref_rejected_logps"] = torch.zeros(setup.batch, device=device)
    return batch


# ---- the step ----------------------------------------------------------------------------------------------------
def phased(model: Any, tracker: Any, seen: dict[str, bool]) -> None:
    """Mark the forwards run without gradients: KTO's KL rows through the policy before its forward as ``kl``
    (kto_trainer.py:1379), the reference's after it as ``reference`` (dpo_trainer.py:1320-1333, kto_trainer.py:
    1426-1436). The fused forward TRL set on ``model`` (an instance attribute) is wrapped to switch the tracker's phase;
    ``seen["grad"]``: the policy's forward ran in this micro-batch (reset by :func:`micro_batch`)."""
    import torch

    fused = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            seen["grad"] = True
            return fused(*args, **kwargs)
        tracker.set_phase("reference" if seen["grad"] else "kl")
        try:
            return fused(*args, **kwargs)
        finally:
            tracker.set_phase("forward")

    model.forward = forward


def micro_batch(dpo: Any, cfg: Any, seen: dict[str, bool]) -> Any:
    """One micro-batch as ``DPOTrainer.training_step`` runs it: ``compute_loss`` under autocast, the loss over
    ``grad_accum`` when there are micro-batches, backward (cabe.trace.step's signature)."""
    from cabe.trace.inputs import autocast

    def run(model: Any, _cfg: Any, setup: TrainingSetup, device: Any, tracker: Any, micro: int, scaler: Any) -> None:
        tracker.set_phase("setup")
        tracker.region = None
        seen["grad"] = False
        batch = make_batch(cfg, setup, device)
        tracker.set_phase("forward")
        with autocast(setup):
            loss = dpo._compute_loss(model, batch, False)  # (DPOTrainer's or KTOTrainer's)
        if micro > 1:
            loss = loss / setup.grad_accum
        tracker.set_phase("backward")
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        del loss, batch
        tracker.region = None

    return run


def reference_model(config: dict[str, Any], setup: TrainingSetup) -> Any:
    """The separate reference, as ``DPOTrainer.__init__`` loads it (dpo_trainer.py:396-417): the policy's config and
    dtype, no method, frozen, in eval mode (``prepare_model(..., evaluation_mode=True)``); None when the reference is
    the policy's base with its adapters disabled, or precomputed."""
    from cabe.trace.build import build_model

    if setup.resolved_ref_model != "copy":
        return None
    # the policy's model as loaded, with none of its training options (method, checkpointing, savers)
    plain = TrainingSetup(
        method="full",
        dtype=setup.dtype,
        autocast=setup.autocast,
        attention=setup.attention,
        transformers=setup.transformers,
        batch=setup.batch,
        seq=setup.seq,
    )
    ref, _ = build_model(config, plain, [])
    ref.requires_grad_(False)
    ref.eval()
    return ref


def _place(ref: Any, device: Any, tracker: Any) -> None:
    """The reference materialised on the device (on meta until now), its tensors counted as weights."""
    from cabe.trace.step import materialize

    materialize(ref, device)
    for p in ref.parameters():
        tracker.tag_tensor(p, "weights")
    for b in ref.buffers():
        tracker.tag_tensor(b, "weights")


def _bf16_adapters(model: Any, tracker: Any) -> None:
    """``DPOTrainer.__init__`` / ``KTOTrainer.__init__`` on a quantized model: every trained parameter but DoRA's
    magnitude to bf16, in place of PEFT's fp32 (dpo_trainer.py:720-729, kto_trainer.py:776-780)."""
    import torch

    for name, param in model.named_parameters():
        if param.requires_grad and "lora_magnitude_vector" not in name:
            param.data = param.data.to(torch.bfloat16)
            tracker.tag_tensor(param, "weights")


def train(
    ref: Any,
    model: Any,
    cfg: Any,
    setup: TrainingSetup,
    steps: int,
    device: Any,
    tracker: Any,
    trainable: list[Any],
    kind: str,
) -> Any:
    """``steps`` DPO steps under ``tracker`` (the policy materialised and tagged by the engine; ``ref`` the separate
    reference on meta, or None)."""
    from cabe.trace.step import train as train_steps

    if ref is not None:
        _place(ref, device, tracker)
    if setup.method == "qlora":
        _bf16_adapters(model, tracker)
    from trl.trainer.utils import disable_dropout_in_model

    for m in (model, ref):  # DPOConfig / KTOConfig disable_dropout=True (dpo_trainer.py:420-423)
        if m is not None:
            disable_dropout_in_model(m)
    add_heads(model, ref, setup)
    seen = {"grad": False}
    phased(model.get_base_model() if hasattr(model, "get_base_model") else model, tracker, seen)
    if ref is not None:
        phased(ref, tracker, seen)
    dpo = trainer(model, ref, setup, device)
    tracker.intercept = mask_intercept(setup, tracker.intercept)
    with fused_head_on_gpu(), ones_masks():
        return train_steps(
            model, cfg, setup, steps, device, tracker, trainable, kind, micro_batch=micro_batch(dpo, cfg, seen)
        )
