"""fp8 training: which linears run in fp8, what each recipe keeps in fp8, bf16 or fp32, where the peak moves, and on
which cards it can run. No torch here (the analytic path); the trace runs torchao's real conversion
(:mod:`cabe.trace.fp8`).

Recipes (``--fp8``):

* ``tensorwise``, ``rowwise``, ``rowwise-gw-hp``: torchao 0.18 ``Float8LinearConfig.from_recipe_name`` (config.py:
  316-378) applied by ``convert_to_float8_training`` (float8_linear_utils.py:86-133), which swaps every
  ``nn.Linear`` its ``module_filter_fn`` passes for a ``Float8Linear`` -- frozen ones too: ``swap_linear_layers``
  (:72-80) tests the type and the filter, never ``requires_grad``. Accelerate's ``mixed_precision="fp8"`` with
  ``AORecipeKwargs`` (accelerate 1.16 utils/dataclasses.py:285-330) is ``tensorwise`` (its default
  ``Float8LinearConfig(pad_inner_dim=True, enable_fsdp_float8_all_gather=True)``).
* ``te-delayed``, ``te-current``, ``te-mxfp8``: NVIDIA Transformer Engine's ``te.Linear`` under the
  ``DelayedScaling`` (amax history, TE's default and accelerate's ``TERecipeKwargs``), ``Float8CurrentScaling`` and
  ``MXFP8BlockScaling`` recipes. Transformer Engine is not installable here: MODELLED FROM SOURCE
  (NVIDIA/TransformerEngine 2.20.0.dev0, d0067d0, transformer_engine/pytorch/module/linear.py), never traced.

What each keeps (one converted linear ``y = x W^T``, x of T tokens × i, W of o × i = P parameters):

* torchao: the forward saves ``input_hp`` and ``weight_hp_t`` in high precision (float8_linear.py:45,
  ``ctx.save_for_backward(input_hp, weight_hp_t)``): the saved activations are those of ``nn.Linear``; the fp8 input
  and weight are temporaries of the forward, made again in backward (:107-195). The master weights stay as loaded
  (bf16 / fp32); under autocast ``Float8Linear.forward`` casts only the input (:258-262) and autocast's cast of the
  fp8 weight is a re-wrap without a copy (float8_ops.py:442-463): no 16-bit weight copy is cached or saved.
  Scales are one fp32 per tensor (tensorwise) or per row (rowwise: ``amax(dim=...)``, float8_utils.py:65-69).
  Each cast ``hp -> fp8`` (float8_training_tensor.py:153-154, float8_utils.py:118-137) makes ``x.to(float32) *
  scale`` (4 bytes per element), its ``clamp`` (4 more) and the fp8 result (1): 9 bytes per element at once.
* Transformer Engine: ``te.Linear`` quantizes its input and keeps for backward only its column-wise fp8 data
  (linear.py:598-617 ``update_usage(rowwise_usage=False, columnwise_usage=True)``): 1 byte per element where
  ``nn.Linear`` saves the 16-bit input; and it saves the fp8 weight it made (``wt_save = weightmat``, :640-645),
  row-wise and column-wise (:460-476: the transpose is kept for the dgrad GEMM on Hopper and Ada), 2 bytes per
  parameter, until that layer's backward. (On Blackwell every fp8 GEMM layout runs, so TE's Float8 quantizers make
  no transpose: pytorch/csrc/quantizer.cpp:361-375 ``with_transpose = columnwise_usage &&
  !is_non_tn_fp8_gemm_supported``, 1 byte per parameter for te-delayed / te-current there. The estimate does not
  know the card: it counts Hopper's, an over-estimate of P bytes per layer on B200 / B300.) MXFP8 adds one E8M0 scale byte per 32 elements of each. Delayed scaling
  keeps an amax history of ``amax_history_len`` = 1024 fp32 per quantized tensor (common/recipe/__init__.py:255):
  a few kB per module, left out.

Cards (:func:`card_refusal`): fp8 GEMMs need compute capability 8.9+ (Ada, Hopper, Blackwell: the catalog's ``fp8``;
TE quantization.py:149-159 ``_compute_fp8_support``); MXFP8 needs 10.x (:162-168 ``_compute_mxfp8_support``: not
12.0+, not Hopper). Transformer Engine is NVIDIA's only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cabe.errors import InvalidValueError

if TYPE_CHECKING:
    from cabe.architecture import ModelSpec
    from cabe.layers import Linear

#: ``--fp8`` choices (schema), cabe's names; torchao's recipe name where it has one
RECIPES = ("none", "tensorwise", "rowwise", "rowwise-gw-hp", "te-delayed", "te-current", "te-mxfp8")
TORCHAO = {"tensorwise": "tensorwise", "rowwise": "rowwise", "rowwise-gw-hp": "rowwise_with_gw_hp"}
TE = ("te-delayed", "te-current", "te-mxfp8")
#: the layer slots whose matrices are ``nn.Linear`` modules (the 3-D experts, Mamba's and DeltaNet's small tensors,
#: DeepSeek-V4's bare matrices are parameters that no fp8 recipe swaps)
_SWAPPED_SLOTS = frozenset(("qkv", "o", "up", "down", "router", "shared_up", "shared_down", "shared_gate", "o_group"))
#: bytes per element of one hp -> fp8 cast while it runs: ``x.to(float32) * scale`` (4), its clamp (4), the fp8 (1)
CAST_BYTES = 9


def is_torchao(recipe: str) -> bool:
    return recipe in TORCHAO


def is_te(recipe: str) -> bool:
    return recipe in TE


def converted(spec: ModelSpec, lin: Linear) -> bool:
    """Whether the recipe swaps this matrix: an ``nn.Linear`` module (not GPT-2's Conv1D, not a bare parameter), both
    dims multiples of 16 -- ``torch._scaled_mm`` refuses others (torch/_meta_registrations.py
    ``_check_scaled_mm_sizes``), and accelerate's filter skips them (utils/ao.py ``filter_linear_layers``). The
    lm_head is never one of a layer's linears (cabe's filter leaves it in high precision, as torchtitan's and
    accelerate's do)."""
    return (
        lin.is_module
        and not spec.conv1d
        and lin.slot in _SWAPPED_SLOTS
        and lin.in_features % 16 == 0
        and lin.out_features % 16 == 0
    )


def setup_refusal(setup: Any) -> None:
    """fp8 where it does not apply, as a typed error. QLoRA's base is bitsandbytes' 4-bit ``Linear4bit`` (an
    ``nn.Linear`` subclass that ``convert_to_float8_training`` would swap away with its packed weight); under LoRA the
    recipe swaps the frozen base layers and the rank-r adapters alike (float8_linear_utils.py:72-80: no test of
    ``requires_grad``), and ``_scaled_mm`` refuses ranks that are not multiples of 16; prompt tuning trains no
    linear: cabe models fp8 for ``full`` and ``freeze``. fp16 (weights or autocast) is refused: the recipes train in
    bf16 (torchao's README, TE's examples) and fp16's GradScaler is not modelled with them. One GPU only: the
    sharded and parallel plans (FSDP2's fp8 all-gather, torchao's float8 tensor parallelism) are not modelled."""
    if setup.fp8 == "none":
        return
    if setup.method not in ("full", "freeze"):
        raise InvalidValueError("fp8_method", "fp8", value=setup.fp8, method=setup.method)
    if "fp16" in (setup.dtype, setup.autocast):
        raise InvalidValueError("fp8_fp16", "fp8", value=setup.fp8)
    if setup.distributed:
        raise InvalidValueError("fp8_distributed", "fp8", value=setup.fp8)


def model_refusal(spec: ModelSpec, recipe: str) -> None:
    """A model whose forward cannot run torchao's ``Float8Linear``, as a typed error: Falcon's parallel block adds the
    attention's output into the MLP's in place (transformers 5.25 models/falcon/modeling_falcon.py:432-433,
    ``mlp_output += attention_output``), and without a bias the MLP's output is ``matmul_with_hp_or_float8_args``'s
    own output reshaped (float8_linear.py:90, a view of the 2-D GEMM's result): autograd refuses an in-place change of
    a custom Function's view output ("is a view and is being modified inplace"), on a GPU as in the trace.
    Transformer Engine's ``_Linear`` returns ``out.view(...)`` from its forward too (linear.py:586), bias or not."""
    if recipe == "none" or spec.model_type != "falcon" or not spec.parallel_block:
        return
    downs = [lin for lin in spec.runs[0].linears if lin.slot == "down" and converted(spec, lin)]
    if any(is_te(recipe) or not lin.bias for lin in downs):
        raise InvalidValueError("fp8_inplace_output", "fp8", value=recipe, model_type=spec.model_type)


def card_refusal(recipe: str, card: Any, compute_capability: tuple[int, int] | None) -> None:
    """The card (a :class:`cabe.gpus.Gpu`) cannot run the recipe: a typed error naming it and what the recipe
    needs. (``setup_refusal`` takes a :class:`cabe.training.TrainingSetup`: both typed loosely, since both modules
    import this one.)"""
    if recipe == "none":
        return
    if is_te(recipe) and card.vendor.lower() != "nvidia":
        raise InvalidValueError("fp8_card_vendor", "fp8", value=recipe, gpu=card.name)
    if not card.fp8:
        raise InvalidValueError("fp8_card", "fp8", value=recipe, gpu=card.name, needs="8.9")
    if recipe == "te-mxfp8" and (compute_capability is None or not (10, 0) <= compute_capability < (12, 0)):
        raise InvalidValueError("fp8_card", "fp8", value=recipe, gpu=card.name, needs="10.x")


def te_input_bytes(recipe: str, elements: int) -> int:
    """What ``te.Linear`` keeps of its input for backward, per token: the column-wise fp8 data, 1 byte per element,
    and for MXFP8 one E8M0 scale per 32 (linear.py:598-617)."""
    return elements + (elements // 32 if recipe == "te-mxfp8" else 0)


def te_weight_bytes(recipe: str, params: int) -> int:
    """The fp8 weight ``te.Linear`` saves for backward: row-wise and column-wise data (linear.py:460-476, 640-645),
    and for MXFP8 their E8M0 scales (one per 32 elements each)."""
    return 2 * params + (2 * (params // 32) if recipe == "te-mxfp8" else 0)


def torchao_forward_moment(recipe: str, i: int, params: int, tokens: int) -> int:
    """The largest moment of one converted linear's forward, beyond what the layers saved (float8_linear.py:49-91):
    the input's cast (9 bytes per element) or, the fp8 input made, the weight's (9 per parameter)."""
    del recipe  # every torchao recipe casts input and weight to fp8 for the output GEMM (config.py:316-378)
    return max(CAST_BYTES * i * tokens, i * tokens + CAST_BYTES * params)


def torchao_backward_moment(recipe: str, i: int, o: int, params: int, tokens: int, a: int, rho: int) -> int:
    """The largest moment of one converted linear's backward (float8_linear.py:93-204), beyond what the layers saved:
    its incoming gradient and the residual's (2·ρ·o), the 16-bit grad_input (a·i), then

    * tensorwise / rowwise: grad_output cast twice (dim 0 for grad_input, dim 1 for grad_weight: 2·o fp8), the fp8
      weight kept for grad_input (P), and the input cast again for grad_weight (9·i);
    * rowwise-gw-hp: grad_weight in high precision (no cast of input or grad_output for it); grad_input's row-wise
      GEMM without fast accumulation scales its output afterwards by the outer product of the inverse scales, an
      fp32 T × i tensor (float8_ops.py:52-59), beside grad_output's fp8 (o) and the tensorwise weight and its
      column-major copy (2·P, preprocess_addmm :344-345)."""
    if recipe == "rowwise-gw-hp":
        return tokens * (2 * rho * o + a * i + 4 * i + o) + 2 * params
    casts = tokens * (2 * rho * o + a * i + 2 * o + CAST_BYTES * i) + params
    # before them: the weight's cast for grad_input, beside grad_output's fp8
    weight = tokens * (2 * rho * o + o) + CAST_BYTES * params
    return max(casts, weight)
