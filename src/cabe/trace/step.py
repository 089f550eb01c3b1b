"""The training steps of a trace: the model materialised on the device, the parameters tagged, then
``steps`` x (micro-batches of forward and backward, the optimizer step, ``zero_grad``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cabe.trace import vision
from cabe.trace.analysis import analyse
from cabe.trace.family_patches import model_types
from cabe.trace.inputs import autocast, make_inputs, make_optimizer
from cabe.trace.loss import loss_kernel
from cabe.trace.result import TraceResult
from cabe.training import TrainingSetup


def materialize(model: Any, device: Any) -> None:
    """``Module.to_empty`` without tensor swapping: a new (uninitialised) storage for every
    parameter and buffer, in module order, shared parameters (tied embeddings) once.

    ``to_empty`` swaps tensors in place, which fails for parameters other objects hold
    weak references to (PEFT's prompt encoder), so parameters are replaced instead; attributes
    set on a parameter (bitsandbytes' ``quant_type``...) are carried over.
    """
    import torch

    memo: dict[int, Any] = {}
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is None:
                continue
            new = memo.get(id(p))
            if new is None:
                with torch.no_grad():
                    data = torch.empty_like(p, device=device)
                new = torch.nn.Parameter(data, requires_grad=p.requires_grad)
                for k, v in vars(p).items():
                    setattr(new, k, v)
                memo[id(p)] = new
            mod._parameters[name] = new
        for name, b in list(mod._buffers.items()):
            if b is None:
                continue
            new = memo.get(id(b))
            if new is None:
                new = torch.empty_like(b, device=device)
                memo[id(b)] = new
            mod._buffers[name] = new


def fill_random(model: Any) -> None:
    """Real (CPU/CUDA) runs: plausible parameter and buffer values instead of uninitialised memory."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.normal_(0.0, 0.02)
        for b in model.buffers():
            if b.is_floating_point():
                b.uniform_(0.0, 1.0)


def numel_stored(p: Any) -> int:
    """Parameters as counted by users: a 4-bit packed weight holds two parameters per byte."""
    qs = getattr(p, "quant_state", None)
    if qs is not None and getattr(qs, "shape", None) is not None:
        n = 1
        for s in qs.shape:
            n *= int(s)
        return n
    return p.numel()


def tag_params(model: Any, tracker: Any) -> None:
    for p in model.parameters():
        tracker.tag_tensor(p, "weights")
    for b in model.buffers():
        tracker.tag_tensor(b, "weights")
    tracker.weight_keys = {p.untyped_storage()._cdata for p in model.parameters()}


def _optimizer_tensors(opt: Any) -> Iterator[Any]:
    import torch

    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                yield v


def _install_logits_hooks(model: Any, tracker: Any) -> list[Any]:
    """Tag everything from the LM head's forward to its output gradient as ``logits``."""
    head = model.get_output_embeddings()
    handles: list[Any] = []
    if head is None:
        return handles

    def on_grad(grad: Any) -> None:
        tracker.region = None

    def pre(mod: Any, args: Any) -> None:
        tracker.region = "logits"

    def post(mod: Any, args: Any, out: Any) -> None:
        for t in out if isinstance(out, list) else [out]:  # a list: torchtune's chunked output
            if hasattr(t, "requires_grad") and t.requires_grad:
                t.register_hook(on_grad)

    handles.append(head.register_forward_pre_hook(pre))
    handles.append(head.register_forward_hook(post))
    return handles


def _micro_batch(
    model: Any, cfg: Any, setup: TrainingSetup, device: Any, tracker: Any, micro: int, scaler: Any
) -> None:
    """One forward and backward (the loss scaled by ``grad_accum`` when there are micro-batches)."""
    tracker.set_phase("setup")
    tracker.region = None
    ids, labels, positions = make_inputs(cfg, setup, device)
    extra = {} if positions is None else {"position_ids": positions}  # packed rows: documents by position_ids
    with vision.simulated(vision.wants_images(cfg, setup), model_types(cfg.to_dict())):
        images = vision.image_inputs(cfg, setup, device, ids)  # pixel_values and their grid, when images are asked
        tracker.set_phase("forward")
        with autocast(setup), loss_kernel(model, setup):
            tokens = images.pop("input_ids", ids)  # (Qwen3-VL's: ids whose values the fake mode keeps)
            loss = model(input_ids=tokens, labels=labels, use_cache=False, **{**extra, **images}).loss
        if micro > 1:
            loss = loss / setup.grad_accum
        tracker.set_phase("backward")
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
    del loss, ids, labels, positions, extra, images, tokens
    tracker.region = None


def _optimizer_step(opt: Any, tracker: Any, scaler: Any) -> None:
    tracker.set_phase("optimizer")
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    for t in _optimizer_tensors(opt):
        tracker.tag_tensor(t, "optimizer")
    opt.zero_grad(set_to_none=True)


def _grpo(model: Any, cfg: Any, setup: TrainingSetup, device: Any, tracker: Any, kind: str, hooks: dict) -> Any:
    """TRL's GRPO step (:mod:`cabe.trace.grpo`) for ``objective="grpo"``, else nothing."""
    if setup.objective != "grpo":
        return contextlib.nullcontext()
    from cabe.trace.grpo import Runner

    ref = hooks.get("grpo_reference")  # a separate reference model (cabe.trace.grpo.reference_model)
    if ref is not None:
        materialize(ref, device)
        if kind in ("cpu", "cuda"):
            fill_random(ref)
    return Runner(model, cfg, setup, device, tracker, kind, ref)


def train(
    model: Any,
    cfg: Any,
    setup: TrainingSetup,
    steps: int,
    device: Any,
    tracker: Any,
    trainable: list[Any],
    kind: str,
    hooks: dict[str, Any] | None = None,
    optimizer: Any = None,
    micro_batch: Any = None,
) -> TraceResult:
    """Run ``steps`` training steps under ``tracker`` and analyse what it recorded (``micro_batch``: another
    objective's forward and backward, :mod:`cabe.trace.preference`, in place of the SFT one)."""
    import torch

    notes: list[str] = []
    micro = min(setup.grad_accum, 2)
    if setup.grad_accum > 2:
        notes.append("trace_grad_accum_simulated")  # memory is the same for every micro-batch after the first
    scaler = None
    if setup.autocast == "fp16":  # the Trainer's fp16=True: a GradScaler
        scaler = torch.amp.GradScaler("cuda")
    opt = optimizer if optimizer is not None else make_optimizer(trainable, setup, tracker, kind, model)
    for p in trainable:
        p.register_post_accumulate_grad_hook(lambda p: tracker.tag_tensor(p.grad, "gradients"))
    handles = _install_logits_hooks(model, tracker)
    step_starts: list[int] = []
    with contextlib.ExitStack() as stack:
        grpo = stack.enter_context(_grpo(model, cfg, setup, device, tracker, kind, hooks or {}))
        try:
            for step in range(1, steps + 1):
                if hooks and "on_step_start" in hooks:
                    hooks["on_step_start"](step)
                tracker.step = step
                step_starts.append(len(tracker.events))
                if grpo is not None:  # TRL's GRPOTrainer: the rollout's log-probs, then its micro-batches
                    grpo.rollout(step_start=True)
                for _mb in range(micro):
                    if grpo is not None:
                        grpo.micro_batch(micro, scaler)
                    else:
                        (micro_batch or _micro_batch)(model, cfg, setup, device, tracker, micro, scaler)
                _optimizer_step(opt, tracker, scaler)
        finally:
            for h in handles:
                h.remove()
    tracker.set_phase("setup")
    res = analyse(tracker, steps, step_starts)
    if setup.objective == "grpo":
        from cabe.trace.grpo import join_generation

        join_generation(res, tracker, step_starts, (hooks or {}).get("grpo_generation"))
    res.micro_batches_per_step = micro
    res.steps = steps
    res.notes = notes
    if scaler is not None:
        res.notes.append("trace_grad_scaler")
    return res
