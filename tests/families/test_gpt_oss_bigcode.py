"""gpt-oss (attention sinks, alternating sliding / full attention, clamped-SwiGLU MoE) and GPTBigCode
(multi-query attention, learned positions): counts, kinds, KV cache and one layer's saved bytes, by hand."""

from cabe.activations import layer_activations
from cabe.cli.models import kinds
from cabe.kv_cache import kv_cache_bytes
from cabe.models import preset
from cabe.precision import dtypes_for
from cabe.training import TrainingSetup


def test_gpt_oss_20b_parameters_term_by_term():
    spec = preset("gpt-oss-20b").spec
    h, nh, nkv, d, f, e, v, layers = 2880, 64, 8, 64, 2880, 32, 201088, 24
    attn = (h * nh * d + nh * d) + 2 * (h * nkv * d + nkv * d) + (nh * d * h + h)  # q, k, v, o with biases
    assert attn == 11_800_576 + 2 * 1_475_072 + 11_799_360
    sinks = nh  # one learned logit per head
    router = h * e + e  # 92,160 + 32, with a bias
    experts = e * (h * 2 * f + 2 * f) + e * (f * h + h)  # gate_up (h -> 2f) and down (f -> h), 3-D, with 2-D biases
    assert experts == 531_025_920 + 265_512_960
    layer = attn + sinks + router + experts + 2 * h  # two RMSNorms
    assert layer == 823_186_976
    total = layers * layer + v * h + v * h + h  # + embeddings, untied lm_head, final norm
    assert spec.parameter_count == total == 20_914_757_184  # the model card: 20.9B (21B)
    assert preset("gpt-oss-120b").spec.parameter_count == 116_829_156_672  # the model card: 116.8B (117B)


def test_starcoder_parameters_term_by_term():
    spec = preset("starcoder").spec
    h, d, f, v, p, layers = 6144, 128, 24576, 49152, 8192, 40
    c_attn = h * (h + 2 * d) + (h + 2 * d)  # multi-query: q is h wide, k and v one head each
    layer = c_attn + (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h  # + c_proj, c_fc, c_proj, two LayerNorms
    assert layer == 379_128_064
    # tied wte, learned positions wpe, final LayerNorm ln_f
    assert spec.parameter_count == layers * layer + v * h + p * h + 2 * h == 15_517_456_384  # the card: 15.5B


def test_kinds():
    oss, coder = preset("gpt-oss-20b").spec, preset("starcoderbase-1b").spec
    assert [g.attention for g in oss.layer_groups[:3]] == ["sliding", "full", "sliding"]  # layer_types
    assert (oss.sliding_layers, oss.sliding_window, len(oss.runs)) == (12, 128, 1)
    assert (oss.attention_sinks, oss.expert_gate, oss.router, oss.sdpa_fallback) == (
        True,
        "swiglu_clamp",
        "topk_softmax",
        "eager",  # _supports_sdpa = False: transformers runs eager for an sdpa request
    )
    assert kinds(oss) == {"attention": "gqa+sliding128+sinks", "mlp": "moe32x4(swiglu_clamp)"}
    assert (coder.num_kv_heads, coder.position, coder.norm) == (1, "learned", "layernorm")
    assert kinds(coder) == {"attention": "mqa", "mlp": "plain"}
    assert kinds(preset("qwen1.5-moe-a2.7b").spec)["mlp"] == "moe60x4+shared"


def test_gpt_oss_kv_cache_keeps_the_window_on_sliding_layers():
    spec = preset("gpt-oss-20b").spec
    per = 2 * 8 * 64 * 2  # K and V, 8 kv heads of 64, bf16: 2,048 B per token per layer (sinks cache nothing)
    # 12 full layers keep the 8,192 tokens, 12 sliding layers the last 128
    assert kv_cache_bytes(spec, 8192, 1, "bf16") == per * (12 * 8192 + 12 * 128) == 204_472_320
    # MQA: one head of 128 in each of StarCoder's 40 layers
    assert kv_cache_bytes(preset("starcoder").spec, 8192, 1, "bf16") == 2 * 128 * 2 * 40 * 8192


def test_gpt_oss_layer_saved_bytes_by_hand():
    """One gpt-oss-20b layer, eager attention (what an sdpa request runs), pure bf16, LoRA r8 on q_proj and
    v_proj (fp32 adapters), s = 1024: bytes per token, term by term."""
    spec = preset("gpt-oss-20b").spec
    setup = TrainingSetup(
        method="lora", precision="bf16", attention="sdpa", seq=1024, lora_rank=8, lora_targets=("q_proj", "v_proj")
    )
    la = layer_activations(spec, setup, dtypes_for(setup), base_trainable=False, adapters=True)
    h, q, nh, s, k, f, r = 2880, 4096, 64, 1024, 4, 2880, 8
    attention = (
        4 * h
        + 4  # input RMSNorm: fp32 input, rsqrt
        + 2 * 4 * h  # PEFT's fp32 casts of the input, saved by lora_A of q_proj and v_proj
        + 2 * 4 * r  # lora_A outputs (fp32)
        + 3 * 2 * q  # q, and k and v repeated to the 64 query heads (repeat_kv copies)
        + 8 * nh  # max(dim=-1)'s int64 indices
        + 2 * nh * (s + 1)  # softmax over the scores and the sink column, in bf16
    )
    moe = (
        4 * h
        + 4  # post-attention RMSNorm
        + 8 * k
        + 2 * k  # top-k indices, softmax over the k values
        + 3 * 8 * k  # dispatch indices (frozen biases save no index)
        + 2 * k  # gathered routing weights
        + k * 2 * 2 * f  # interleaved gate_up output
        + k * 4 * 2 * f  # clamped gate, sigmoid, gate·sigmoid, up + 1
        + k * 2 * h  # down_proj's output, saved by the routing-weight multiply
    )
    assert attention == 190_916 and moe == 172_948
    assert la.bytes_per_token == attention + moe == 363_864
    assert la.per_layer_bytes == 512  # the int32 offsets over 32 experts, one 512-byte block


def test_gpt_oss_20b_weights_as_shipped_in_mxfp4():
    from cabe.weights import weights_bytes

    spec = preset("gpt-oss-20b").spec
    experts = 24 * (32 * 2880 * 5760 + 32 * 2880 * 2880)  # gate_up and down of 32 experts in 24 layers
    assert experts == 19_110_297_600
    w = weights_bytes(spec, "mxfp4")
    # 4 bits per weight + one uint8 scale per block of 32; the other 1,804,459,584 parameters in bf16
    assert w["quantized_params"] == experts
    assert w["total_bytes"] == experts // 2 + experts // 32 + 2 * (20_914_757_184 - experts) == 13_761_264_768
    assert weights_bytes(preset("starcoder").spec, "mxfp4")["quantized_params"] == 0  # no experts, nothing in MXFP4
