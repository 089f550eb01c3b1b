"""llama.cpp (cabe.engines.llamacpp): GGUF tensor types, file sizes, KV cells, compute buffer."""

from __future__ import annotations

import pytest

from cabe import gpus
from cabe.engines import llamacpp
from cabe.errors import InvalidValueError
from cabe.models import preset

L2 = preset("llama-2-7b").spec
L3 = preset("llama-3.1-8b").spec


def test_block_sizes():
    # ggml-common.h: block_q4_K = 2 × fp16 + 12 scale bytes + 128 bytes of nibbles per 256 weights = 4.5 bits
    assert llamacpp.type_bytes("q4_k", 256) == 144
    assert llamacpp.type_bytes("q6_k", 256) == 210  # 6.5625 bits
    assert llamacpp.type_bytes("q8_0", 32) == 34  # 8.5 bits


def test_use_more_bits_picks_16_of_32_layers():
    # i < 4, i ≥ 28, or (i − 4) % 3 == 2 (i = 6, 9, ..., 27): 4 + 4 + 8
    assert sum(llamacpp._use_more_bits(i, 32) for i in range(32)) == 16


@pytest.mark.parametrize(
    "spec,ftype,gb",
    [
        (L2, "q4_k_m", 4.08),  # TheBloke/Llama-2-7B-GGUF llama-2-7b.Q4_K_M.gguf: 4.08 GB
        (L2, "q8_0", 7.16),  # llama-2-7b.Q8_0.gguf: 7.16 GB
        (L3, "q4_k_m", 4.92),  # bartowski/Meta-Llama-3-8B-Instruct-GGUF Q4_K_M: 4.92 GB
    ],
)
def test_file_sizes(spec, ftype, gb):
    assert sum(t["bytes"] for t in llamacpp.tensors(spec, ftype)) / 1e9 == pytest.approx(gb, abs=0.01)


def test_compute_buffer_is_the_logits_at_n_ubatch():
    # 512 tokens × 4 B × (128,256 logits + 4,096 normed hidden) = 258.5 MiB
    assert llamacpp.compute_bytes(L3, 8192, 512) / 2**20 == 258.5
    # without flash attention the f32 KQ scores of 32 heads over 8,192 cells exceed it
    assert llamacpp.compute_bytes(L3, 8192, 512, flash_attn=False) == 512 * 4 * (2 * 4096 + 2 * 4096 + 32 * 8192)


def test_gemma3_swa_cells():
    # gemma-3-4b at n_ctx 131,072: 5 full layers × 131,072 cells and 29 sliding layers × pad(1024 + 512, 256) = 1,536
    # cells, 4 KV heads × 256 × 2 B for K and V: 2,560 MiB and 174 MiB as llama-server prints (ollama PR #17037)
    spec = preset("gemma-3-4b").spec
    kv = llamacpp.kv_bytes(spec, 131_072, "f16", "f16", n_ubatch=512)
    per_cell = 2 * 4 * 256 * 2
    assert kv["kv"] == 5 * 131_072 * per_cell + 29 * 1536 * per_cell
    assert 5 * 131_072 * per_cell / 2**20 == 2560 and 29 * 1536 * per_cell / 2**20 == 174


def test_quantized_cache_and_offload():
    card = gpus.gpu("rtx-4090")
    f16 = llamacpp.serving(L3, card, context=8192)
    q8 = llamacpp.serving(L3, card, context=8192, cache_type_k="q8_0", cache_type_v="q8_0")
    assert q8["kv_buffer_bytes"] == f16["kv_buffer_bytes"] * 34 // 64  # 34 bytes per 32 values instead of 64
    half = llamacpp.serving(L3, card, context=8192, n_gpu_layers=16)
    assert half["kv_buffer_bytes"] * 2 == f16["kv_buffer_bytes"]
    assert half["model_buffer_bytes"] < f16["model_buffer_bytes"] / 2  # no output layer either
    assert f16["max_context"] >= 8192 and f16["max_concurrent_sequences"] >= 1


def test_bad_types():
    with pytest.raises(InvalidValueError):
        llamacpp.serving(L3, gpus.gpu("rtx-4090"), cache_type_k="q3_k")
    with pytest.raises(InvalidValueError):
        llamacpp.serving(L3, gpus.gpu("rtx-4090"), weights="nf4")
