"""The optimizers the trace builds, one factory per :data:`cabe.optimizer.REGISTRY` entry (its
``trace_factory`` names ``cabe.trace.optim:<function>``).

Each factory takes the trainable parameters, the torch keyword arguments of the setup's
``optimizer_impl`` (``foreach`` / ``fused``), the tracker and the run's kind (``fake`` / ``cuda``). GaLore's
factories get ``{"model": ..., "setup": ...}`` instead (they pick their targets from the model's modules).
"""

from __future__ import annotations

import types
from typing import Any

LEARNING_RATE = 1e-5


def adamw(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    import torch

    return torch.optim.AdamW(params, lr=LEARNING_RATE, **kw)


def sgd(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    import torch

    return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=0.0, **kw)


def sgd_momentum(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    import torch

    return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=0.9, **kw)


def adafactor(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    import torch

    kw = dict(kw)
    # torch.optim.Adafactor has no fused kernel: "fused" runs its foreach path
    if kw.pop("fused", False):
        kw["foreach"] = True
    return torch.optim.Adafactor(params, lr=1e-2, **kw)


def adamw_8bit(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    import bitsandbytes as bnb

    return _tracked_paging(bnb.optim.AdamW8bit(params, lr=LEARNING_RATE), tracker, kind)


def paged_adamw(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    import bitsandbytes as bnb

    return _tracked_paging(bnb.optim.PagedAdamW(params, lr=LEARNING_RATE), tracker, kind)


def paged_adamw_8bit(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    import bitsandbytes as bnb

    return _tracked_paging(bnb.optim.PagedAdamW8bit(params, lr=LEARNING_RATE), tracker, kind)


def lion(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    import bitsandbytes as bnb

    return _tracked_paging(bnb.optim.Lion(params, lr=LEARNING_RATE), tracker, kind)


def lion_8bit(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    import bitsandbytes as bnb

    return _tracked_paging(bnb.optim.Lion8bit(params, lr=LEARNING_RATE), tracker, kind)


def paged_lion(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    import bitsandbytes as bnb

    return _tracked_paging(bnb.optim.PagedLion(params, lr=LEARNING_RATE), tracker, kind)


def paged_lion_8bit(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    import bitsandbytes as bnb

    return _tracked_paging(bnb.optim.PagedLion8bit(params, lr=LEARNING_RATE), tracker, kind)


def rmsprop(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    import torch

    kw = dict(kw)
    # torch.optim.RMSprop has no fused kernel (torch 2.13): "fused" runs its foreach path
    if kw.pop("fused", False):
        kw["foreach"] = True
    return torch.optim.RMSprop(params, lr=LEARNING_RATE, **kw)


def rmsprop_bnb(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    import bitsandbytes as bnb

    # the HF Trainer's rmsprop_bnb / rmsprop_bnb_32bit: bnb.optim.RMSprop(optim_bits=32)
    return _tracked_paging(bnb.optim.RMSprop(params, lr=LEARNING_RATE, optim_bits=32), tracker, kind)


def rmsprop_8bit(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    import bitsandbytes as bnb

    return _tracked_paging(bnb.optim.RMSprop(params, lr=LEARNING_RATE, optim_bits=8), tracker, kind)


def galore_adamw(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    from galore_torch import GaLoreAdamW

    return GaLoreAdamW(_galore_groups(params, kw), lr=LEARNING_RATE)


def galore_adamw_8bit(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    from galore_torch import GaLoreAdamW8bit

    return _tracked_paging(GaLoreAdamW8bit(_galore_groups(params, kw), lr=LEARNING_RATE), tracker, kind)


def galore_adafactor(params: list[Any], kw: dict[str, Any], tracker: Any, kind: str) -> Any:
    from galore_torch import GaLoreAdafactor

    # the HF Trainer's galore_adafactor: scale_parameter=False, relative_step=False (trainer_optimizer.py:379-380)
    groups = _galore_groups(params, kw)
    return GaLoreAdafactor(groups, lr=LEARNING_RATE, scale_parameter=False, relative_step=False)


def _galore_groups(params: list[Any], kw: dict[str, Any]) -> list[dict[str, Any]]:
    """The two parameter groups the HF Trainer builds (trainer_optimizer.py:134-160,
    ``_setup_low_rank_optimizer``): the ``nn.Linear`` weights whose module name matches ``optim_target_modules``
    (transformers' ``check_target_module_exists``; ``all-linear`` takes every ``nn.Linear``) with GaLore's
    defaults (rank from the setup, update_proj_gap 200, scale 0.25, proj_type std), and the rest."""
    import torch
    from transformers.trainer_utils import check_target_module_exists

    model, setup = kw["model"], kw["setup"]
    targets = list(setup.galore_targets)
    all_linear = "all-linear" in targets
    # LLaMA-Factory's "all" (cabe.optimizer.ALL_BUT_HEAD): every nn.Linear but the output layer
    but_head = "all-but-lm-head" in targets
    head = model.get_output_embeddings() if but_head else None
    # by name, as the Trainer does: a tied lm_head's weight is listed by named_parameters() under the embedding's
    # name only, so it is never targeted
    names = {
        name + ".weight"
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
        and (all_linear or (but_head and m is not head) or check_target_module_exists(targets, name))
    }
    wanted = {id(p) for n, p in model.named_parameters() if n in names}
    chosen = [p for p in params if id(p) in wanted]
    if not chosen:  # trainer_optimizer.py:153-154 raises "No target modules found"
        from cabe.errors import InvalidValueError

        raise InvalidValueError("galore_no_targets", "galore_targets", value=", ".join(targets))
    rest = [p for p in params if id(p) not in wanted]
    low_rank = {"rank": setup.galore_rank, "update_proj_gap": 200, "scale": 0.25, "proj_type": "std"}
    return [{"params": rest}, {"params": chosen, **low_rank}]


def _tracked_paging(o: Any, tracker: Any, kind: str) -> Any:
    """On fake tensors, mark bitsandbytes' paged state buffers so the tracker keeps them outside
    the allocator (on a real GPU, bitsandbytes pages for real)."""
    import torch

    def get_state_buffer(self: Any, p: Any, dtype: Any = torch.float32) -> Any:
        # bitsandbytes Optimizer8bit.get_state_buffer: paged (cudaMallocManaged) when the
        # optimizer is paged and the parameter has >= 1e5 elements; not in torch's allocator.
        if not self.is_paged or p.numel() < 1e5:
            return torch.zeros_like(p, dtype=dtype, device=p.device)
        tracker.paged_mode = True
        try:
            return torch.zeros_like(p, dtype=dtype, device=p.device)
        finally:
            tracker.paged_mode = False

    if kind != "cuda":
        o.get_state_buffer = types.MethodType(get_state_buffer, o)
    return o


class InBackward:
    """torchtune's optimizer in backward (``optimizer_in_bwd: True``; torchtune/training/memory.py:58-240,
    ``OptimizerInBackwardWrapper`` and ``register_optim_in_bwd_hooks``, commit bd2a0fc): one optimizer per
    parameter, stepped by the parameter's post-accumulate-grad hook, which then zeroes its gradient
    (``zero_grad()``: set to None, the gradient freed). The step after backward has nothing left to do."""

    def __init__(self, params: list[Any], make: Any) -> None:
        self._by_param = {p: make([p]) for p in params}
        for p in params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: Any) -> None:
        opt = self._by_param[p]
        opt.step()
        opt.zero_grad(set_to_none=True)

    @property
    def state(self) -> dict[Any, Any]:
        return {p: st for opt in self._by_param.values() for p, st in opt.state.items()}

    def step(self) -> None:
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None
