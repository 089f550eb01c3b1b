"""FLOPs and time of a training step."""

import pytest

from cabe import gpus
from cabe.errors import InvalidValueError
from cabe.flops import matmul_params, run_time, step_flops
from cabe.models import preset
from cabe.training import TrainingSetup

L3 = preset("llama-3.1-8b").spec


def test_full_is_6n_plus_attention():
    s = TrainingSetup(batch=1, seq=2048)
    f = step_flops(L3, s)
    _, n = matmul_params(L3)
    attn = 12 * 32 * 2048 * 4096
    assert f["per_token"] == 6 * n + attn
    assert n == 32 * sum(lin.weight_count for lin in L3.layer_linears) + L3.vocab_size * L3.hidden_size


def test_lora_is_4n_and_checkpointing_adds_a_forward():
    _, n = matmul_params(L3)
    attn_f = 4 * 32 * 2048 * 4096
    lora = step_flops(L3, TrainingSetup(method="lora", batch=1, seq=2048))
    assert lora["per_token"] == 4 * n + 3 * attn_f
    ck = step_flops(L3, TrainingSetup(batch=1, seq=2048, checkpointing=True))
    assert ck["per_token"] == 8 * n + 4 * attn_f
    assert ck["model_flops"] < ck["hardware_flops"]


def test_moe_counts_active_experts():
    mx = preset("mixtral-8x7b").spec
    total, active = matmul_params(mx)
    assert 12e9 < active < 13.5e9 and total > 46e9  # ~12.9B active of 46.7B


def test_run_time_and_gpu_hours():
    card = gpus.gpu("h100-80gb")
    s = TrainingSetup(batch=4, seq=2048, gpus=8, shard="fsdp")
    r = run_time(L3, s, card, tokens=1e9, mfu=0.4)
    per_step = r["flops_per_step"] / (card.bf16_tflops_dense * 1e12 * 0.4)
    assert r["step_seconds"] == pytest.approx(per_step)
    assert r["gpu_hours"] == pytest.approx(8 * r["run_hours"])
    # the whole run: 6·N·T-ish FLOPs over 8 GPUs at 40 % of peak
    total = r["per_token"] * 1e9
    assert r["run_hours"] == pytest.approx(total / (8 * card.bf16_tflops_dense * 1e12 * 0.4) / 3600, rel=1e-6)
    with pytest.raises(InvalidValueError):
        run_time(L3, s, card, mfu=0)
    with pytest.raises(InvalidValueError):
        run_time(L3, s, card, tokens=-5)
