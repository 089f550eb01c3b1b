"""Expert parallelism traced: transformers' own EP (ep_plan, AllToAllEP) on rank 0 of the fake group under FSDP2
(cabe.trace.expert_parallel), against the per-GPU estimate (cabe.parallel: experts over efsdp = fsdp / ep, their unit
gathered only while its layer runs, the exchange a transient of each MoE layer)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe import api
from cabe.errors import InvalidValueError
from cabe.trace import trace_step
from cabe.trace.distributed import trace
from cabe.trace.expert_parallel import balanced, refusal
from cabe.training import TrainingSetup
from cabe.units import CUDA_WORKSPACES
from configs import DEEPSEEK_V3, TINY

pytestmark = pytest.mark.trace

KW = dict(method="full", dtype="bf16", autocast="none", batch=2, seq=128, shard="fsdp", optimizer="adamw")
#: a Mixtral of 8 experts top-2, hidden 256: the experts are most of each layer
MIXTRAL = dict(TINY["mixtral"], hidden_size=256, intermediate_size=256, num_local_experts=8, vocab_size=512)


def test_balanced_split():
    # 2·128 tokens × top-2 = 512 pairs over 3 ranks: 171 + 171 + 170
    assert balanced(512, 3) == [171, 171, 170] and sum(balanced(7, 4)) == 7


@pytest.mark.parametrize(("gpus", "ep"), [(4, 2), (4, 4), (8, 2)])
def test_rank0_runs_transformers_ep_and_the_estimate_follows(gpus, ep):
    kw = dict(KW, gpus=gpus, ep=ep)
    traced = trace_step(MIXTRAL, TrainingSetup(**kw))
    assert traced.mode == "fake-fsdp" and traced.engine["ep"] == ep
    assert "AllToAllEP" in traced.engine["expert_parallel"]
    assert traced.engine["expert_fsdp"].endswith(f"efsdp = {gpus // ep}")
    est = api.build({"config": MIXTRAL, **kw})
    assert abs(est.total_bytes - traced.peak_bytes) / traced.peak_bytes < 0.03, (est.total_bytes, traced.peak_bytes)


def test_fake_device_is_the_cpu_reference_plus_cublas():
    """The dispatch and combine on fake CUDA tensors run as on real CPU tensors (the balanced sizes on both). Not to
    the byte: 254 KiB of 17 MiB differ at the peak (measured, not yet explained: the experts kernel a CPU run picks
    is a candidate), within 2%."""
    setup = TrainingSetup(**dict(KW, gpus=4, ep=2))
    fake = trace_step(MIXTRAL, setup)
    cpu = trace(MIXTRAL, setup, 2, "cpu")
    assert abs(fake.peak_bytes - CUDA_WORKSPACES - cpu.peak_bytes) / cpu.peak_bytes < 0.02


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen2_moe"])
def test_other_moe_families_trace(name):
    kw = dict(KW, gpus=4, ep=2)
    traced = trace_step(TINY[name], TrainingSetup(**kw))
    assert traced.engine["ep"] == 2


def test_deepseek_traces():
    # (fp32: its router's e_score_correction_bias stays fp32, and FSDP2 refuses a unit of two dtypes in bf16, with or
    # without EP; transformers gives such modules their own unit, cabe.trace.distributed does not yet)
    traced = trace_step(DEEPSEEK_V3, TrainingSetup(**dict(KW, gpus=2, ep=2, dtype="fp32")))
    assert traced.engine["ep"] == 2


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (dict(shard="none"), "ep_fsdp"),
        (dict(shard="ddp"), "ep_fsdp"),
        (dict(tp=2, gpus=8), "ep_tp"),
        (dict(method="lora"), "ep_adapters"),
        (dict(shard="fsdp-hybrid", gpus=8, gpus_per_node=2, ep=4), "ep_node"),
    ],
)
def test_what_cannot_run_is_refused_by_name(change, why):
    setup = TrainingSetup(**{**KW, "gpus": 4, "ep": 2, **change})
    with pytest.raises(InvalidValueError) as e:
        refusal(setup, MIXTRAL)
    assert e.value.params["why"] == why


def test_a_model_without_an_ep_plan_is_refused():
    with pytest.raises(InvalidValueError) as e:
        refusal(TrainingSetup(**dict(KW, gpus=4, ep=2)), dict(TINY["llama"]))
    assert e.value.params["why"] == "ep_plan"
