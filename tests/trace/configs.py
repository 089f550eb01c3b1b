"""Tiny configs of several architecture families for trace tests (2 layers, hidden 64-128)."""

import json
from pathlib import Path

TINY = {
    "llama": dict(
        model_type="llama",
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=512,
        max_position_embeddings=256,
    ),
    "qwen2": dict(
        model_type="qwen2",
        hidden_size=128,
        intermediate_size=320,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=256,
    ),
    "mistral": dict(
        model_type="mistral",
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=256,
        sliding_window=4096,
    ),
    "gemma2": dict(
        model_type="gemma2",
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=512,
        max_position_embeddings=256,
        sliding_window=64,
    ),
    "phi3": dict(
        model_type="phi3",
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=512,
        max_position_embeddings=256,
        pad_token_id=0,
    ),
    "gpt2": dict(model_type="gpt2", n_embd=128, n_layer=2, n_head=4, vocab_size=512, n_positions=256),
    "gpt_neox": dict(
        model_type="gpt_neox",
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=512,
        max_position_embeddings=256,
    ),
    "mixtral": dict(
        model_type="mixtral",
        hidden_size=128,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=256,
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
    # layer 0 dense, layer 1 MoE (decoder_sparse_step=2): layers that differ
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=512,
        max_position_embeddings=256,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=2,
    ),
    # layer 0 dense, layer 1 MoE with a shared expert
    "qwen2_moe": dict(
        model_type="qwen2_moe",
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=256,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=2,
    ),
}


#: a tiny DeepSeek-V3 (multi-head latent attention, 1 dense layer then 3 MoE layers with a shared expert); kept out
#: of TINY, whose LoRA tests use PEFT's default targets (all-linear, which PEFT 0.21 turns into LoRA on the fused
#: experts for this model type: see tests/trace/test_moe_lora_wrapped.py). Read from tests/configs/files, as
#: tests/families/test_deepseek_v3.py reads it.
DEEPSEEK_V3 = json.loads(
    (Path(__file__).resolve().parents[1] / "configs/files/deepseek_v3_tiny_config.json").read_text()
)


#: a tiny Llama 4 decoder: layers 0 and 2 dense (SwiGLU of intermediate_size_mlp), 1 and 3 MoE (4 experts, top-1,
#: a shared expert; every token through every expert), layers 0-2 rotary with the q / k L2 norm and chunked
#: attention (chunk 128), layer 3 NoPE with temperature-tuned queries and global attention. Kept out of TINY: PEFT
#: 0.21 has no default LoRA targets for llama4_text, and all-linear wraps the router, whose tuple output LoRA
#: cannot run (cabe refuses it: lora_target_breaks).
LLAMA4 = dict(
    model_type="llama4_text",
    hidden_size=128,
    intermediate_size=192,
    intermediate_size_mlp=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=512,
    max_position_embeddings=4096,
    num_local_experts=4,
    num_experts_per_tok=1,
    interleave_moe_layer_step=2,
    attention_chunk_size=128,
)

#: a medium one, Maverick-like: 8 layers alternating dense and MoE (8 experts, top-2), no q / k norm, chunk 256
LLAMA4_MEDIUM = dict(
    LLAMA4,
    hidden_size=512,
    intermediate_size=768,
    intermediate_size_mlp=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    num_local_experts=8,
    num_experts_per_tok=2,
    attention_chunk_size=256,
    use_qk_norm=False,
    vocab_size=4096,
)


#: a tiny Granite-4.0-H: Mamba-2 layers 0, 1 and 3 (8 heads of 64, state 32, chunk 64), attention layer 2 without
#: position embedding, every layer an MoE of 4 experts (top-2) beside a shared MLP. Read from tests/configs/files, as
#: tests/families/test_granitemoehybrid.py reads it.
GRANITE_HYBRID = json.loads(
    (Path(__file__).resolve().parents[1] / "configs/files/granitemoehybrid_tiny_config.json").read_text()
)

DEEPSEEK_V32 = json.loads(
    (Path(__file__).resolve().parents[1] / "configs/files/deepseek_v32_tiny_config.json").read_text()
)

#: a tiny Qwen2.5-VL (issue 13): a 2-layer Qwen2 decoder and a 5-block ViT (hidden 256, blocks 1 and 3 over the
#: whole image, the others over 112-pixel windows), written once in tests/configs/files
QWEN2_5_VL = json.loads(
    (Path(__file__).parents[1] / "configs" / "files" / "qwen2_5_vl_tiny_config.json").read_text(encoding="utf-8")
)
DEEPSEEK_V4 = json.loads(
    (Path(__file__).resolve().parents[1] / "configs/files/deepseek_v4_tiny_config.json").read_text()
)
