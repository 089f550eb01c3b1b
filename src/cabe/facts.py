"""The request resolved once, per layer part: what trains, what is adapted, quantized, cast and in which dtype, and
which attention kernel really runs. The activation rooms (:mod:`cabe.activations`) read these facts; none of them asks
:mod:`cabe.method` or the setup again.

* :class:`LayerFacts` — one decoder layer of one group (:func:`layer_facts`): shapes, dtypes (compute, residual,
  weights, adapters), autocast and its per-op casts, LoRA targets and PEFT's wrapped bare parameters, dropout, DoRA,
  QLoRA's 4-bit layers and the prepared model's fp32 residual, the attention kernel (eager, flash, efficient, math),
  and whether this is the bottom layer of the gradient's path.
* :class:`HeadFacts` — the model head (:func:`head_facts`): an adapted lm_head or embedding, a trained copy of the
  lm_head (``modules_to_save``).
* The kernel choice itself: :func:`attention_kind`, :func:`sdpa_masked_layers`, :func:`masked_sdpa_kind`,
  :func:`sdpa_gqa_math` (PyTorch's ``select_sdp_backend`` and transformers' mask rules, cited at each).

Proved through the rooms that read them: tests/core_torch/test_saved_tensors.py (saved-tensor hooks, one layer per
family and setup), tests/trace/test_mechanisms.py (masked SDPA), tests/trace/test_bottom_layer.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from cabe import memo
from cabe.architecture import ModelSpec
from cabe.layers import LayerGroup, Linear
from cabe.method import head_targets, lora_parameter_targets, lora_targets, saved_modules, wrapped_adapter_sizes
from cabe.precision import Dtypes, loaded_dtype
from cabe.training import TrainingSetup


def attention_kind(spec: ModelSpec, setup: TrainingSetup) -> str:
    """What attention really runs: ``eager`` or ``flash`` (fused SDPA kernels).

    ``sdpa`` runs what the family's ``sdpa_fallback`` says when SDPA cannot use a fused kernel
    (Gemma 2's soft-capping: eager; Falcon's multi-query call: PyTorch's math kernel, which upcasts
    q, k, v to fp32 and keeps the s×s softmax).
    """
    if setup.attention == "eager":
        return "eager"
    if setup.attention == "sdpa" and spec.sdpa_fallback:
        return spec.sdpa_fallback
    return "flash"


def sdpa_masked_layers(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Layers whose SDPA call gets an explicit mask from transformers, so that flash cannot run.

    transformers/masking_utils.py (5.24), ``sdpa_mask`` -> ``_ignore_causal_mask_sdpa``: the mask is skipped
    (``is_causal=True`` instead) unless ``local_attention_size is not None and kv_length >=
    local_attention_size``; sliding layers pass their window as ``local_size``, chunked layers their chunk."""
    if setup.attention != "sdpa" or spec.sdpa_fallback:
        return 0
    s = setup.tokens_per_sequence
    if spec.sdpa_mask_window is not None and s >= spec.sdpa_mask_window:
        return spec.num_layers
    # chunked layers (Llama 4) pass their chunk as local_size (masking_utils.py, create_chunked_causal_mask)
    return sum(n for window, n in spec.local_windows if s >= window)


def masked_sdpa_kind(spec: ModelSpec, dt: Dtypes) -> str:
    """The kernel SDPA runs with a mask on CUDA: ``efficient`` when the head dimension meets the
    memory-efficient kernel's alignment, else ``math`` (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
    ``select_sdp_backend``: flash is refused by ``check_for_attn_mask``; ``can_use_mem_efficient_attention``
    needs head dims divisible by ``minimum_gemm_alignment``, 8 for 16-bit and 4 for fp32 on sm80+)."""
    return "efficient" if spec.head_dim % (8 if dt.compute == 2 else 4) == 0 else "math"


def sdpa_gqa_math(spec: ModelSpec, setup: TrainingSetup, a_attn: int) -> bool:
    """An unmasked SDPA call with grouped kv heads and fp32 queries runs PyTorch's math kernel on CUDA.

    transformers passes ``enable_gqa=True`` when there is no mask and the head dim is at most 256
    (integrations/sdpa_attention.py 5.24, ``use_gqa_in_sdpa``); flash refuses fp32, and the memory-efficient
    kernel's dense constraints instantiate ``check_batch_size_and_num_heads_dense<false
    /*supports_grouped_query_attention=*/>`` (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp), so
    ``select_sdp_backend`` falls to math, which ``repeat_interleave``s k and v to the query's heads.
    Measured on an H200: TinyLlama fp32, batch 4, seq 1024 peaks at 42.3 GB (benchmarks/gpu/results)."""
    return (
        setup.attention == "sdpa"
        and not spec.sdpa_fallback
        and a_attn == 4
        and spec.num_kv_heads != spec.num_heads
        and spec.head_dim <= 256
    )


@dataclass(frozen=True)
class LayerFacts:
    """One decoder layer of one group, as the request makes it (see :func:`layer_facts` for where each comes from)."""

    spec: ModelSpec
    group: LayerGroup  # what this layer is made of (its linears, MLP kind and width)
    setup: TrainingSetup
    base_trainable: bool
    h: int
    kv: int
    f: int
    nh: int
    s: int
    batch: int
    tokens: int
    a: int  # the compute dtype's bytes
    rho: int  # the residual stream's bytes
    loaded_dtype: str  # the name of the dtype the non-4-bit weights were loaded in (precision.loaded_dtype)
    autocast: bool
    dt_weight: int
    dt_frozen: int
    amp: bool  # a linear layer's input is cast per op
    targets: frozenset[str]  # the group's LoRA-adapted linears
    wrapped: dict[str, tuple[Linear, int]]  # bare parameters PEFT wraps (MoE experts, routers), rank multiplier
    wrapped_sizes: dict[str, int]  # their adapter factors' elements (cabe.method.wrapped_adapter_sizes)
    r: int  # LoRA rank
    dora: bool
    dropout: bool
    ad: int  # the adapters' dtype's bytes
    adapter_cast: bool  # PEFT's _cast_input_dtype gives lora_A an fp32 copy of its input
    four_bit: bool  # bitsandbytes' 4-bit layers
    quantized: bool  # the prepared model's terms: an fp32 residual that the 4-bit layers take and return
    attn: str  # the attention kernel that runs: eager, flash, efficient, math (or the mixer's name)
    gqa_repeat: bool  # the math kernel's enable_gqa: repeat_interleave copies k and v
    setup_attention: str
    a_attn: int  # the bytes of what the attention kernel reads and writes
    gqa: bool
    key_cast: bool  # k reaches attention in the residual's dtype (rotary multiplies it by cos and sin in it)
    qkv_names: list[str]
    o_name: str
    up_names: list[str]
    down_name: str
    bottom: bool  # the lowest layer of the gradient's path, its input requiring no grad
    #: the adapters are in the autocast dtype (``adapter_dtype`` model, weights in autocast's half): autocast's cast
    #: of lora_A's 16-bit input and weight returns them as they are, so lora_A saves x itself
    adapter_native: bool = False


def layer_facts(
    spec: ModelSpec,
    group: LayerGroup,
    setup: TrainingSetup,
    dt: Dtypes,
    *,
    base_trainable: bool,
    adapters: bool,
    masked: bool = False,
    bottom: bool = False,
) -> LayerFacts:
    """The facts of one layer of ``group``. ``masked``: its SDPA call gets a mask (:func:`sdpa_masked_layers`);
    ``bottom``: the lowest layer of the gradient's path when its input requires no grad."""
    # Resolved once per model and request less its shape (cabe.memo): every fact but the setup itself, the sequence,
    # the batch and the tokens is independent of the batch and the sequence, so a sweep over them (cabe fit) reuses
    # them and sets only those four. (The group and the dtypes by identity: the entry keeps them alive.)
    m = memo.of(spec)
    key = ("layer_facts", memo.request_key(setup), id(group), id(dt), base_trainable, adapters, masked, bottom)
    hit = m.get(key)
    if hit is None:
        facts = _layer_facts(spec, group, setup, dt, base_trainable, adapters, masked, bottom)
        m[key] = (group, dt, dict(vars(facts)))
        return facts
    # the frozen dataclass filled without its __init__ (40 fields set one by one cost more than the rest of the
    # lookup): the same fields, the four that depend on the shape set anew
    facts = object.__new__(LayerFacts)
    d = facts.__dict__
    d.update(hit[2])
    s = setup.tokens_per_sequence
    d["setup"], d["s"], d["batch"], d["tokens"] = setup, s, setup.batch, setup.batch * s
    return facts


def _layer_facts(
    spec: ModelSpec,
    group: LayerGroup,
    setup: TrainingSetup,
    dt: Dtypes,
    base_trainable: bool,
    adapters: bool,
    masked: bool,
    bottom: bool,
) -> LayerFacts:
    rho = dt.residual
    # a linear layer's input is cast per op: an fp32 residual under autocast, or LayerNorm's output
    # (layer_norm is on autocast's fp32 list) whatever the residual's dtype
    amp = dt.amp or (dt.autocast and spec.norm == "layernorm")
    targets = frozenset(lin.name for lin in lora_targets(spec, setup.lora_targets, group)) if adapters else frozenset()
    # bare parameters PEFT wraps (MoE experts, routers: cabe.method.lora_parameter_targets), rank multiplier
    wrapped = (
        {lin.name: (lin, m) for lin, m in lora_parameter_targets(spec, setup.lora_targets, group)} if adapters else {}
    )
    wrapped_sizes = {n: sum(wrapped_adapter_sizes(lin, setup.lora_rank, m)) for n, (lin, m) in wrapped.items()}
    # QLoRA (bitsandbytes Linear4bit under autocast): the 4-bit layers save no input (their weight is
    # frozen), cast their output back to the fp32 residual dtype, and LoRA adapters run under autocast.
    # ``four_bit``: bitsandbytes' 4-bit layers, whatever the rest of the model is in; ``quantized`` (the terms
    # below): as prepare_model_for_kbit_training leaves the model, an fp32 residual that the 4-bit layers take and
    # return. Without it (``kbit_prep`` off: unsloth, LLaMA-Factory) the rest stays in the compute dtype and
    # a 4-bit layer reads and writes it as a frozen 16-bit nn.Linear does: LoRA's terms on a 16-bit base.
    four_bit = setup.method == "qlora" and any(lin.quantized_by_bnb for lin in spec.layer_linears)
    # (16-bit weights under the other half's autocast give an fp32 residual too: the prepared model's terms)
    # Without it a 4-bit layer still returns its input's dtype (bitsandbytes nn/modules.py Linear4bit.forward,
    # ``out.to(inp_dtype)``): under autocast LayerNorm's output is fp32 (layer_norm is on autocast's fp32 list),
    # so the MLP returns fp32 and the residual it is added to is fp32 from the first layer's output on: the
    # prepared model's terms again (gpt2-medium, pythia-1.4b; RMSNorm returns its input's 16 bits)
    ln_fp32 = dt.autocast and spec.norm == "layernorm" and four_bit and not setup.kbit_prep
    if ln_fp32:
        rho = 4
    quantized = four_bit and (setup.kbit_prep or (dt.autocast and dt.residual == 4) or ln_fp32)
    # transformers' flash_attention_2 casts fp32 queries, keys and values to 16 bits first (to the
    # quantized model's dtype under QLoRA without autocast: integrations/flash_attention.py,
    # get_target_dtype): the kernel saves those casts and writes a 16-bit output
    a_attn = 2 if (setup.attention == "flash" and dt.compute == 4) else dt.compute
    attn, gqa_repeat = attention_kind(spec, setup), False
    if group.mixer == "gated_deltanet":  # a linear-attention layer runs no attention kernel (cabe.linear_attention)
        attn = group.mixer
    if masked and attn == "flash":
        attn = masked_sdpa_kind(spec, dt)
    elif sdpa_gqa_math(spec, setup, a_attn) and attn == "flash":
        attn, gqa_repeat = "math", True
    return LayerFacts(
        spec=spec,
        group=group,
        setup=setup,
        base_trainable=base_trainable,
        h=spec.hidden_size,
        kv=spec.kv_dim,
        f=spec.ffn_size(group),
        nh=spec.num_heads,
        s=setup.tokens_per_sequence,
        batch=setup.batch,
        tokens=setup.batch * setup.tokens_per_sequence,
        a=dt.compute,
        rho=rho,
        loaded_dtype=loaded_dtype(setup),
        autocast=dt.autocast,
        dt_weight=dt.weight,
        dt_frozen=dt.frozen,
        amp=amp,
        targets=targets,
        wrapped=wrapped,
        wrapped_sizes=wrapped_sizes,
        r=setup.lora_rank,
        # LoRA variants (peft/tuners/lora/layer.py 0.21, Linear.forward / variants.py DoraLinearVariant.forward)
        dora=adapters and setup.dora,
        dropout=adapters and setup.lora_dropout > 0,
        ad=dt.adapter_compute,
        # without autocast PEFT's _cast_input_dtype gives lora_A an fp32 copy of its input, which it saves
        adapter_cast=dt.adapter_compute != dt.compute and not dt.autocast,
        four_bit=four_bit,
        quantized=quantized,
        attn=attn,
        gqa_repeat=gqa_repeat,
        setup_attention=setup.attention,
        a_attn=a_attn,
        gqa=spec.num_kv_heads != spec.num_heads,
        # rotary multiplies k by cos and sin in the residual's dtype: k reaches attention in that dtype
        key_cast=spec.position == "rotary" and rho != a_attn,
        qkv_names=group.slot_names("qkv"),
        o_name=group.slot_names("o")[0],
        up_names=group.slot_names("up"),
        down_name=(group.slot_names("down") or [""])[0],
        bottom=bottom,
        adapter_native=dt.autocast and setup.adapter_dtype == "model" and setup.dtype == setup.autocast,
    )


@dataclass(frozen=True)
class HeadFacts:
    """The model head, as the request makes it: LoRA on the lm_head or on the token embedding, a trained copy of the
    lm_head (``modules_to_save``, cabe.method.saved_modules)."""

    lm_head_adapted: bool
    embedding_adapted: bool
    lm_head_saved: bool


def head_facts(spec: ModelSpec, setup: TrainingSetup) -> HeadFacts:
    m, key = memo.of(spec), ("head_facts", memo.request_key(setup))  # once per model and request less its shape
    hit = m.get(key)
    if hit is None:
        hit = m[key] = _head_facts(spec, setup)
    return hit


def _head_facts(spec: ModelSpec, setup: TrainingSetup) -> HeadFacts:
    kinds = {t.kind for t in head_targets(spec, setup.lora_targets)} if setup.adapters else set()
    return HeadFacts(
        lm_head_adapted="lm_head" in kinds,
        embedding_adapted="embedding" in kinds,
        lm_head_saved=any(t.kind == "lm_head" for t in saved_modules(spec, setup)),
    )
