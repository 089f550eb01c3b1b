"""Rank 0 of an FSDP2 job on PyTorch's fake process group, against the per-GPU estimate."""

from __future__ import annotations

import pytest

from cabe.units import CUDA_WORKSPACES

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe import api
from cabe.errors import ConfigError
from cabe.trace.distributed import trace_fsdp2
from cabe.training import TrainingSetup
from configs import TINY

pytestmark = pytest.mark.trace

#: 4 layers of hidden 256, ffn 688, vocab 2048: 8.4e6 parameters, one unit (layer) 790,528 of them
CONFIG = dict(TINY["llama"], hidden_size=256, intermediate_size=688, num_hidden_layers=4, vocab_size=2048)
#: the per-layer + root cut (accelerate <= 1.13, FSDP1): the golden figures below are its; accelerate's own cut (the
#: default) is tested apart (test_accelerate_cut)
KW = dict(batch=2, seq=128, attention="eager", dtype="fp32", autocast="none", gpus=4, shard="fsdp", fsdp_wrap="layers")


@pytest.mark.parametrize("param_dtype", ["bf16", "none"])
def test_fsdp2_rank0_states_and_peak(param_dtype):
    kw = dict(KW, param_dtype=param_dtype, optimizer_impl="fused")
    traced = trace_fsdp2(CONFIG, TrainingSetup(**kw))
    est = api.build({"config": CONFIG, **kw})
    # the sharded fp32 states, tensor by tensor (dim-0 chunks over 4 ranks): exact up to the rotary
    # inv_freq buffer (one 512-byte block) the estimate leaves out
    # 8,450,560 B: two fp32 Adam moments of every padded shard, each rounded to 512 B
    assert traced.components["optimizer"] == est.components["optimizer"]
    assert 0 <= traced.components["weights"] - est.components["weights"] <= 1024
    # the peak (backward), measured on 2026-12-05 once the trace follows FSDP2's in-place storage frees
    # (distributed._storage_resizes): bf16 at the loss's backward, trace 38,282,752 B vs 38,276,608 B (root + one
    # unit gathered); fp32 at the top unit's backward, 51,598,336 B vs 53,094,767 B (+2.9%: the estimate holds the
    # unit's whole unsharded gradient and the next unit's gather there, the trace the gradients made so far)
    assert traced.peak_phase == est.peak_phase == "backward"
    # the rank runs on real CPU tensors: no cuBLAS workspaces (cabe.units.CUDA_WORKSPACES) in the trace
    error = (est.total_bytes - CUDA_WORKSPACES - traced.peak_bytes) / traced.peak_bytes
    # fp32 on 2026-12-07: +7.0%. The untied lm_head's unsharded gradient (2 MiB) now counted from the head's backward
    # to the root's reduce-scatter is in the trace at its peak (``mm``, alive at the top unit's backward); the rest is
    # the top unit's whole unsharded gradient and a prefetched unit, both counted whole there (open, issue 30)
    assert (abs(error) < 0.005) if param_dtype == "bf16" else (0 < error < 0.08), error


def test_fsdp2_frees_resharded_units():
    """FSDP2 reshards a unit after its forward by shrinking the all-gathered storage in place
    (``untyped_storage().resize_(0)``, torch 2.13 _fsdp_param.py ``free_storage``), which no dispatch mode sees: at
    the loss's backward only the root unit and the top unit are gathered (bf16: 2,097,664 B + 1,582,080 B), not
    every layer's gather since the first (44,611,072 B before, 6.3 MB more)."""
    traced = trace_fsdp2(CONFIG, TrainingSetup(**dict(KW, param_dtype="bf16", optimizer_impl="fused")))
    assert traced.peak_bytes == 38_282_752


@pytest.mark.parametrize("param_dtype", ["bf16", "none"])
def test_accelerate_cut(param_dtype):
    """accelerate's own fsdp2_prepare_model (the default ``fsdp_wrap``): 4 layer units, the input embedding's unit,
    [final norm, lm_head] kept gathered, the root (8 FSDP modules). Its peak is the layers' cut's less the root's
    embedding and the top layer's unit at the loss head (cabe.parallel.fsdp ``_accelerate_units``)."""
    kw = dict(KW, param_dtype=param_dtype, optimizer_impl="fused", fsdp_wrap="accelerate")
    traced = trace_fsdp2(CONFIG, TrainingSetup(**kw))
    assert traced.engine["wrapping"].startswith("accelerate ") and "8 units" in traced.engine["wrapping"]
    layers = trace_fsdp2(CONFIG, TrainingSetup(**dict(kw, fsdp_wrap="layers")))
    assert traced.peak_bytes < layers.peak_bytes
    est = api.build({"config": CONFIG, **kw})
    error = (est.total_bytes - CUDA_WORKSPACES - traced.peak_bytes) / traced.peak_bytes
    # fp32 (no param_dtype): +6.4% on 2026-12-07, the layers' cut's open miss above (the top unit's whole unsharded
    # gradient and a prefetched unit counted whole at its backward)
    assert (abs(error) < 0.01) if param_dtype == "bf16" else (0 < error < 0.08), error


def test_fsdp2_trace_needs_one_fsdp_group():
    with pytest.raises(ConfigError):
        trace_fsdp2(CONFIG, TrainingSetup(**dict(KW, shard="zero3", fsdp_wrap="accelerate")))


# ---- the fake CUDA device: any size, the engines users run (cabe.trace.distributed.trace) -------------------------
from cabe.errors import InvalidValueError  # noqa: E402
from cabe.trace import trace_step, zero  # noqa: E402
from cabe.trace.distributed import refusal  # noqa: E402


def test_fsdp2_on_the_fake_device_is_the_cpu_reference_plus_cublas():
    """The same rank 0 on fake CUDA tensors as on real CPU tensors: the CPU run has no cuBLAS workspaces, the fake
    device's allocator counts them (64 MiB); every tensor the engine makes is the same (to a 512-byte block)."""
    setup = TrainingSetup(**dict(KW, param_dtype="bf16", optimizer_impl="fused"))
    fake = trace_step(CONFIG, setup)
    cpu = trace_fsdp2(CONFIG, setup)
    assert fake.mode == "fake-fsdp" and cpu.mode == "cpu-fsdp"
    assert abs(fake.peak_bytes - CUDA_WORKSPACES - cpu.peak_bytes) <= 1024
    assert fake.engine["engine"] == "FSDP2 fully_shard" and fake.engine["mesh"] == [4]
    assert fake.engine["wrapping"] == "fully_shard per decoder layer (4 units) + root"
    assert fake.engine["world_size"] == 4 and fake.engine["engine_version"].startswith("2.")
    est = api.build({"config": CONFIG, **dict(KW, param_dtype="bf16", optimizer_impl="fused")})
    assert abs(est.total_bytes - fake.peak_bytes) / fake.peak_bytes < 0.005


def test_ddp_buckets_are_a_second_copy_of_the_gradients():
    """DDP's Reducer keeps flat buckets covering every gradient (gradient_as_bucket_view=False, the default): on 8
    GPUs fp32 AdamW peaks at the optimizer step with weights, gradients, buckets, two moments and the foreach
    temporaries: 15,803,392 B each but the moments' 31,606,784 B, and cuBLAS's 64 MiB."""
    kw = dict(KW, gpus=8, shard="ddp", fsdp_wrap="accelerate")  # (DDP: no FSDP units to cut)
    traced = trace_step(CONFIG, TrainingSetup(**kw))
    est = api.build({"config": CONFIG, **kw})
    assert traced.engine["engine"] == "DistributedDataParallel" and traced.engine["bucket_cap_mb"] == 25
    assert traced.peak_phase == est.peak_phase == "optimizer"
    assert est.components["ddp_buckets"] == traced.components["gradients"]
    assert abs(est.total_bytes - traced.peak_bytes) / traced.peak_bytes < 0.001


def test_hsdp_shards_within_a_node_and_replicates_across():
    kw = dict(KW, gpus=16, shard="fsdp-hybrid", gpus_per_node=8, param_dtype="bf16", optimizer_impl="fused")
    traced = trace_step(CONFIG, TrainingSetup(**kw))
    assert traced.engine["mesh"] == [2, 8] and traced.mode == "fake-fsdp-hybrid"
    fsdp8 = api.build({"config": CONFIG, **dict(kw, gpus=8, shard="fsdp")})
    est = api.build({"config": CONFIG, **kw})
    assert est.components["optimizer"] == fsdp8.components["optimizer"] == traced.components["optimizer"]
    assert abs(est.total_bytes - traced.peak_bytes) / traced.peak_bytes < 0.005


@pytest.mark.parametrize(
    ("change", "field", "why"),
    [
        pytest.param(
            {"shard": "zero3"},
            "shard",
            "deepspeed",
            marks=pytest.mark.skipif(zero.available(), reason="DeepSpeed installed: traced (test_zero)"),
        ),
        ({"tp": 2, "shard": "fsdp", "method": "lora"}, "method", "tp_adapters"),
        ({"ep": 2, "shard": "ddp"}, "ep", "ep_fsdp"),
        ({"pp": 2}, "pp", "pp"),
        ({"offload": "optimizer", "shard": "ddp"}, "offload", "offload"),
        ({"method": "qlora"}, "method", "qlora"),
        ({"optimizer": "adamw-8bit"}, "optimizer", "dtensor"),
    ],
)
def test_what_cannot_be_traced_is_refused_by_name(change, field, why):
    with pytest.raises(InvalidValueError) as err:
        refusal(TrainingSetup(**{**KW, **change}))
    assert err.value.field == field and err.value.params["why"] == why
    en, es = err.value.to_dict("en")["message"], err.value.to_dict("es")["message"]
    assert en.startswith(f"{field}: ") and es.startswith(f"{field}: ") and en != es  # its own sentence, en and es
    assert "{" not in en + es


def test_cli_traces_rank_0_and_sets_the_estimate_beside_it(tmp_path):
    import json
    import subprocess
    import sys

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(CONFIG))
    base = [sys.executable, "-m", "cabe", "trace", "--model", str(cfg), "--batch", "2", "--seq", "128"]
    out = subprocess.run([*base, "--gpus", "4", "--shard", "fsdp", "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout)
    assert d["engine"]["engine"] == "FSDP2 fully_shard" and d["mode"] == "fake-fsdp"
    assert abs(d["estimate_relative_error"]) < 0.03 and d["estimate_bytes"] > 0
    refused = subprocess.run([*base, "--gpus", "4", "--shard", "fsdp", "--pp", "2"], capture_output=True, text=True)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr and "pipeline" in refused.stderr


# ---- tensor parallelism: transformers' TP plan on DTensor, alone and under FSDP2 (2-D) ----------------------------
TP_KW = dict(
    batch=2, seq=128, attention="eager", dtype="bf16", autocast="none", gpus=2, tp=2, optimizer_impl="for-loop"
)


def _tp_error(kw):
    from cabe.trace.distributed import trace

    traced = trace(CONFIG, TrainingSetup(**kw), 2, "cpu")
    est = api.build({"config": CONFIG, **kw})
    # the states, tensor by tensor: the plan's DTensor shards (q/k/v/gate/up by rows, o/down by columns, the
    # embedding and lm_head over the vocabulary), the norms whole; up to the rotary buffer (one 512-byte block)
    assert traced.components["optimizer"] == est.components["optimizer"]
    assert 0 <= traced.components["weights"] - est.components["weights"] <= 1024
    return traced, (est.total_bytes - CUDA_WORKSPACES - traced.peak_bytes) / traced.peak_bytes


@pytest.mark.parametrize(
    "extra",
    [
        # measured 2026-12-07 on real CPU tensors: TP alone +0.38% (gathered logits), +0.37% (loss_parallel, whose
        # log-softmax and NLL internals the trace counts: distributed._loss_context); under FSDP2 on a (2, 2) mesh
        # +0.45% and +0.44%
        {"loss_parallel": False},
        {},
        {"gpus": 4, "shard": "fsdp", "loss_parallel": False},
        {"gpus": 4, "shard": "fsdp"},
    ],
)
def test_tensor_parallel_rank0(extra):
    traced, error = _tp_error(dict(TP_KW, **extra))
    assert traced.engine["tp"] == 2
    assert traced.engine["loss_parallel"] is extra.get("loss_parallel", True)
    assert "tp_plan" in traced.engine["tensor_parallel"]
    assert abs(error) < 0.01, error


@pytest.mark.parametrize(
    "extra,why",
    [
        ({"gpus": 4, "shard": "ddp"}, "tp_ddp"),
        ({"method": "lora"}, "tp_adapters"),
        ({"loss": "chunked"}, "tp_loss"),
        ({"dtype": "fp32", "autocast": "fp16"}, "tp_scaler"),
        ({"optimizer_impl": "foreach"}, "tp_mixed"),
        ({"tp": 4, "gpus": 4}, "tp_kv_heads"),  # (2 key / value heads below)
    ],
)
def test_tensor_parallel_refusals(extra, why):
    from cabe.trace.distributed import trace

    with pytest.raises(InvalidValueError) as e:
        trace(dict(CONFIG, num_key_value_heads=2), TrainingSetup(**dict(TP_KW, **extra)), 2, "cpu")
    assert e.value.params["why"] == why
    en, es = e.value.to_dict("en")["message"], e.value.to_dict("es")["message"]
    assert en != es and "{" not in en + es


def test_fsdp_over_tp_on_the_fake_device_equals_cpu():
    """The fake CUDA device runs FSDP2 over TP as real CPU tensors do (plus cuBLAS's workspaces): the 2-D mesh's
    submeshes are sliced outside the fake mode (cabe.trace.distributed._run)."""
    kw = dict(TP_KW, gpus=4, shard="fsdp", loss_parallel=False)
    cpu = trace_step(CONFIG, TrainingSetup(**kw), mode="cpu")
    fake = trace_step(CONFIG, TrainingSetup(**kw), mode="fake")
    assert fake.engine["mesh"] == [2, 2] and fake.mode == "fake-fsdp"
    assert abs(fake.peak_bytes - CUDA_WORKSPACES - cpu.peak_bytes) <= 1024, (fake.peak_bytes, cpu.peak_bytes)
