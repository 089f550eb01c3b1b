"""One decoder layer's activations, composed from the rooms: the mixer (attention, latent, compressed, gated
DeltaNet, Mamba-2), the MLP or MoE block and their norms, then the layer's forward and backward moments. No room knows
a model family; this module picks the rooms from the spec's facts (norm kind, mixer, latent / compressed attention).

The textbook formula s·b·h·(34 + 5·nh·s/h) (Korthikanti et al. 2022, GPT-3 style MHA, GELU MLP of 4h, dropout
everywhere) misses SwiGLU's three f-sized tensors, RMSNorm's fp32 upcasts and the fp32 logits, and counts dropout
masks Llama does not have: see :func:`korthikanti`. Proved by tests/core_torch/test_saved_tensors.py and every
trace test under tests/trace/."""

from __future__ import annotations

from cabe import fp8
from cabe.activations import attention, attention_block, compressed, deltanet, latent, mamba, mlp, moe
from cabe.activations.latent import BEFORE_INDEXER
from cabe.activations.state import LayerState
from cabe.activations.terms import LayerActivations
from cabe.architecture import ModelSpec
from cabe.facts import layer_facts
from cabe.layers import LayerGroup
from cabe.precision import Dtypes
from cabe.training import TrainingSetup
from cabe.units import round_alloc


def layer_activations(
    spec: ModelSpec,
    setup: TrainingSetup,
    dt: Dtypes,
    *,
    base_trainable: bool,
    adapters: bool,
    group: LayerGroup | None = None,
    masked: bool = False,
    bottom: bool = False,
) -> LayerActivations:
    """Saved bytes per token of ONE decoder layer of ``group`` (the first run's when None) through which
    gradients flow. A model whose layers differ asks once per run (:attr:`ModelSpec.runs`). ``masked``: a
    layer whose SDPA call gets a mask (see :func:`sdpa_masked_layers`). ``bottom``: the lowest layer of the
    gradient's path when its input requires no grad (see ``LayerState.live``)."""
    group = group or spec.runs[0]
    facts = layer_facts(
        spec, group, setup, dt, base_trainable=base_trainable, adapters=adapters, masked=masked, bottom=bottom
    )
    layer = LayerState(facts)
    bwd = rms_norm_block(layer) if spec.norm == "rmsnorm" else layer_norm_block(layer)
    attn, a, nh, s, quantized = layer.facts.attn, layer.facts.a, layer.facts.nh, layer.facts.s, layer.facts.quantized
    fwd = max(attention.forward_workspace(attn, a, nh, s), layer.mixer_forward)
    attn_bwd = max(
        attention.eager_backward_workspace(layer, attn, a, nh, s), attention.math_backward_workspace(attn, nh, s)
    )
    attn_bwd = max(attn_bwd, layer.mixer_backward)
    if group.mixer == "mamba2":  # the fused Mamba-2 kernel's own transients (activations.mamba)
        x = mamba.in_proj_dtype(layer)
        fwd, attn_bwd = mamba.forward_workspace(spec, s, x, a), mamba.backward_workspace(spec, s, x, a)
    mlp_saved = _freed_before_attention_backward(layer)
    mlp_bwd = bwd  # the block's own backward transient, while every saved tensor is alive
    bwd = max(bwd, attn_bwd - mlp_saved)
    # flash and memory-efficient attention keep their philox seed and offset: two 512 B blocks
    rng = 2 * 512 if attn in ("flash", "efficient") and layer.facts.group.mixer == "attention" else 0
    if spec.rotary_by_cat:  # NOTE: GPT-NeoX and Phi-3 cast cos and sin in every layer: (1, s, rotary_dim) each
        layer.constant += 2 * round_alloc(s * spec.rotary_dim * (4 if quantized else a))
    fwd8, bwd8 = _fp8_moments(layer) if layer.facts.setup.fp8 != "none" else (0, 0)
    return LayerActivations(
        tuple(layer.terms),
        bwd,
        fwd,
        layer.constant,
        rng,
        mlp_saved,
        attn_bwd,
        layer.dora_norm_bytes,
        mlp_bwd,
        layer.input_alias,
        layer.backward_constant,
        max(layer.lora_pending.values(), default=0),  # modules whose saved tensors were never counted: at the end
        layer.stray_grads,
        layer.stray_grads_mlp,
        layer.indexer_transient,
        sum(t.bytes_per_token for t in layer.terms[layer.indexer_from :] if t.name not in BEFORE_INDEXER)
        if layer.indexer_transient
        else 0,
        max(0, layer.dora_result_moment - layer.facts.tokens * layer.saved),
        dispatch_workspace_per_token=layer.dispatch_workspace,
        experts_freed_per_token=layer.experts_freed,
        output_grad_per_token=layer.output_grad,
        gathered_input_per_token=layer.gathered,
        mlp_gathered_per_token=layer.gathered_mlp,
        fp8_forward_bytes=fwd8,
        fp8_backward_bytes=bwd8,
        stream_at=tuple(layer.stream_at),
        mlp_from=layer.mlp_from,
    )


def _fp8_moments(layer: LayerState) -> tuple[int, int]:
    """torchao's fp8 casts in a trained layer: the forward moment of its MLP's output projection (the layer's last
    GEMM, every tensor of the layer saved) and the backward moment of the same projection (the first backward of
    the layer), in bytes (cabe.fp8.torchao_forward_moment / torchao_backward_moment). The attention's projections
    cast smaller inputs (h, not f) after the MLP's saved tensors are released: not the layer's peak."""
    recipe, facts = layer.facts.setup.fp8, layer.facts
    if not fp8.is_torchao(recipe) or not facts.base_trainable:
        return 0, 0
    downs = [
        lin for lin in facts.group.linears if lin.slot in ("down", "shared_down") and fp8.converted(facts.spec, lin)
    ]
    fwd = bwd = 0
    for lin in downs:
        i, o, p = lin.in_features, lin.out_features, lin.weight_count
        fwd = max(fwd, fp8.torchao_forward_moment(recipe, i, p, facts.tokens))
        bwd = max(bwd, fp8.torchao_backward_moment(recipe, i, o, p, facts.tokens, facts.a, facts.rho))
    return fwd, bwd


def rms_norm_block(layer: LayerState) -> int:
    """RMSNorm blocks (Llama, Gemma, Phi-3, Mixtral, OLMo 2): attention, then a gated or MoE MLP.
    Returns the backward workspace per token."""
    if layer.facts.spec.compressed_attention:  # DeepSeek-V4's layer (activations.compressed): follows ``live``
        return compressed.add_block(layer)
    if layer.facts.group.mixer == "mamba2":
        mamba.mixer_terms(layer)
    elif layer.facts.group.mixer == "gated_deltanet":
        deltanet.add_block(layer)
    elif layer.facts.spec.latent_attention:
        latent.latent_attention(layer)
    else:
        attention_block.rms_attention(layer)
    layer.mlp_from = len(layer.terms)
    mlp.rms_mlp(layer)
    if layer.dense_experts_backward:
        return moe.dense_experts_backward(layer)
    if layer.product_saved:
        # the product itself is what down_proj's backward node saved (its MmBackward0, or lora_A's when no
        # cast stands between them): autograd releases it once that node has run, before MulBackward0 makes
        # the gradients of the activation and of up's output beside the product's own — 3 f-sized tensors
        # with the product gone, and the layer's incoming gradient (ρ·h). Traced: llama-2-7b QLoRA without
        # autocast (a = 4) keeps gate, act and up plus 8·f and 4·h at the layer's peak, not 12·f + 8·h.
        return 2 * layer.facts.a * layer.facts.f + layer.facts.rho * layer.facts.h
    # otherwise lora_A saved a cast of the product (autocast's, or PEFT's fp32 one): the LoRA path's
    # gradient goes through that cast's ToCopyBackward0 while the base's gradient waits for the sum.
    # Under QLoRA's prepared model the MLP's outputs are fp32 (Linear4bit returns its fp32 input's dtype): so
    # are the product's gradient (bitsandbytes' MatMul4Bit.backward casts it back to the input's dtype) and
    # MulBackward0's two (a plain 2-layer Qwen2.5-1.5B, vocab 4096, QLoRA b1 × 2048: −10.7% with them 16-bit)
    m = 4 if layer.facts.quantized else layer.facts.a
    return 3 * m * layer.facts.f + 2 * layer.facts.rho * layer.facts.h  # backward workspace per token


def layer_norm_block(layer: LayerState) -> int:
    """LayerNorm blocks with a plain GELU MLP (GPT-2, GPT-NeoX, Falcon). Returns the backward
    workspace per token."""
    layer.block = "attn"
    attention_block.ln_attention(layer)
    layer.mlp_from = len(layer.terms)
    layer.block = "mlp"
    mlp.ln_mlp(layer)
    f, h, rho = layer.facts.f, layer.facts.h, layer.facts.rho
    if layer.facts.quantized:
        # QLoRA's prepared model: the MLP's outputs are fp32 (Linear4bit returns its fp32 input's dtype,
        # bitsandbytes 0.50.2 nn/modules.py:626-637, Linear4bit.forward), so are the three gradients of the output
        # projection's input alive at once: the base path's (its cast to compute_dtype, ToCopyBackward0), the LoRA
        # path's (through autocast's or PEFT's cast of it, ToCopyBackward0) and their sum — or the sum and
        # MulBackward0's two of GELU's last product — with the layer's incoming gradient (ρ·h); what lora_A alone
        # saved of that input is released once its MmBackward0 has run (torch/csrc/autograd/engine.cpp).
        # gpt2 QLoRA under bf16 autocast, checkpointing, DPO b4 × 256: the top layer's 3·4·f − 2·f + 4·h traced
        # (−5.5% with 2·a·f + 2·ρ·h)
        return 3 * 4 * f - layer.down_input + rho * h  # backward workspace per token
    return 2 * layer.facts.a * f + 2 * rho * h  # backward workspace per token


def _freed_before_attention_backward(layer: LayerState) -> int:
    """Bytes per token the MLP block saved, released before attention's backward starts.

    Autograd frees a node's saved tensors once it has run (torch/csrc/autograd/engine.cpp, ``call_function``
    then ``fn.release_variables()`` when the graph is not retained), and among ready nodes it runs the one
    created last first (``CompareNodeTaskTime``: higher ``sequence_nr`` first). The MLP is built after
    attention in every family's forward, sequential or parallel (Falcon, GPT-NeoX), so its nodes run first."""
    return sum(t.bytes_per_token for t in layer.terms[layer.mlp_from :])


def korthikanti(spec: ModelSpec, setup: TrainingSetup) -> int:
    """The textbook per-layer estimate s·b·h·(34 + 5·a·s/h) bytes (16-bit, no recompute)."""
    s, b, h, nh = setup.seq, setup.batch, spec.hidden_size, spec.num_heads
    return int(s * b * h * (34 + 5 * nh * s / h))
