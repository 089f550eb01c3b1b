"""What an optimizer holds for a model's trainable tensors: its state on the device and in unified memory
(:func:`optimizer_memory`), the temporaries of ``optimizer.step()`` by implementation (:func:`step_temporaries`),
GaLore's projection and update steps (:func:`low_rank_temporaries`), and a layer-wise optimizer's figures
(:func:`layerwise_figures`). The registry these formulas read — each optimizer's state rule and names — is
:mod:`cabe.optimizer`. Proved by tests/test_optimizer.py and tests/trace/test_optimizers_added.py (the trace)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from cabe.errors import InvalidValueError
from cabe.optimizer import Optimizer, galore_targeted, get, low_rank_shape
from cabe.tensors import Tensor
from cabe.training import TrainingSetup
from cabe.units import round_alloc


def _svd_temporaries(t: Tensor, b: int, r: int, k: int) -> int:
    """galore_projector.py:74-95, a projection step (the first step and every ``update_proj_gap``): an fp32
    copy of a 16-bit gradient (:78), U (rows × k), S and Vh (k × cols) of ``torch.linalg.svd`` (:83) and the
    other factor times diag(S) it computes and drops (:87 / :95). cuSOLVER's own workspace is not counted."""
    m, n = t.rows, t.cols
    out = (round_alloc(m * n * 4) if b != 4 else 0) + round_alloc(m * k * 4) + round_alloc(k * 4)
    return out + round_alloc(k * n * 4) + round_alloc((m if m >= n else n) * r * 4) + round_alloc(r * r * 4)


def galore_step_temporaries(o: Optimizer, t: Tensor, b: int, rank: int, targeted: bool) -> int:
    """The most one parameter's GaLore step holds at once (a for-loop: one parameter at a time; modelled).

    GaLore AdamW: ``denom`` and ``norm_grad`` (galore_torch/adamw.py:114, 123) of the (projected) gradient.
    GaLore's 8-bit AdamW: bitsandbytes' kernel updates in place; a targeted weight is cloned (adamw8bit.py:55).
    GaLore Adafactor: a 16-bit gradient and weight are upcast to fp32 (adafactor.py:178-179, 221-223) and the
    update is made twice (:230, :239). A targeted weight adds the projection step (:func:`_svd_temporaries`) or
    the projected update and ``project_back`` with its ``* self.scale`` (galore_projector.py:51-67, two
    full-size tensors)."""
    g = 4 if o.step_upcasts else b  # the gradient as the step computes with it
    # a fused expert stack is one parameter: the step's copies are of all of it (Tensor.param_numel)
    upcast = 2 * round_alloc(t.param_numel * 4) if o.step_upcasts and b != 4 else 0
    if not targeted:
        return 0 if o.clones_weight else upcast + 2 * round_alloc(t.param_numel * g)
    low, r, k = low_rank_shape(t, rank)
    svd = _svd_temporaries(t, g, r, k) + (round_alloc(t.numel * 4) if o.step_upcasts and b != 4 else 0)
    update = upcast + 3 * round_alloc(low.numel * g) + 2 * round_alloc(t.numel * g)
    return max(svd, update + (round_alloc(t.numel * b) if o.clones_weight else 0))


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
    if opt.low_rank and not any(galore_targeted(t, setup.galore_targets) for t in trainable):
        # the HF Trainer refuses too: trainer_optimizer.py:153-154 "No target modules found for {optimizer_name}"
        raise InvalidValueError("galore_no_targets", "galore_targets", value=", ".join(setup.galore_targets))
    state = 0
    paged = 0
    largest = 0
    total_numel = 0
    for t in trainable:
        b = param_bytes_of[t.kind]
        total_numel += t.total
        largest = max(largest, t.numel * b)
        on_device, in_unified = opt.device_and_paged(t, b, impl, setup)
        state += on_device * t.count
        paged += in_unified * t.count
    if opt.low_rank:
        temp = low_rank_temporaries([(t, param_bytes_of[t.kind]) for t in trainable], opt, setup)
    else:
        temp = step_temporaries(opt, impl, [(t, param_bytes_of[t.kind]) for t in trainable])
    per_param = (state + paged) / total_numel if total_numel else 0.0
    return OptimizerMemory(state, paged, temp, opt.moments, per_param)


def step_temporaries(opt: Optimizer, impl: str, items: list[tuple[Tensor, int]]) -> int:
    """What ``optimizer.step()`` allocates for the trainable ``(tensor, bytes per element)``: a copy of every
    tensor (``"all"``), two copies of the largest (``"largest"``), one (``"one"``) or nothing."""
    temps = dict(opt.temporaries).get(impl)
    # per parameter as PyTorch holds it: a fused expert stack is one tensor (Tensor.param_numel)
    if temps == "all":
        return sum(round_alloc(t.param_numel * b) * t.params for t, b in items)
    if temps in ("largest", "one"):
        # a for-loop step keeps the previous parameter's temporary bound to its local name until this parameter's
        # replaces it (torch/optim/adam.py 2.13 ``_single_tensor_adam``: ``denom = (exp_avg_sq.sqrt() / ...)
        # .add_(eps)``, sqrt and quotient beside the old denom; rmsprop.py ``_single_tensor_rmsprop``: ``avg =
        # square_avg.sqrt()`` beside the old avg): the previous tensor in the layer's order, plus this one's own
        own = 2 if temps == "largest" else 1
        best = prev = 0
        for t, b in items:
            cur = round_alloc(t.param_numel * b)
            best, prev = max(best, prev + own * cur), cur
        return best
    return 0


def low_rank_temporaries(items: list[tuple[Tensor, int]], opt: Optimizer, setup: TrainingSetup) -> int:
    """GaLore's step (a for-loop, one parameter at a time): the most one parameter's step holds
    (:func:`galore_step_temporaries`)."""
    targets, rank = setup.galore_targets, setup.galore_rank
    if opt.step_upcasts or opt.clones_weight:  # GaLore's Adafactor and 8-bit AdamW
        return max((galore_step_temporaries(opt, t, b, rank, galore_targeted(t, targets)) for t, b in items), default=0)
    # GaLore AdamW (galore_torch/adamw.py:115-123): ``denom`` and ``norm_grad`` stay bound from one parameter to the
    # next, so each step runs beside the previous parameter's: both until this one's sqrt replaces denom, then its
    # norm_grad (full-size after ``project_back``). The Trainer's groups step the untargeted parameters first, then
    # the targeted ones (trainer_optimizer.py, ``param_groups``)
    ordered = [(t, b, False) for t, b in items if not galore_targeted(t, targets)]
    ordered += [(t, b, True) for t, b in items if galore_targeted(t, targets)]
    best = prev_denom = prev_norm = 0
    for t, b, targeted in ordered:
        full = round_alloc(t.param_numel * b)
        denom = round_alloc(low_rank_shape(t, rank)[0].numel * b) if targeted else full
        own = galore_step_temporaries(opt, t, b, rank, targeted)
        best = max(best, prev_denom + prev_norm + denom, prev_norm + own)
        prev_denom, prev_norm = denom, full
    return best


def layerwise_figures(tensors: list[Tensor], param_bytes_of: dict[str, int], setup: TrainingSetup) -> LayerwiseStep:
    """What a layer-wise optimizer holds at once: one parameter's gradient and its step's temporaries (the
    parameter steps in its post-accumulate-grad hook, then its gradient is set to None), the largest over every
    trainable tensor and over those inside the layers."""
    opt = get(setup.optimizer)
    items = [(t, param_bytes_of[t.kind]) for t in tensors if t.trainable]
    inside = [(t, b) for t, b in items if t.kind not in ("embedding", "lm_head", "prompt")]

    def largest(of: list[tuple[Tensor, int]]) -> tuple[int, int]:
        grad = max((round_alloc(t.param_numel * b) for t, b in of), default=0)
        # one optimizer per parameter: nothing of one step outlives it (no loop-carried temporaries)
        if opt.low_rank:
            temps = max((low_rank_temporaries([item], opt, setup) for item in of), default=0)
        else:  # (a plain optimizer per parameter, torchtune's optimizer_in_bwd: its step over one tensor of them)
            impl = setup.resolved_optimizer_impl
            temps = max((step_temporaries(opt, impl, [(replace(t, count=t.stack), b)]) for t, b in of), default=0)
        return grad, temps

    (gradient, temporaries), (layer_gradient, layer_temporaries) = largest(items), largest(inside)
    return LayerwiseStep(gradient, temporaries, layer_gradient, layer_temporaries)


@dataclass(frozen=True)
class LayerwiseStep:
    """A layer-wise optimizer's figures (bytes): the largest gradient and step temporaries of any parameter,
    and of a parameter inside the layers."""

    gradient: int
    temporaries: int
    layer_gradient: int
    layer_temporaries: int
