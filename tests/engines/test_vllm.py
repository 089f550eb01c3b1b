"""vLLM's startup accounting (cabe.engines.vllm): KV cache specs and groups, blocks, token count, concurrency.

Golden numbers from vllm/v1/core/kv_cache_utils.py (``_get_kv_cache_groups_uniform_page_size``,
``get_kv_cache_config_from_groups``, ``get_max_concurrency_for_kv_cache_config``) and vllm/v1/kv_cache_interface.py
(``FullAttentionSpec`` / ``SlidingWindowSpec.max_memory_usage_bytes``), worked by hand below.
"""

from __future__ import annotations

import pytest

from cabe import gpus
from cabe.engines import vllm
from cabe.errors import InvalidValueError
from cabe.models import preset

H100 = gpus.gpu("h100-sxm")
L3 = preset("llama-3.1-8b").spec
G3 = preset("gemma-3-27b").spec


def test_llama_one_group_of_every_layer():
    s = vllm.serving(L3, H100, context=8192)
    # FullAttentionSpec page: 16 tokens × 8 KV heads × 128 × 2 (K and V) × 2 B = 65,536 B per layer
    assert s["kv_cache_groups"] == [{"kind": "full", "layers": 32, "window": 0, "page_bytes": 65_536}]
    assert s["group_size"] == 32 and s["num_groups"] == 1
    # num_blocks = available // page_size // group_size
    assert s["total_blocks"] == s["kv_pool_bytes"] // 65_536 // 32
    # "GPU KV cache size": num_blocks // 1 group × 16 tokens; a request of 8,192 tokens needs 512 blocks
    assert s["kv_cache_tokens"] == s["total_blocks"] * 16
    assert s["blocks_per_sequence"] == 512
    assert s["max_concurrency"] == pytest.approx(s["total_blocks"] / 512)
    # the pool: 0.9 × the card − weights − the profile's torch peak − non-torch memory
    assert s["kv_pool_bytes"] == int(
        0.9 * H100.memory_bytes - s["weights_bytes"] - s["activation_profile_bytes"] - H100.cuda_context_bytes
    )


def test_llama_profile_run_is_the_mlp_at_8192_tokens():
    p = vllm.profile_bytes(L3, 8192, 256)
    # LlamaMLP: residual + hidden (2 × 4096) and gate_up_proj's [t, 2 × 14336] beside SiluAndMul's [t, 14336]
    assert p["forward"] == 8192 * 2 * (2 * 4096 + 3 * 14336) == 838_860_800
    # the sampler: hidden states of the forward and of the 256 sampled rows, then 23 B per (row, vocab entry)
    assert p["sampler"] == 8192 * 2 * 4096 + 256 * 2 * 4096 + 256 * 128_256 * 23
    assert p["peak"] == max(p["forward"], p["sampler"])


def test_gemma3_groups_sliding_and_full_layers_into_one_pool():
    # 62 layers: 52 sliding (window 1024) and 10 full. min 10, max 52 ≥ 1.25 × 10: group_size 10;
    # the sliding layers make cdiv(52, 10) = 6 groups (the last padded), the full ones 1: 7 groups
    kinds = vllm.kv_kinds(G3, "fp16", 16)
    assert {(k.kind, k.layers, k.window) for k in kinds} == {("full", 10, 0), ("sliding", 52, 1024)}
    assert vllm.group_size(kinds) == 10 and len(vllm.groups(kinds)) == 7
    # per request of 8,192 tokens: full cdiv(8192, 16) = 512 blocks; each sliding group
    # cdiv(min(1024 − 1 + 8192, 8192), 16) + 1 = 513 blocks
    assert vllm.blocks_per_request(kinds, 8192, 8192) == 512 + 6 * 513
    # with a smaller step the sliding groups hold only the window and the step: cdiv(1023 + 2048, 16) + 1 = 193
    assert vllm.blocks_per_request(kinds, 32768, 2048) == 2048 + 6 * 193
    s = vllm.serving(G3, H100, context=8192)
    # the token count vLLM logs: num_blocks // 7 groups × 16
    assert s["kv_cache_tokens"] == s["total_blocks"] // 7 * 16
    assert s["block_bytes"] == 10 * 16 * 2 * 16 * 128 * 2  # 10 layers × a 16-token page of 16 KV heads × 128


def test_balanced_kinds_group_by_the_larger_count():
    # gpt-oss-20b: 12 sliding (128) + 12 full: max < 1.25 × min, so group_size 12 and two groups
    kinds = vllm.kv_kinds(preset("gpt-oss-20b").spec, "fp16", 16)
    assert vllm.group_size(kinds) == 12 and len(vllm.groups(kinds)) == 2


def test_hybrid_mamba_raises_the_attention_block_size():
    spec = preset("granite-4.0-h-small").spec  # 36 Mamba-2 + 4 attention layers
    kinds = {k.kind: k for k in vllm.kv_kinds(spec, "fp16", 16)}
    m = spec.mamba2
    state = (m.conv_state_elements + m.ssm_state_elements) * 2  # conv and SSM state in the model dtype
    per_token = 2 * 8 * 128 * 2
    block = 16 * -(-state // (16 * per_token))  # the smallest multiple of 16 tokens whose page holds a state
    assert kinds["full"].block == block and kinds["full"].page == block * per_token
    assert kinds["mamba"].page == kinds["full"].page  # the Mamba page padded to the attention page
    # group_size = 4 (the attention layers); the 36 Mamba layers make 9 groups, one block each per request
    assert vllm.blocks_per_request(list(kinds.values()), 4096, 8192) == -(-4096 // block) + 9


def test_fp8_cache_halves_the_page_and_doubles_the_blocks():
    a = vllm.serving(L3, H100, context=8192)
    b = vllm.serving(L3, H100, context=8192, kv_dtype="fp8")
    assert b["kv_cache_groups"][0]["page_bytes"] * 2 == a["kv_cache_groups"][0]["page_bytes"]
    assert b["total_blocks"] in (2 * a["total_blocks"], 2 * a["total_blocks"] + 1)


def test_tensor_parallel_rank_shares():
    a = vllm.serving(L3, H100, context=8192)
    b = vllm.serving(L3, H100, context=8192, tp=2)
    assert b["weights_bytes"] == a["weights_bytes"] // 2
    assert b["kv_cache_groups"][0]["page_bytes"] * 2 == a["kv_cache_groups"][0]["page_bytes"]  # 4 KV heads per rank
    # 8 KV heads over 16 ranks: replicated, one per rank
    assert vllm.kv_kinds(L3, "fp16", 16, tp=16)[0].page == 16 * 1 * 128 * 2 * 2


def test_no_room_says_so():
    s = vllm.serving(preset("llama-3.1-70b").spec, gpus.gpu("rtx-4090"), context=4096)
    assert not s["fits"] and s["kv_pool_bytes"] == 0 and s["max_concurrent_sequences"] == 0


@pytest.mark.parametrize("kw", [{"max_num_seqs": 0}, {"block_size": True}, {"gpu_memory_utilization": 1.5}])
def test_bad_knobs(kw):
    with pytest.raises(InvalidValueError):
        vllm.serving(L3, H100, **kw)


def test_vllm_serve_batch_defaults_by_card():
    # EngineArgs.get_batch_defaults, OPENAI_API_SERVER: ≥ 70 GiB and not an A100 -> 8192 tokens, 1024 sequences
    assert vllm.batch_defaults(H100) == (8192, 1024)
    assert vllm.batch_defaults(gpus.gpu("a100-80gb")) == (2048, 256)
    assert vllm.batch_defaults(gpus.gpu("rtx-4090")) == (2048, 256)
    s = vllm.serving(L3, gpus.gpu("a100-80gb"))
    assert (s["max_num_batched_tokens"], s["max_num_seqs"]) == (2048, 256)


def test_sampler_logits_are_whole_on_every_rank():
    # LogitsProcessor gathers the vocabulary before sampling: the sampler term does not shrink with tp
    one, two = vllm.profile_bytes(L3, 8192, 1024), vllm.profile_bytes(L3, 8192, 1024, tp=2)
    assert one["sampler"] == two["sampler"] and two["forward"] < one["forward"]


def test_multimodal_profile_runs_the_encoder_on_its_budget():
    # Qwen2.5-VL: max_pixels 28 × 28 × 1280 -> 5,120 patches of 14 px, 1,280 tokens per image (merge 2 × 2);
    # encoder_compute_budget = max(8192, 1280) = 8192 -> 8192 // 1280 = 6 dummy images
    vl = preset("qwen2.5-vl-7b-instruct").spec
    e = vllm.encoder_profile(vl, 8192)
    assert e["encoder_items"] == 6 and e["encoder_outputs"] == 6 * 1280 * vl.hidden_size * 2
    # Gemma 3's SigLIP: every image 896 px square, 256 soft tokens: 8192 // 256 = 32 images
    assert vllm.encoder_profile(preset("gemma-3-27b-it").spec, 8192)["encoder_items"] == 32
    p = vllm.profile_bytes(vl, 8192, 256)
    assert p["peak"] >= p["encoder"] and p["forward"] > vllm.profile_bytes(vl, 8192, 256)["encoder_outputs"]
    assert vllm.encoder_profile(L3, 8192) == {}
