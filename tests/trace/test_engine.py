"""trace_step over families, methods, precisions and optimizers: structure and known quantities."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe.errors import ConfigError  # noqa: E402
from cabe.trace import TraceResult, trace_step  # noqa: E402
from cabe.trace.tracker import COMPONENTS, round_up  # noqa: E402
from cabe.training import TrainingSetup  # noqa: E402
from configs import TINY  # noqa: E402

pytestmark = pytest.mark.trace

LLAMA = TINY["llama"]


def _check(res: TraceResult) -> None:
    assert set(res.components) == set(COMPONENTS)
    assert sum(res.components.values()) == res.peak_bytes
    assert res.peak_phase in ("forward", "backward", "optimizer")
    assert res.peak_bytes == max(res.phase_peaks.values())
    assert res.peak_bytes % 512 == 0
    assert res.reserved_bytes >= res.allocator_allocated_bytes >= res.peak_bytes
    assert res.reserved_bytes_expandable >= res.peak_bytes
    d = res.to_json()
    assert d["peak_bytes"] == res.peak_bytes and d["timeline"] and "reserved_bytes" in d
    assert all(len(t) == 3 for t in d["timeline"])
    assert TraceResult.from_json(d).peak_bytes == res.peak_bytes


def _param_bytes(cfg, dtype_bytes):
    """Rounded storage bytes of every parameter, from a meta model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    c = dict(cfg)
    mt = c.pop("model_type")
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(AutoConfig.for_model(mt, **c))
    seen, total = set(), 0
    for p in m.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += round_up(p.numel() * dtype_bytes)
    return total


@pytest.mark.parametrize("family", sorted(TINY))
@pytest.mark.parametrize(
    "kw",
    [
        dict(precision="bf16-amp"),
        dict(method="lora", precision="bf16-amp", checkpointing=True),
        dict(method="qlora"),
    ],
    ids=["amp-full", "lora-ckpt", "qlora"],
)
def test_families_and_methods(family, kw):
    res = trace_step(TINY[family], TrainingSetup(batch=2, seq=32, **kw))
    _check(res)
    assert res.mode == "fake"
    assert res.trainable_parameters > 0
    if kw.get("method") in ("lora", "qlora"):
        assert res.trainable_parameters < res.parameters / 5
        assert res.components["gradients"] < res.components["weights"] / 5


def test_full_fp32_adamw_foreach_states_and_temporaries():
    cfg = LLAMA
    res = trace_step(cfg, TrainingSetup(batch=1, seq=16, precision="fp32", optimizer_impl="foreach"))
    w = _param_bytes(cfg, 4)
    assert res.peak_phase == "optimizer"
    assert res.components["weights"] - w < 4096  # + the rotary inv_freq buffer
    assert res.components["gradients"] == w
    assert res.components["optimizer"] == 2 * w  # exp_avg, exp_avg_sq (step counters live on the host)
    # foreach AdamW materialises one full fp32 copy inside _foreach_sqrt
    assert res.components["optimizer_temporaries"] == w
    fused = trace_step(cfg, TrainingSetup(batch=1, seq=16, precision="fp32", optimizer_impl="fused"))
    assert fused.peak_bytes < res.peak_bytes


def test_amp_is_really_active():
    amp = trace_step(LLAMA, TrainingSetup(batch=8, seq=128, precision="bf16-amp"))
    fp32 = trace_step(LLAMA, TrainingSetup(batch=8, seq=128, precision="fp32"))
    assert amp.peak_phase == "backward"
    assert amp.components["weight_copies"] > 0 and fp32.components["weight_copies"] == 0
    assert amp.attention_kernels == {"flash": 4} and fp32.attention_kernels == {"efficient": 4}
    assert amp.first_step_peak_bytes <= amp.peak_bytes  # the autocast cache + state from step 2 on


def test_checkpointing_saves_activations():
    base = dict(batch=4, seq=128, precision="bf16")
    off = trace_step(LLAMA, TrainingSetup(**base))
    on = trace_step(LLAMA, TrainingSetup(checkpointing=True, **base))
    assert on.components["activations"] < off.components["activations"]


def test_attention_kernels():
    gqa = TINY["qwen2"]
    assert trace_step(gqa, TrainingSetup(batch=1, seq=32, precision="bf16", attention="sdpa")).attention_kernels == {
        "flash": 4
    }  # 2 layers x 2 steps
    assert trace_step(gqa, TrainingSetup(batch=1, seq=32, precision="bf16", attention="flash")).attention_kernels == {
        "flash_attention_2": 4
    }
    assert trace_step(gqa, TrainingSetup(batch=1, seq=32, precision="bf16", attention="eager")).attention_kernels == {}
    eager = trace_step(LLAMA, TrainingSetup(batch=2, seq=256, precision="bf16", attention="eager"))
    sdpa = trace_step(LLAMA, TrainingSetup(batch=2, seq=256, precision="bf16", attention="sdpa"))
    assert eager.components["activations"] > sdpa.components["activations"]  # s x s scores


@pytest.mark.parametrize(
    "opt", ["adamw-8bit", "paged-adamw", "paged-adamw-8bit", "sgd", "sgd-momentum", "adafactor", "lion"]
)
def test_optimizers(opt):
    cfg = dict(LLAMA, vocab_size=1024)  # embeddings of 131072 >= 1e5 elements: paged by bitsandbytes
    res = trace_step(cfg, TrainingSetup(batch=1, seq=16, precision="bf16", optimizer=opt))
    _check(res)
    adam = trace_step(cfg, TrainingSetup(batch=1, seq=16, precision="bf16"))
    if opt == "sgd":
        assert res.components["optimizer"] == 0
    elif opt.startswith("paged"):
        # bitsandbytes pages state of tensors >= 1e5 elements with cudaMallocManaged: not allocated
        assert res.paged_bytes > 0
    else:
        assert res.components["optimizer"] > 0
    if opt in ("adamw-8bit", "lion", "sgd-momentum", "adafactor"):
        assert res.components["optimizer"] < adam.components["optimizer"]


def test_grad_accum_keeps_gradients_through_forward():
    one = trace_step(LLAMA, TrainingSetup(batch=2, seq=64, precision="bf16"))
    acc = trace_step(LLAMA, TrainingSetup(batch=2, seq=64, precision="bf16", grad_accum=4))
    assert acc.micro_batches_per_step == 2
    assert acc.phase_peaks["forward"] > one.phase_peaks["forward"]
    assert any("grad_accum" in n for n in acc.notes)


def test_freeze_and_prompt_tuning():
    fr = trace_step(LLAMA, TrainingSetup(batch=2, seq=32, method="freeze", trainable_layers=1, precision="bf16"))
    full = trace_step(LLAMA, TrainingSetup(batch=2, seq=32, precision="bf16"))
    assert fr.trainable_parameters < full.trainable_parameters
    pt = trace_step(LLAMA, TrainingSetup(batch=2, seq=32, method="prompt-tuning", prompt_tokens=8, precision="bf16"))
    assert pt.trainable_parameters == 8 * LLAMA["hidden_size"]


def test_qlora_weights_are_4bit():
    bf16 = trace_step(LLAMA, TrainingSetup(batch=1, seq=16, method="lora", precision="bf16"))
    q = trace_step(LLAMA, TrainingSetup(batch=1, seq=16, method="qlora", precision="bf16"))
    assert q.components["weights"] < bf16.components["weights"]
    assert q.parameters == bf16.parameters  # a 4-bit weight still counts its parameters


def test_steps_and_mode_validation():
    with pytest.raises(ConfigError) as e:
        trace_step(LLAMA, TrainingSetup(), steps=1)
    assert e.value.code == "out_of_range"
    with pytest.raises(ConfigError) as e:
        trace_step(LLAMA, TrainingSetup(), mode="gpu")
    assert e.value.code == "bad_choice"
    with pytest.raises(ConfigError) as e:
        trace_step(LLAMA, TrainingSetup(precision="bf16-amp"), mode="meta")
    assert e.value.code == "mode_unsupported"


def test_three_steps_same_steady_state():
    s = TrainingSetup(batch=2, seq=32, precision="bf16-amp")
    assert trace_step(LLAMA, s, steps=2).peak_bytes == trace_step(LLAMA, s, steps=3).peak_bytes


@pytest.mark.slow
def test_70b_trace_is_fast_and_small():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "trace" / "speed.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    import json

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["total_seconds"] <= 60 and out["peak_rss_mib"] < 2048
    assert out["parameters"] == 70_553_706_496
