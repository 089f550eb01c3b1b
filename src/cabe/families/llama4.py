"""Llama 4 (``llama4``: Scout 17B-16E, Maverick 17B-128E; ``llama4_text``: the decoder alone).

transformers 5.24, models/llama4/modeling_llama4.py and configuration_llama4.py. A Llama layer (pre-norm RMSNorm,
q / k / v / o without biases, grouped kv heads) whose pieces differ as follows, each said by what it does to
memory:

* **Interleaved MoE** (``Llama4TextDecoderLayer.__init__``): layer ``i`` is a mixture of experts when ``i`` is in
  ``moe_layers`` (by default ``range(interleave_moe_layer_step - 1, layers, step)``: every layer of Scout, every
  other one of Maverick), else a SwiGLU MLP of ``intermediate_size_mlp``. A model of both kinds is runs of dense
  and MoE layers, bottom first. Parameters: the MoE layer holds ``num_local_experts`` experts as two 3-D
  parameters (``gate_up_proj`` h -> 2f, ``down_proj`` f -> h, f = ``intermediate_size``), a router (``Llama4Router``,
  an ``nn.Linear`` subclass h -> E without bias: PEFT's ``all-linear`` would wrap it, bitsandbytes' ``type(m) is
  nn.Linear`` test leaves it alone) and a **shared expert** (``Llama4TextMLP`` of width f, three ``nn.Linear``, no
  gate: its output is added to the routed one).
* **Top-1 sigmoid routing** (``Llama4Router.forward``): ``topk`` of the logits, the others set to -inf, a sigmoid
  over all E in fp32 (its output saved, 4·E per token). Then ``Llama4TextMoe.forward`` sends **every token through
  every expert** — ``hidden_states.repeat(E, 1)`` times the router scores (zero for the experts not picked), then
  ``torch.bmm`` over the E experts — so the saved activations and the FLOPs of a MoE layer are E× those of the k
  picked experts (``expert_dispatch = "dense"``, see :func:`cabe.activations.moe._dense_experts`). The published "17B
  active" counts the k picked experts; transformers computes all E.
* **Chunked local attention** (``attention_chunk_size``, ``layer_types``): the layers that rotate q and k attend
  only within their ``attention_chunk_size``-token chunk (``chunked_attention``); the others attend globally. No
  parameters. KV cache: transformers keeps the chunked layers in a ``DynamicSlidingWindowLayer`` of the chunk size
  (cache_utils.py, "sliding and chunked are the same in how they should behave"), so they hold at most
  ``attention_chunk_size`` tokens, like a sliding window. SDPA: transformers builds a chunked mask for them once
  the sequence reaches the chunk (masking_utils.py ``_ignore_causal_mask_sdpa``, ``kv_length >=
  local_attention_size``), so flash cannot run there and the memory-efficient kernel saves the mask's bias. FLOPs:
  each token attends at most the chunk. ``flash_attention_2`` is refused by the model (``_supports_flash_attn =
  False``, and ``create_chunked_causal_mask`` raises beyond one chunk).
* **NoPE layers** (``no_rope_layers``: a 0 marks a layer without rotary; by default every
  ``no_rope_layer_interval``-th layer): no rotary, full attention. Nothing changes in the parameters.
* **Temperature tuning** (``attn_temperature_tuning``, NoPE layers only): the queries are multiplied by
  ``log1p(floor((pos + 1) / floor_scale)) · attn_scale + 1``, an fp32 vector of s values made in each layer and
  saved by the multiply (a per-layer constant of 4·s bytes); the product is cast back to the query's dtype, which
  is what attention saves (the same size as an unscaled query).
* **q / k L2 norm** (``use_qk_norm``, layers with rotary only; Scout has it, Maverick not): ``Llama4TextL2Norm``,
  no weight, computes in fp32: saves the fp32 q and k (4·q + 4·kv per token) and one fp32 rsqrt per head.
* Rotary (``apply_rotary_emb``): complex products of fp32 views, cast back with ``type_as``: nothing saved per
  layer (the product keeps the shared ``freqs_cis``); q and k reach attention in the compute dtype.

The multimodal ``llama4`` config nests the decoder in ``text_config`` (``Llama4TextConfig``'s defaults fill what it
leaves out) beside ``vision_config``: ``Llama4ForConditionalGeneration`` always builds the vision tower
(``Llama4VisionModel``, with ``Llama4VisionConfig``'s defaults when ``vision_config`` is missing) and the
multimodal projector, counted as ``ModelSpec.vision_parameters``: frozen weights, no activations (text-only
batches never run the tower; the report says so). ``AutoModelForCausalLM`` builds ``Llama4ForCausalLM`` from the
text config alone, without the tower: that is what ``cabe trace`` runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from cabe.architecture import ModelSpec
from cabe.errors import ConfigError
from cabe.families._common import Reader, attention_shape, config_section, decoder, gated_mlp, qkvo
from cabe.layers import LayerGroup, Linear

MODEL_TYPES = ("llama4", "llama4_text")

#: transformers 5.24 ``Llama4TextConfig`` defaults (models/llama4/configuration_llama4.py): what a key missing from
#: a ``text_config`` (or a flat ``llama4_text`` config) means.
LLAMA4_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 202_048,
    "hidden_size": 5120,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32,
    "tie_word_embeddings": False,
    "attention_dropout": 0.0,
    "num_experts_per_tok": 1,
    "num_local_experts": 16,
    "interleave_moe_layer_step": 1,
    "use_qk_norm": True,
    "no_rope_layer_interval": 4,
    "attention_chunk_size": 8192,
    "attn_temperature_tuning": True,
    "attention_bias": False,
}

#: transformers 5.24 ``Llama4VisionConfig`` defaults (configuration_llama4.py), for a ``vision_config`` that leaves
#: keys out or is missing (``Llama4Config.sub_configs_defaults`` builds one).
LLAMA4_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "num_hidden_layers": 34,
    "num_attention_heads": 16,
    "num_channels": 3,
    "intermediate_size": 5632,
    "vision_output_dim": 7680,
    "image_size": 448,
    "patch_size": 14,
    "projector_input_dim": 4096,
    "projector_output_dim": 4096,
}


def _section(c: Mapping[str, Any], key: str, defaults: Mapping[str, Any]) -> dict[str, Any]:
    return {**defaults, **(config_section(c, key) or {})}


def vision_parameters(v: Reader, text_hidden: int) -> tuple[int, int]:
    """Parameters of ``Llama4VisionModel`` and ``Llama4MultiModalProjector`` (modeling_llama4.py), and of those the
    weights of their ``nn.Linear`` layers (every matrix below; not the biases, embeddings or LayerNorms):

    * patch embedding: ``Llama4UnfoldConvolution``'s linear, channels·p·p -> vh, no bias; the class embedding (vh)
      and learned positions ((image // p)² + 1 patches × vh); ``layernorm_pre`` and ``layernorm_post`` (LayerNorm
      with bias, 2·vh each);
    * per layer: q / k / v / o with biases (4·(vh² + vh)), ``fc1`` vh -> vf and ``fc2`` vf -> vh with biases, two
      LayerNorms (4·vh);
    * the vision adapter (``Llama4VisionMLP2``): ``fc1`` intermediate_size -> projector_input_dim and ``fc2``
      projector_output_dim -> projector_output_dim, no biases;
    * the projector: vision_output_dim -> the text hidden size, no bias.

    NOTE: QLoRA's bitsandbytes quantizes every one of those matrices: ``replace_with_bnb_linear`` converts each
    module whose type is exactly ``nn.Linear`` (integrations/bitsandbytes.py:189) outside ``modules_to_not_convert``,
    which for ``Llama4ForConditionalGeneration`` holds only the output embedding ``language_model.lm_head``
    (quantizers/base.py:39-63: tied keys, the last parameter's module, ``get_output_embeddings``; no
    ``_keep_in_fp32_modules``). The patch embedding is an ``nn.Linear`` over unfolded patches
    (``Llama4UnfoldConvolution.linear``, modeling_llama4.py:959), so it is 4-bit too; the class embedding, the
    positions and the LayerNorms stay in the load dtype (fp32 after ``prepare_model_for_kbit_training``)."""
    vh, vf = v.int("hidden_size"), v.int("intermediate_size")
    p, image = v.int("patch_size"), v.int("image_size")
    patches = (image // p) ** 2 + 1
    patch_linear = v.int("num_channels") * p * p * vh
    embeddings = patch_linear + vh + patches * vh + 2 * 2 * vh
    layer_linear = 4 * vh * vh + vh * vf + vf * vh
    layer = layer_linear + 4 * vh + vf + vh + 2 * 2 * vh  # the linears' biases, two LayerNorms
    po = v.int("projector_output_dim")
    adapter = vf * v.int("projector_input_dim") + po * po
    projector = v.int("vision_output_dim") * text_hidden
    layers = v.int("num_hidden_layers")
    linear = patch_linear + layers * layer_linear + adapter + projector
    return embeddings + layers * layer + adapter + projector, linear


def _listed(r: Reader, key: str, layers: int) -> list[Any] | None:
    v = r.c.get(key)
    if v is None or (isinstance(v, list) and not v):  # Llama4TextConfig: an empty list means the default
        return None
    if not isinstance(v, list) or len(v) < layers:
        raise ConfigError("config_bad_value", "model", key=key, detail=repr(v)[:80])
    return v


def layer_plan(r: Reader, layers: int) -> list[tuple[bool, bool, int | None]]:
    """Each layer's (MoE, rotary, chunk or None), as ``Llama4TextConfig.__post_init__`` fills ``moe_layers``,
    ``no_rope_layers`` and ``layer_types``."""
    step = r.int("interleave_moe_layer_step", default=1)
    moe_layers = _listed(r, "moe_layers", 0)
    moe = set(moe_layers) if moe_layers is not None else set(range(step - 1, layers, step))
    interval = r.int("no_rope_layer_interval", default=4)
    no_rope = _listed(r, "no_rope_layers", layers) or [int((i + 1) % interval != 0) for i in range(layers)]
    chunk_raw = r.c.get("attention_chunk_size", 8192)
    chunk = None if chunk_raw is None else r.int("attention_chunk_size")
    types = _listed(r, "layer_types", layers) or [
        "chunked_attention" if rope and chunk is not None else "full_attention" for rope in no_rope[:layers]
    ]
    return [(i in moe, bool(no_rope[i]), chunk if types[i] == "chunked_attention" else None) for i in range(layers)]


def _moe_linears(h: int, experts: int, f: int) -> tuple[Linear, ...]:
    return (
        # Llama4Router subclasses nn.Linear: PEFT could wrap it, bitsandbytes does not (type(m) is nn.Linear)
        Linear("router", h, experts, False, role="router", quantizable=False, slot="router"),
        Linear("experts.gate_up_proj", h, 2 * f, False, experts, is_module=False, role="expert", slot="experts"),
        Linear("experts.down_proj", f, h, False, experts, is_module=False, role="expert", slot="experts"),
        Linear("gate_proj", h, f, role="mlp", slot="shared_up"),
        Linear("up_proj", h, f, role="mlp", slot="shared_up"),
        Linear("down_proj", f, h, role="mlp", slot="shared_down"),
    )


def read_text(r: Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = attention_shape(r)
    f = r.int("intermediate_size")
    f_mlp = r.int("intermediate_size_mlp")
    experts = r.int("num_local_experts")
    layers = r.int("num_hidden_layers")
    bias = r.bool("attention_bias", False)
    attn = qkvo(h, nh, nkv, d, bias, bias)
    moe = LayerGroup(1, attn + _moe_linears(h, experts, f), "moe", intermediate_size=f)
    dense = LayerGroup(1, attn + gated_mlp(h, f_mlp, False), "gated", intermediate_size=f_mlp)
    groups: list[LayerGroup] = []
    for is_moe, rope, chunk in layer_plan(r, layers):
        g = replace(moe if is_moe else dense, rope=rope)
        if chunk is not None:
            g = replace(g, attention="chunked", window=chunk)
        if groups and replace(groups[-1], count=1) == g:
            groups[-1] = replace(g, count=groups[-1].count + 1)
        else:
            groups.append(g)
    return decoder(
        r,
        name,
        "llama4",
        (h, nh, nkv, d),
        f_mlp,
        tied=False,
        qk_norm="l2" if r.bool("use_qk_norm", True) else "none",
        activation=r.str("hidden_act", default="silu"),
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings"),
        layer_groups=tuple(groups),
        num_experts=experts,
        experts_per_token=r.int("num_experts_per_tok"),
        router="topk_sigmoid",
        expert_dispatch="dense",
        # NOTE: published configs carry an int here (truthy); transformers 5.24's strict config takes a bool
        nope_temperature_tuning=bool(r.c.get("attn_temperature_tuning", True)),
        attention_dropout=r.dropout("attention_dropout"),
        # NOTE: Llama 4's eager_attention_forward takes the softmax in the scores' dtype (no fp32 cast)
        eager_softmax_fp32=False,
        # NOTE: PEFT 0.21 has q_proj, v_proj for llama4 (peft/utils/constants.py) and nothing for llama4_text
        peft_default_targets=("q_proj", "v_proj"),
        # Llama4TextDecoderLayer: self.self_attn, self.feed_forward (dense MLP or MoE)
        module_prefixes=(("attn", "self_attn."), ("mlp", "feed_forward."), ("router", "feed_forward.")),
        lora_breaks=("router",),
        flash_attention=False,  # NOTE: Llama4PreTrainedModel._supports_flash_attn = False
    )


def read(r: Reader, name: str) -> ModelSpec:
    if r.model_type == "llama4_text":
        return read_text(Reader({**LLAMA4_TEXT_DEFAULTS, **r.c}, r.model_type), name)
    text = _section(r.c, "text_config", LLAMA4_TEXT_DEFAULTS)
    if "tie_word_embeddings" in r.c:  # Llama4Config's own tie_word_embeddings (default False)
        text["tie_word_embeddings"] = r.c["tie_word_embeddings"]
    spec = read_text(Reader(text, "llama4_text"), name)
    vision = Reader(_section(r.c, "vision_config", LLAMA4_VISION_DEFAULTS), "llama4_vision_model")
    parameters, linear = vision_parameters(vision, spec.hidden_size)
    return replace(
        spec,
        model_type="llama4",
        config=dict(r.c),
        vision_parameters=parameters,
        vision_linear_parameters=linear,
        # transformers 5.24 models/auto/modeling_auto.py maps llama4 to Llama4ForCausalLM for causal LM: the decoder
        # alone (the tower is dropped on load); Llama4ForConditionalGeneration.forward reads
        # ``outputs.image_outputs`` from that decoder's output, which has none (modeling_llama4.py:1318)
        causal_lm_drops_tower=True,
    )
