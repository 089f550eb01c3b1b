"""Megatron-style sequence parallelism with tensor parallelism, traced with PyTorch's own styles on the fake group.

transformers' ``DistributedConfig`` reserves sequence parallelism without wiring it (5.25
configuration_utils.py); torchtitan applies it with torch's styles (``parallelize_llama``), and so does the
trace, on transformers' Llama-shaped decoder layers (:data:`LAYER_CHILDREN`), torch 2.13
distributed/tensor/parallel/style.py:

* ``embed_tokens``: ``RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))`` -- the vocabulary
  shards' partial sums reduce-scattered over the sequence (each GPU keeps s/K positions);
* ``input_layernorm`` / ``post_attention_layernorm`` / the final ``norm``: ``SequenceParallel()`` -- the norm runs on
  the local s/K positions, its weight replicated;
* ``self_attn`` / ``mlp``: ``PrepareModuleInput`` -- the sequence-sharded input all-gathered (``Shard(1)`` to
  ``Replicate()``) before the projections, so attention sees every position;
* q/k/v/gate/up ``ColwiseParallel()``, o/down ``RowwiseParallel(output_layouts=Shard(1))`` (a reduce-scatter);
* ``lm_head``: ``ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)`` with
  ``loss_parallel`` (the loss on the vocabulary shards), ``output_layouts=Replicate()`` without.

The residual stream between layers (and what checkpointing keeps of it) is the local s/K positions. transformers
builds the position ids and the causal mask from the embedding output's length, s/K here: the base model's forward
is given the whole sequence's (:func:`_whole_sequence`), as a torchtitan model computes them from the tokens.
"""

from __future__ import annotations

from typing import Any

from cabe.errors import InvalidValueError
from cabe.training import TrainingSetup

#: a Llama-shaped decoder layer (llama, mistral, qwen2, qwen3...): two norms before attention and the MLP
LAYER_CHILDREN = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
#: the projections the model's TP plan names, by style
_STYLES = {"colwise", "rowwise"}


def layer_plan(base_plan: dict[str, str]) -> dict[str, str]:
    """The decoder layer's projections (``self_attn.q_proj``...) and the style its TP plan gives each."""
    out = {}
    for key, style in base_plan.items():
        if key.startswith("layers.*."):
            out[key.removeprefix("layers.*.")] = style
    return out


def check(model: Any, setup: TrainingSetup) -> tuple[Any, list[Any]]:
    """The base model and its decoder layers, or the refusal naming what is not Llama-shaped (``sp_layer``)."""
    base = getattr(model, "model", None)
    layers = list(getattr(base, "layers", None) or [])
    plan = layer_plan(dict(getattr(model.config.get_text_config(), "base_model_tp_plan", None) or {}))
    shaped = (
        layers
        and all({n for n, _ in layer.named_children()} >= LAYER_CHILDREN for layer in layers)
        and set(plan.values()) <= _STYLES
        and hasattr(base, "embed_tokens")
        and hasattr(base, "norm")
        and hasattr(model, "lm_head")
    )
    extra = {n for layer in layers for n, _ in layer.named_children()} - LAYER_CHILDREN
    if not shaped or extra:
        raise InvalidValueError(
            "trace_parallel_unsupported", "sequence_parallel", value=True, why="sp_layer", model=model.config.model_type
        )
    window = getattr(model.config.get_text_config(), "sliding_window", None)
    if window and setup.seq > window:
        # the whole sequence's mask is the plain causal one (_whole_sequence): a window shorter than the sequence
        # would need the model's sliding-window mask, which it too builds from the s/K embedding output
        raise InvalidValueError(
            "trace_parallel_unsupported", "sequence_parallel", value=True, why="sp_window", window=window
        )
    return base, layers


def apply(model: Any, mesh: Any, setup: TrainingSetup) -> dict[str, Any]:
    """Sequence parallelism over ``mesh`` (the TP dimension) with torch's styles (module docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    base, layers = check(model, setup)
    plan = layer_plan(dict(model.config.get_text_config().base_model_tp_plan))
    styles: dict[str, Any] = {
        "colwise": ColwiseParallel,
        "rowwise": lambda: RowwiseParallel(output_layouts=Shard(1)),
    }
    for layer in layers:
        layer_styles: dict[str, Any] = {
            "input_layernorm": SequenceParallel(),
            "post_attention_layernorm": SequenceParallel(),
            # (transformers' decoder layer calls ``self_attn(hidden_states=...)`` by keyword, ``mlp(x)`` by position)
            "self_attn": PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            ),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        }
        layer_styles.update({name: styles[style]() for name, style in plan.items()})
        parallelize_module(layer, mesh, layer_styles)
    parallelize_module(
        model,
        mesh,
        {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "model.norm": SequenceParallel(),
            "lm_head": ColwiseParallel(
                input_layouts=Shard(1),
                output_layouts=Shard(-1) if setup.loss_parallel else Replicate(),
                use_local_output=not setup.loss_parallel,
            ),
        },
    )
    if getattr(model.config, "tie_word_embeddings", False):
        # each style made its own DTensor parameter: tied again, as transformers does once the weights are loaded
        model.tie_weights()
    base.register_forward_pre_hook(_whole_sequence(model.config), with_kwargs=True)
    return {
        "tensor_parallel": "torch's styles, torchtitan's parallelize_llama (SequenceParallel, PrepareModuleInput, "
        "ColwiseParallel, RowwiseParallel(output_layouts=Shard(1)))",
        "tp": setup.tp,
        "sequence_parallel": True,
        "loss_parallel": setup.loss_parallel,
    }


def _whole_sequence(config: Any) -> Any:
    """A forward pre-hook on the base model: the whole sequence's position ids and causal mask.

    transformers' base model makes them from its embedding output (5.25 models/llama/modeling_llama.py
    ``LlamaModel.forward``: ``torch.arange(inputs_embeds.shape[1])``, ``create_causal_mask(inputs_embeds=...)``),
    which sequence parallelism shortens to s/K: the rotary cos / sin then cover the first s/K positions and an
    eager mask is (s/K)², where the attention (after ``PrepareModuleInput``'s all-gather) sees s. The hook passes
    ``arange(s)`` (the batch's own position ids when it has them) and the mask ``create_causal_mask`` makes for an
    s-long input (masking_utils.py: a 4-D mask is returned as given; SDPA's causal case is ``None``, the kernel's
    ``is_causal``, which the model then finds again)."""
    from transformers.masking_utils import create_causal_mask

    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        import torch

        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or kwargs.get("inputs_embeds") is not None:
            return args, kwargs
        if kwargs.get("position_ids") is None:
            kwargs["position_ids"] = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        weight = module.embed_tokens.weight
        # (only the shape, dtype and device of inputs_embeds are read: a one-element tensor expanded)
        stand_in = torch.zeros((), dtype=weight.dtype, device=ids.device).expand(*ids.shape, weight.shape[-1])
        mask = create_causal_mask(
            config=config,
            inputs_embeds=stand_in,
            attention_mask=kwargs.get("attention_mask"),
            cache=None,
            position_ids=kwargs["position_ids"],
        )
        if mask is not None:
            kwargs["attention_mask"] = mask
        return args, kwargs

    return hook
