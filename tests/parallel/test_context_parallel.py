"""Context parallelism: the cp / cp_impl fields, the layout dp × cp × tp × pp, the refusals taken from torch's,
DeepSpeed's and accelerate's source, the per-GPU model (cabe.parallel.context), the config readers, CLI and API."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cabe import api
from cabe.configs import accelerate, axolotl, training_args
from cabe.errors import InvalidValueError
from cabe.models import preset
from cabe.parallel import context
from cabe.training import TrainingSetup

MODEL = "llama-3.2-1b"  # 32 query heads, 8 key / value heads, head_dim 64
BASE = dict(model=MODEL, seq=4096, batch=1, dtype="bf16", gpus=8, shard="fsdp")


def _est(**kw):
    return api.build({**BASE, **kw})


def test_layout_and_shard_group():
    out = _est(cp=2).to_json()["distributed"]
    # 8 GPUs = dp 4 × cp 2; FSDP shards over dp_shard × cp (accelerate's dp_shard_cp): all 8
    assert (out["dp"], out["cp"], out["cp_impl"], out["shard_group"]) == (4, 2, "allgather", 8)
    assert _est(cp=1).to_json()["distributed"]["shard_group"] == 8
    hybrid = _est(cp=2, shard="fsdp-hybrid", gpus=16, gpus_per_node=8).to_json()["distributed"]
    assert (hybrid["dp"], hybrid["shard_group"]) == (8, 8)


def test_activations_scale_by_cp():
    # the same states (FSDP over 8 GPUs either way); each GPU runs 4096 / cp tokens: the activations of cp = 2 are
    # those of seq 2048 on one of 8 GPUs, but for the ring's buffers at attention's backward
    one = _est(cp=1, seq=2048).components
    two = _est(cp=2).components
    assert two["weights"] == one["weights"] and two["optimizer"] == one["optimizer"]
    # (to the allocator's 512-byte blocks: the single-GPU figures are rounded per tensor at 4096 tokens, then halved;
    # measured 8,192 B = 16 layers × 512 B)
    assert 0 <= one["activations"] - two["activations"] <= 16 * 512
    assert _est(cp=2).total_bytes < _est(cp=1).total_bytes


def test_ring_buffers_arithmetic():
    spec = preset(MODEL).spec
    s = TrainingSetup(seq=4096, batch=1, gpus=8, shard="fsdp", cp=2, dtype="bf16")
    tokens = 4096 // 2
    q, kv = tokens * 32 * 64, tokens * 8 * 64
    # fp32 accumulators of dq, dk, dv; the fp32 dk / dv sent and received; the all-gathered kv of both GPUs (bf16)
    assert context.attention_buffers(spec, s, 1, 2) == 4 * (q + 2 * kv) + 2 * 4 * 2 * kv + 2 * 2 * kv * 2
    a2a = s.with_(cp_impl="alltoall")
    assert context.attention_buffers(spec, a2a, 1, 2) == 4 * (q + 2 * kv) + 2 * 4 * 2 * kv + 2 * 2 * kv * 2
    four = s.with_(cp=4)
    t4 = 4096 // 4
    q4, kv4 = t4 * 32 * 64, t4 * 8 * 64
    assert context.attention_buffers(spec, four, 1, 2) == 4 * (q4 + 2 * kv4) + 2 * 4 * 2 * kv4 + 4 * 2 * kv4 * 2
    assert context.attention_buffers(spec, four.with_(cp_impl="alltoall"), 1, 2) < context.attention_buffers(
        spec, four, 1, 2
    )
    # Ulysses at cp 16 > 8 kv heads: keys and values repeated twice (ulysses_sp.py kv_replication_factor)
    u = TrainingSetup(seq=4096, batch=1, gpus=16, shard="zero3", cp=16, cp_impl="ulysses", dtype="bf16")
    t16 = 4096 // 16
    assert context.attention_buffers(spec, u, 1, 2) == 2 * (2 * t16 * 32 * 64 + 2 * t16 * 8 * 64 * 2) * 2


@pytest.mark.parametrize(
    "kw, code",
    [
        (dict(cp=3), "gpus_not_divisible_cp"),
        (dict(cp=2, seq=4095), "cp_seq_not_divisible"),
        (dict(cp=2, shard="ddp"), "cp_needs_fsdp"),
        (dict(cp=2, shard="zero3"), "cp_needs_fsdp"),
        (dict(cp=2, cp_impl="ulysses"), "cp_ulysses_needs_deepspeed"),
        (dict(cp=2, attention="eager"), "cp_eager_attention"),
        # 32 heads over 64 GPUs
        (dict(cp=64, gpus=64, cp_impl="ulysses", shard="zero3"), "cp_heads_not_divisible"),
        (dict(cp_impl="alltoall"), "cp_only"),
        # HSDP: a node's 4 GPUs cannot hold a cp group of 8 (FSDP shards over dp_shard × cp within the node)
        (dict(cp=8, gpus=16, shard="fsdp-hybrid", gpus_per_node=4), "cp_node"),
    ],
)
def test_refusals(kw, code):
    with pytest.raises(InvalidValueError) as e:
        _est(**kw)
    assert e.value.code == code


def test_ulysses_and_eager_allowed():
    out = _est(cp=2, cp_impl="ulysses", shard="zero3", attention="eager").to_json()["distributed"]
    assert out["cp_impl"] == "ulysses" and out["shard_group"] == 8


def test_accelerate_reader():
    req, _, _ = accelerate.to_request(
        {
            "distributed_type": "FSDP",
            "num_processes": 8,
            "fsdp_config": {"fsdp_version": 2},
            "parallelism_config": {
                "parallelism_config_dp_shard_size": 4,
                "parallelism_config_cp_size": 2,
                "parallelism_config_cp_comm_strategy": "alltoall",
            },
        }
    )
    assert (req["cp"], req["cp_impl"], req["shard"]) == (2, "alltoall", "fsdp")
    req, _, _ = accelerate.to_request(
        {
            "distributed_type": "DEEPSPEED",
            "num_processes": 8,
            "deepspeed_config": {"zero_stage": 3},
            "parallelism_config": {"parallelism_config_sp_size": 4, "parallelism_config_sp_backend": "deepspeed"},
        }
    )
    assert (req["cp"], req["cp_impl"], req["shard"]) == (4, "ulysses", "zero3")


def test_axolotl_and_training_args_readers():
    for key in ("context_parallel_size", "sequence_parallel_degree"):
        req, used, _ = axolotl.to_request({"base_model": "x", "sequence_len": 4096, key: 4})
        assert req["cp"] == 4 and key in used
    req, used, _ = training_args.to_request({"output_dir": "o", "parallelism_config": {"cp_size": 2}})
    assert req["cp"] == 2 and "parallelism_config.cp_size" in used


def test_cli_help_and_error():
    run = [sys.executable, "-m", "cabe", "estimate"]
    out = subprocess.run([*run, "--help"], capture_output=True, text=True, check=True).stdout
    assert "--cp " in out and "--cp-impl" in out
    bad = subprocess.run([*run, "--model", MODEL, "--gpus", "8", "--shard", "ddp", "--cp", "2"], capture_output=True)
    assert bad.returncode == 2 and b"FSDP2" in bad.stderr


def test_api():
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from cabe.web.app import create_app

    with TestClient(create_app()) as client:
        ok = client.post("/api/estimate", json={**BASE, "cp": 2}).json()
        assert ok["distributed"]["cp"] == 2
        bad = client.post("/api/estimate", json={**BASE, "cp": 2, "shard": "ddp"})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "cp_needs_fsdp"
