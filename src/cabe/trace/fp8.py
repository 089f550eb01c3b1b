"""fp8 training in the trace: torchao's real conversion (``convert_to_float8_training`` with
``Float8LinearConfig.from_recipe_name``, torchao 0.18 float8_linear_utils.py:86-133, config.py:316-378) applied to the
model the trace built, so that its forward and backward run ``Float8Linear`` -- the casts (float8_utils.py,
float8_training_tensor.py) and ``torch._scaled_mm``, whose meta kernel (torch/_meta_registrations.py
``meta_scaled_mm``) answers on fake CUDA tensors. The filter is cabe's (:func:`cabe.fp8.converted`): every
``nn.Linear`` with both dimensions divisible by 16 but the lm_head.

Transformer Engine (``te-*``) is refused: not installable here, and its CUDA extension has no fake-tensor kernels;
cabe models it from source (:mod:`cabe.fp8`)."""

from __future__ import annotations

from typing import Any

from cabe import fp8
from cabe.errors import InvalidValueError, MissingDependencyError
from cabe.training import TrainingSetup


def refusal(setup: TrainingSetup) -> None:
    """A recipe the trace cannot run, as a typed error (before anything is built)."""
    if fp8.is_te(setup.fp8):
        raise InvalidValueError("fp8_trace_te", "fp8", value=setup.fp8)
    if fp8.is_torchao(setup.fp8):
        try:
            import torchao.float8  # noqa: F401
        except ImportError as exc:
            raise MissingDependencyError("fp8_trace_torchao", "fp8", value=setup.fp8, detail=str(exc)[:200]) from None


def convert(model: Any, setup: TrainingSetup) -> int:
    """Swap the model's linears for torchao's ``Float8Linear`` under the setup's recipe; returns how many."""
    if not fp8.is_torchao(setup.fp8):
        return 0
    import torch
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    head = model.get_output_embeddings()
    swapped = 0

    def keep(mod: Any, fqn: str) -> bool:
        nonlocal swapped
        # only nn.Linear itself and its subclasses reach the filter (float8_linear_utils.py:72-74)
        ok = (
            mod is not head
            and isinstance(mod, torch.nn.Linear)
            and mod.in_features % 16 == 0
            and mod.out_features % 16 == 0
        )
        swapped += ok
        return ok

    config = Float8LinearConfig.from_recipe_name(fp8.TORCHAO[setup.fp8])
    convert_to_float8_training(model, module_filter_fn=keep, config=config)
    return swapped
