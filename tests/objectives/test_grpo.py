"""cabe.objectives.grpo: a GRPOTrainer step's phases (trl 1.16.0), their arithmetic and their refusals. The trace
of the same steps is tests/trace/test_grpo_trace.py; the random sample, benchmarks/differential/grpo.py."""

from __future__ import annotations

import pytest

from cabe import api, gpus
from cabe.errors import CabeError
from cabe.models import preset
from cabe.objectives import grpo
from cabe.training import TrainingSetup

QWEN = "Qwen/Qwen3-0.6B"
BASE = {"model": QWEN, "objective": "grpo", "batch": 4, "num_generations": 4, "prompt_length": 64}


def _build(**kw):
    return api.build({**BASE, "max_completion_length": 64, **kw})


def test_generation_batch_is_trl_s():
    # grpo_config.py:1097-1112: batch x GPUs x steps_per_generation (default grad_accum), or generation_batch_size
    assert grpo.shape(TrainingSetup(objective="grpo", batch=4, num_generations=4)).g == 4
    assert grpo.shape(TrainingSetup(objective="grpo", batch=4, num_generations=4, grad_accum=3)).g == 12
    sh = grpo.shape(TrainingSetup(objective="grpo", batch=2, num_generations=4, generation_batch_size=8))
    assert (sh.g, sh.steps) == (8, 4)
    # a separate reference for full fine-tuning, the adapter disabled for LoRA, none at beta 0
    assert grpo.shape(TrainingSetup(objective="grpo", batch=8, beta=0.04)).ref == "model"
    assert grpo.shape(TrainingSetup(objective="grpo", batch=8, beta=0.04, method="lora")).ref == "adapter"
    assert grpo.shape(TrainingSetup(objective="grpo", batch=8)).ref == "none"
    # the old log-probs: generation reused across optimizer steps, or vLLM's importance sampling
    assert not grpo.shape(TrainingSetup(objective="grpo", batch=8)).old
    assert grpo.shape(TrainingSetup(objective="grpo", batch=8, steps_per_generation=2)).old


@pytest.mark.parametrize(
    ("kw", "code"),
    [
        ({"batch": 1}, "grpo_generation_groups"),
        ({"generation_batch_size": 8, "steps_per_generation": 2}, "grpo_generation_both"),
        ({"generation_batch_size": 6}, "grpo_generation_batch"),
        ({"use_vllm": True}, "grpo_colocate_needs_gpu"),
        ({"shard": "fsdp", "gpus": 2}, "grpo_layout"),
        ({"loss": "liger"}, "grpo_fused_head"),
        ({"vllm_mode": "server"}, "vllm_only"),
    ],
)
def test_refusals(kw, code):
    with pytest.raises(CabeError) as e:
        _build(**kw)
    assert e.value.code == code


def test_grpo_fields_need_the_objective():
    with pytest.raises(CabeError) as e:
        api.build({"model": QWEN, "num_generations": 4})
    assert e.value.code == "grpo_only"


def test_phases_and_peak():
    r = _build()
    assert list(r.phase_peaks) == ["generation", "forward", "backward", "optimizer"]
    assert r.total_bytes == max(r.phase_peaks.values()) == r.phase_peaks[r.peak_phase]
    assert r.extra["grpo"]["generator"] == "hf-generate"
    # the rollout buffer: ids and masks of 4 x (64 + 64) int64 and 4 fp32 advantages, each allocation rounded to 512
    assert r.extra["grpo"]["phase_components"]["forward"]["rollout"] == 4 * 2048 + 512


def test_reference_model_for_full_none_for_lora():
    spec = preset("qwen3-0.6b").spec
    full = _build(beta=0.04, dtype="bf16")
    comps = full.extra["grpo"]["phase_components"]
    # a second model in the policy's dtype: parameters x 2 B + buffers
    assert comps["forward"]["reference_weights"] == spec.parameter_count * 2 + spec.buffer_bytes
    assert "reference" in full.phase_peaks
    lora = _build(beta=0.04, method="lora")
    assert "reference_weights" not in lora.extra["grpo"]["phase_components"]["forward"]
    assert "reference" in lora.phase_peaks  # the base's log-probs, the adapter disabled


def test_colocated_engine_is_a_share_of_the_card():
    card = gpus.gpu("h100")
    r = _build(method="lora", use_vllm=True, gpu="h100", vllm_gpu_memory_utilization=0.4)
    pool = round(0.4 * card.memory_bytes) - card.cuda_context_bytes  # vLLM's budget holds the process's context
    comps = r.extra["grpo"]["phase_components"]
    assert all(c["vllm_engine"] == pool for c in comps.values())
    assert r.extra["grpo"]["vllm"]["pool_bytes"] == pool
    # sleep mode (level 2): the pool only while generating
    slept = _build(
        method="lora", use_vllm=True, gpu="h100", vllm_gpu_memory_utilization=0.4, vllm_enable_sleep_mode=True
    )
    comps = slept.extra["grpo"]["phase_components"]
    assert comps["generation"]["vllm_engine"] == pool
    assert all("vllm_engine" not in comps[p] for p in ("reference", "forward", "backward", "optimizer"))
    assert slept.total_bytes < r.total_bytes
    # the pool was sized on that card: the "fits on" list names it only
    assert gpus.fits_on(r) in ([card.name], [])


def test_server_mode_holds_no_engine_here():
    r = _build(method="lora", use_vllm=True, vllm_mode="server")
    assert "vllm_engine" not in r.extra["grpo"]["phase_components"]["generation"]
    assert "grpo_vllm_modelled" in r.notes


def test_text_lists_each_phase():
    text = _build().text()
    assert "Peak of each phase" in text and "generation" in text
    assert "ForCausalLMLoss" not in text  # GRPO scores with TRL's fused head


def test_slack_is_the_analytic_fraction():
    from cabe.analytic.lesson import ALLOCATOR_SLACK_FRACTION

    assert grpo.ALLOCATOR_SLACK_FRACTION == ALLOCATOR_SLACK_FRACTION
    r = _build()
    assert r.allocator_slack_bytes == round(r.total_bytes * ALLOCATOR_SLACK_FRACTION)  # no logits: no 4 B per logit
    v = _build(method="lora", use_vllm=True, gpu="h100")
    pool = v.components["vllm_engine"]
    assert v.allocator_slack_bytes == round((v.total_bytes - pool) * ALLOCATOR_SLACK_FRACTION)  # vLLM's own pool


def test_fit_skips_the_batch_and_seq_sweeps():
    from cabe.solver import plan_json

    out = plan_json({**BASE, "max_completion_length": 64, "gpu": "h100", "method": "lora", "use_vllm": True})
    assert "batch" not in out and "seq" not in out and "changes" in out  # the pool is the named card's (on_card)
    assert out["now"]["fits"]


def test_a_seq_grpo_would_not_read_is_refused():
    """The policy's rows are prompt + completion tokens: a --seq that says otherwise is refused (never ignored); the one
    that agrees (96 + 32 = 128, what the differential sampler sends) is taken."""
    with pytest.raises(CabeError) as e:
        _build(seq=4096)
    assert e.value.code == "grpo_seq" and e.value.field == "seq"
    a = _build(seq=128, prompt_length=96, max_completion_length=32).total_bytes
    assert a == _build(prompt_length=96, max_completion_length=32).total_bytes
