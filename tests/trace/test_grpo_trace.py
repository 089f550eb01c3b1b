"""cabe.trace.grpo: a GRPOTrainer step run with TRL's own code on fake CUDA tensors (the rollout's no-grad log-probs,
``_compute_loss`` forward and backward, the optimizer, ``generate`` joined as the generation phase) against the
analytic phases of cabe.objectives.grpo, on a tiny Llama; what it refuses."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from cabe.analytic import estimate_model
from cabe.models import from_mapping
from cabe.trace import trace_step
from cabe.training import TrainingSetup

#: a Llama of 2 layers, untied, at widths where the working memory is not lost beside cuBLAS's 32 MiB workspaces
LLAMA = dict(
    model_type="llama",
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    vocab_size=32768,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)
GRPO = dict(objective="grpo", batch=4, num_generations=4, prompt_length=32, max_completion_length=32)


@pytest.mark.parametrize(
    "kw",
    [
        {},  # full fine-tuning, no reference
        {"beta": 0.04},  # a second model for the reference
        {"method": "lora", "beta": 0.04, "checkpointing": True},  # the adapter disabled for the reference
        {"steps_per_generation": 2, "batch": 2},  # generation reused: the old log-probs, two micro-batches
    ],
)
def test_grpo_step_against_the_estimate(kw):
    setup = TrainingSetup(**{**GRPO, **kw})
    tr = trace_step(LLAMA, setup)
    est = estimate_model(from_mapping(LLAMA, "llama").spec, setup)
    assert abs(est.total_bytes - tr.peak_bytes) / tr.peak_bytes < 0.01, (est.phase_peaks, tr.phase_peaks)
    assert "generation" in tr.phase_peaks and "reference" in tr.phase_peaks
    for phase in ("forward", "backward", "optimizer"):
        assert abs(est.phase_peaks[phase] - tr.phase_peaks[phase]) / tr.phase_peaks[phase] < 0.02, phase


def test_vllm_is_refused_by_the_trace_command(capsys):
    from cabe.cli import main

    assert main(["trace", "--model", "Qwen/Qwen3-0.6B", "--objective", "grpo", "--batch", "8", "--use-vllm"]) == 2
    assert "fake tensors" in capsys.readouterr().err


def test_several_gpus_are_estimated_not_traced():
    from cabe.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        trace_step(LLAMA, TrainingSetup(**GRPO, gpus=2, shard="ddp"))
    assert e.value.code == "trace_grpo_one_gpu"
