"""gpt-oss (openai/gpt-oss-20b, -120b): pre-norm RMSNorm layers whose attention has learned sinks and whose MLP is
a mixture of experts with biases and a clamped SwiGLU.

transformers 5.24, models/gpt_oss/modeling_gpt_oss.py:

* Attention: q, k, v, o ``nn.Linear`` with biases (``attention_bias``), grouped kv heads, rotary written with
  ``torch.chunk`` + ``torch.cat`` (``_apply_rotary_emb``), and ``sinks``, one learned logit per head
  (``GptOssAttention.__init__``). ``layer_types`` alternates ``sliding_attention`` (window ``sliding_window``,
  128) and ``full_attention``, sliding first (``GptOssConfig.__post_init__``).
  Which attention runs: ``_supports_sdpa = False`` (SDPA cannot add a sink column), so transformers turns an
  ``sdpa`` request into ``eager`` (modeling_utils.py, ``get_correct_attn_implementation``), whose
  ``eager_attention_forward`` concatenates the sinks to the scores, softmaxes in the scores' dtype and drops
  the sink column. ``flash_attention_2`` (Dao-AILab) has no sink argument: transformers passes ``s_aux`` only
  to kernels that take it (modeling_flash_attention_utils.py, ``_process_flash_attention_kwargs``: FA3 from
  ``kernels-community/vllm-flash-attn3`` as ``s_aux``, FA4 as ``learnable_sink``); their saved tensors are
  flash's (q, k, v, output, log-sum-exp), which is what cabe and its trace count for ``flash``.
* MoE in every layer: a router with a bias (``GptOssTopKRouter``: top-k of the logits, softmax over the k
  values), ``num_local_experts`` experts stored as 3-D parameters with 2-D biases (``gate_up_proj`` h -> 2f
  interleaved, ``down_proj`` f -> h), top ``num_experts_per_tok``; the gate is clamped at ``swiglu_limit`` and
  is ``gate · sigmoid(alpha · gate) · (up + 1)`` (``GptOssExperts._apply_gate``). None of these is an
  ``nn.Linear``: LoRA and bitsandbytes leave them alone.
* The checkpoints ship the experts in MXFP4 (``quantization_config.quant_method = "mxfp4"``): 4-bit e2m1 values
  in blocks of 32 with one uint8 e8m0 scale per block (``*_blocks`` and ``*_scales`` tensors), everything else
  bf16. transformers' Mxfp4HfQuantizer keeps them packed only with the triton kernels on a GPU; without them
  (or with ``Mxfp4Config(dequantize=True)``, what fine-tuning recipes use) it dequantizes them to bf16 at load.
  cabe's parameter counts are the dequantized model's (transformers' meta build of the config).
"""

from __future__ import annotations

from dataclasses import replace

from cabe.architecture import ModelSpec
from cabe.families._common import Reader, attention_shape, decoder, qkvo, window
from cabe.layers import LayerGroup, Linear

MODEL_TYPES = ("gpt_oss",)


def _windows(r: Reader, layers: int) -> list[int | None]:
    """Each layer's window (None: full attention), from ``layer_types`` or GptOssConfig's default
    (``sliding_attention`` for even indices, ``full_attention`` for odd ones)."""
    win = window(r)
    types = r.c.get("layer_types")
    if not (isinstance(types, list) and len(types) == layers):
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    return [win if t == "sliding_attention" else None for t in types]


def read(r: Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = attention_shape(r)
    f = r.int("intermediate_size", default=2880)
    e = r.int("num_local_experts", "num_experts", default=128)
    bias = r.bool("attention_bias", True)
    linears = qkvo(h, nh, nkv, d, bias, bias) + (
        Linear("sinks", 1, nh, False, is_module=False, slot="sinks"),
        Linear("router", h, e, True, is_module=False, role="router", slot="router"),
        Linear("experts.gate_up_proj", h, 2 * f, True, e, is_module=False, role="expert", slot="experts"),
        Linear("experts.down_proj", f, h, True, e, is_module=False, role="expert", slot="experts"),
    )
    one = LayerGroup(1, linears, "moe")
    groups: list[LayerGroup] = []
    for win in _windows(r, r.int("num_hidden_layers")):
        g = replace(one, attention="sliding", window=win) if win else one
        if groups and replace(groups[-1], count=1) == g:
            groups[-1] = replace(g, count=groups[-1].count + 1)
        else:
            groups.append(g)
    return decoder(
        r,
        name,
        "gpt_oss",
        (h, nh, nkv, d),
        f,
        tied=False,
        activation="swiglu_clamp",
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings", default=131072),
        layer_groups=tuple(groups),
        num_experts=e,
        experts_per_token=r.int("num_experts_per_tok", "experts_per_token", default=4),
        attention_dropout=r.dropout("attention_dropout"),
        # GptOssRMSNorm: (weight * fp32 normalised).to(input dtype); the norms are _keep_in_fp32_modules
        norm_weight_fp32=True,
        attention_sinks=True,
        expert_gate="swiglu_clamp",
        router="topk_softmax",
        # NOTE: transformers falls back to eager for an sdpa request (_supports_sdpa = False)
        sdpa_fallback="eager",
        # NOTE: PEFT has no default target_modules for gpt_oss (peft/utils/constants.py): all-linear
        peft_default_targets=("all-linear",),
    )
