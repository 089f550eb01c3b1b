"""``cabe infer`` on several GPUs, with speed bounds, the context limit and ``--explain`` (cabe.infer_parallel)."""

from __future__ import annotations

import json

import pytest

from cabe.cli import main
from cabe.inference import infer_json


def test_json_per_gpu_speed_and_limit():
    out = infer_json({"model": "llama-3.1-70b", "weights": "bf16", "context": 8192, "tp": 8, "gpu": "h100-sxm"})
    par = out["parallel"]
    assert (par["tp"], par["pp"], par["dp"], par["gpus"], par["kv_heads_per_rank"]) == (8, 1, 1, 8, 1)
    st = par["stages"][0]
    assert st["components"]["weights"] == 17_640_734_720  # tests/test_serving_parallel.py
    # the cache at the single-GPU estimate's peak, the prefill of the 7,936-token prompt (8,192 less the default
    # 256 new tokens, cabe.generation), per GPU: 7,936 × 80 layers × 1 KV head × 128 × 2 (K, V) × 2 B = 325,058,560
    assert out["prompt_tokens"] == 7936 and st["components"]["kv_cache"] == 7936 * 80 * 128 * 2 * 2 == 325_058_560
    # the replica's pool is vLLM's on this GPU (cabe.engines.vllm with the GPU's share): 0.9 × 85,020,639,232 B
    # less its weights 17,640,734,720, the profile run 3,171,680,256, the custom all-reduce's registered buffer
    # 8,388,608 (torch) and non-torch 851,970,560 (CUDA context 603,979,776 + NCCL 231,211,008 + custom all-reduce
    # IPC 16,779,776) = 54,845,801,164 B; pages of 16 tokens × 1 KV head × 128 × 2 (K, V) × 2 B = 8,192 B, one
    # group of 80 layers: 83,688 blocks; 8,192 tokens take 512 blocks: 163 sequences
    s = out["serving"]
    assert s["weights_bytes"] == 17_640_734_720 and s["non_torch_bytes"] == 603_979_776 + 247_990_784
    pool = int(0.9 * 85_020_639_232) - 17_640_734_720 - s["activation_profile_bytes"] - 8_388_608 - 851_970_560
    assert abs(s["kv_pool_bytes"] - pool) <= 1 and s["total_blocks"] == s["kv_pool_bytes"] // 8_192 // 80 == 83_688
    assert par["fit"]["fits"] and par["fit"]["sequences_per_replica"] == 83_688 // 512 == 163
    assert out["speed"]["decode"]["bound"] == "upper" and out["speed"]["prefill"]["bound"] == "lower"
    assert out["context_limit"]["limit"] == 131072 and not out["context_limit"]["beyond"]
    keys = [s["key"] for s in out["explain"]]
    assert keys[:2] == ["infer.weights", "infer.kv"] and "infer.tp.nccl" in keys and keys[-1] == "infer.speed.prefill"


def test_one_gpu_has_no_parallel_block():
    out = infer_json({"model": "llama-3.1-8b", "context": 4096})
    assert "parallel" not in out and "speed" not in out and out["explain"] == out["steps"]


def test_replicas_multiply_the_pool_not_the_gpu():
    out = infer_json({"model": "llama-3.1-70b", "weights": "bf16", "tp": 4, "gpus": 16, "gpu": "h100-sxm"})
    f = out["parallel"]["fit"]
    assert out["parallel"]["dp"] == 4 and f["sequences_total"] == 4 * f["sequences_per_replica"]


@pytest.mark.parametrize(
    "lang,words",
    [
        ("en", ("Per GPU", "Decode, upper bound", "Prefill, lower bound")),
        ("es", ("Por GPU", "cota superior", "cota inferior")),
    ],
)
def test_text_and_explain_in_both_languages(capsys, lang, words):
    argv = ["infer", "--model", "llama-3.1-70b", "--weights", "bf16", "--tp", "4", "--pp", "2"]
    assert main(argv + ["--gpu", "h100-sxm", "--explain", "--lang", lang]) == 0
    text = capsys.readouterr().out
    for w in words:
        assert w in text
    # every step has its sentence in the catalog (no key printed as itself) and its worked numbers
    assert "step.infer" not in text
    assert "get_pp_indices: 40,40" in text and "24 channels × (4" in text


def test_context_beyond_the_scaled_limit_is_flagged(capsys):
    assert main(["infer", "--model", "llama-3.1-70b", "--context", "200000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["context_limit"]["beyond"] and "context_beyond_limit" in out["notes"]
    assert main(["infer", "--model", "llama-3.1-70b", "--context", "200000", "--lang", "en"]) == 0
    assert "(llama3 rope scaling: 8 × 8,192 original positions)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--tp", "3"], "tp: tensor-parallel degree 3 must divide the 64 attention heads"),
        (["--pp", "81"], "pp must be between 1 and 80"),
        (["--tp", "4", "--gpus", "6"], "6 GPUs cannot be split"),
        (["--ep", "2"], "needs a mixture-of-experts"),
        (["--pp", "2", "--pp-partition", "10,10"], "must give 2 stages"),
    ],
)
def test_impossible_splits_exit_2(capsys, argv, needle):
    assert main(["infer", "--model", "llama-3.1-70b", *argv, "--lang", "en"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_top_level_verdict_is_the_fullest_gpus_on_a_split_replica(capsys):
    """llama-3.1-70b in bf16 is 141 GB of weights: on one H100 it does not fit, split tp 8 it does; the top-level
    ``fit`` is the per-GPU one (``parallel.fit``), and the CLI's ``--json`` says the same as the API's."""
    body = {"model": "llama-3.1-70b", "weights": "bf16", "context": 8192, "tp": 8, "gpu": "h100-sxm"}
    out = infer_json(body)
    pf, f = out["parallel"]["fit"], out["fit"]
    assert f["per_gpu"] and f["fits"] and pf["fits"]
    assert f["needed_bytes"] == pf["needed_bytes"] < out["total_bytes"]
    assert f["margin_bytes"] == pf["memory_bytes"] - pf["needed_bytes"] > 0
    one = infer_json({k: v for k, v in body.items() if k != "tp"})
    assert not one["fit"]["fits"] and "per_gpu" not in one["fit"]  # the whole model on one card
    argv = ["infer", "--model", "llama-3.1-70b", "--weights", "bf16", "--context", "8192", "--tp", "8"]
    assert main(argv + ["--gpu", "h100-sxm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fit"] == f
