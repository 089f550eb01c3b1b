"""Tiny configs of several architecture families for trace tests (2 layers, hidden 64-128)."""

TINY = {
    "llama": dict(model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, vocab_size=512, max_position_embeddings=256),
    "qwen2": dict(model_type="qwen2", hidden_size=128, intermediate_size=320, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=256),
    "mistral": dict(model_type="mistral", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2, vocab_size=512, max_position_embeddings=256,
                    sliding_window=4096),
    "gemma2": dict(model_type="gemma2", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=512,
                   max_position_embeddings=256, sliding_window=64),
    "phi3": dict(model_type="phi3", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, vocab_size=512, max_position_embeddings=256,
                 pad_token_id=0),
    "gpt2": dict(model_type="gpt2", n_embd=128, n_layer=2, n_head=4, vocab_size=512, n_positions=256),
    "gpt_neox": dict(model_type="gpt_neox", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, vocab_size=512, max_position_embeddings=256),
    "mixtral": dict(model_type="mixtral", hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=256,
                    num_local_experts=4, num_experts_per_tok=2),
}
