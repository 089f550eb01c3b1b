"""SGLang's token pool (cabe.engines.sglang), from python/sglang/srt/server_args.py and model_executor/model_runner.py."""

from __future__ import annotations

import pytest

from cabe import gpus
from cabe.engines import sglang
from cabe.errors import InvalidValueError
from cabe.models import preset

H100 = gpus.gpu("h100-sxm")


def test_mem_fraction_static_heuristic_on_an_h100():
    d = sglang.defaults(H100)
    gpu_mem = H100.memory_bytes / 2**20  # 81,082 MiB
    # 512 + 8192 × 1.5 + 256 × 2 + 1 × 1 / 8 × 1024 = 13,440 MiB (above the 10 GiB floor)
    assert d["reserved_mib"] == 13_440
    assert d["mem_fraction_static"] == round((gpu_mem - 13_440) / gpu_mem, 3) == 0.834
    # a 24 GB card: chunked prefill 2048, no floor: 512 + 3072 + 24 × 2 + 128 = 3,760 MiB
    assert sglang.defaults(gpus.gpu("rtx-4090"))["reserved_mib"] == 3_760


def test_token_pool_is_free_times_fraction_minus_weights():
    spec = preset("llama-3.1-8b").spec
    s = sglang.serving(spec, H100, context=8192, mem_fraction_static=0.9)
    free = H100.memory_bytes - H100.cuda_context_bytes
    rest = free - s["weights_bytes"] - free * (1 - 0.9)
    # cell_size: 8 KV heads × 128 × 32 layers × 2 × 2 B = 131,072 B per token
    assert s["cell_bytes"] == 131_072
    assert s["max_total_num_tokens"] == int(rest // 131_072)
    assert s["max_concurrent_sequences"] == s["max_total_num_tokens"] // 8192


def test_qwen3_235b_fp8_tp4_cell():
    # 94 layers × 1 KV head per rank (4 over 4 ranks) × 128 × 2 × 2 B = 48,128 B per token
    s = sglang.serving(preset("qwen3-235b-a22b").spec, H100, weights="fp8", tp=4, mem_fraction_static=0.93)
    assert s["cell_bytes"] == 48_128
    assert s["k_size_gib"] == round(s["max_total_num_tokens"] * 24_064 / 2**30, 2)


def test_sliding_window_split():
    spec = preset("gemma-3-27b").spec  # 52 sliding + 10 full layers
    s = sglang.serving(spec, H100, context=8192)
    total = s["max_total_num_tokens"] * 62
    # full × (0.8 × 52 + 10) = total tokens over all layers; SWA pool = 0.8 × full
    assert s["full_max_total_num_tokens"] == int(total / (0.8 * 52 + 10))
    assert s["swa_max_total_num_tokens"] == int(s["full_max_total_num_tokens"] * 0.8)


def test_bad_fraction():
    with pytest.raises(InvalidValueError):
        sglang.serving(preset("llama-3.1-8b").spec, H100, mem_fraction_static=0)
