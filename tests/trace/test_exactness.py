"""The fake-tensor trace agrees to the byte with a real run on the CPU (and with meta tensors)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import fake_trace

from cabe.trace.engine import run_trace
from cabe.training import TrainingSetup
from configs import TINY

pytestmark = pytest.mark.trace


@pytest.fixture(autouse=True)
def _no_cublas_workspaces(monkeypatch):
    """A real CPU run has no cuBLAS: compare the simulated runs without its workspaces (cabe.units)."""
    from cabe.trace.tracker import NO_WORKSPACES_ENV

    monkeypatch.setenv(NO_WORKSPACES_ENV, "1")  # inherited by the subprocess fake_trace may use


# activations matter here: batch x seq large against the parameter count
ACT_HEAVY = dict(
    TINY["llama"],
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=3,
)

CASES = {
    "fp32-foreach": dict(precision="fp32", attention="eager", optimizer_impl="foreach"),
    "fp32-ckpt": dict(precision="fp32", attention="eager", checkpointing=True),
    "bf16-forloop": dict(precision="bf16", attention="eager", optimizer_impl="for-loop"),
    "lora-fp32": dict(method="lora", precision="fp32", attention="eager", lora_targets=("q_proj", "v_proj")),
    "freeze-sgd": dict(method="freeze", precision="fp32", attention="eager", optimizer="sgd-momentum"),
}


def _same(a, b):
    assert a.peak_bytes == b.peak_bytes
    assert a.first_step_peak_bytes == b.first_step_peak_bytes
    assert a.phase_peaks == b.phase_peaks
    assert a.components == b.components
    assert a.peak_phase == b.peak_phase


@pytest.mark.parametrize("case", sorted(CASES))
def test_cpu_run_equals_fake_trace(case):
    setup = TrainingSetup(batch=4, seq=96, **CASES[case])
    real = run_trace(ACT_HEAVY, setup, 2, "cpu")
    fake = fake_trace(ACT_HEAVY, setup)
    _same(real, fake)
    # not only the peak: the whole malloc/free sequence, hence the allocator replay too
    assert real.alloc_events == fake.alloc_events
    assert real.alloc_sizes == fake.alloc_sizes
    assert real.reserved_bytes == fake.reserved_bytes
    assert real.components["activations"] > 0


# dropout differs by device, legitimately: CUDA runs the fused native_dropout with a 1-byte
# mask, the CPU a float mask (at::dropout's is_fused_kernel_acceptable); so compare without it
NO_DROPOUT = {"gpt2": dict(attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0)}


@pytest.mark.parametrize(
    "family", ["llama", "qwen2", "mistral", "gemma2", "phi3", "gpt2", "gpt_neox", "mixtral", "qwen3_moe", "qwen2_moe"]
)
def test_cpu_run_equals_fake_trace_per_family(family):
    cfg = dict(TINY[family], **NO_DROPOUT.get(family, {}))
    setup = TrainingSetup(batch=2, seq=64, precision="fp32", attention="eager")
    real, fake = run_trace(cfg, setup, 2, "cpu"), fake_trace(cfg, setup)
    _same(real, fake)
    assert real.alloc_events == fake.alloc_events


def test_dropout_mask_is_one_byte_on_cuda():
    """GPT-2's dropout: the fake CUDA run stores a bool mask, the CPU run a float one."""
    setup = TrainingSetup(batch=2, seq=64, precision="fp32", attention="eager")
    real, fake = run_trace(TINY["gpt2"], setup, 2, "cpu"), fake_trace(TINY["gpt2"], setup)
    assert fake.peak_bytes < real.peak_bytes


@pytest.mark.parametrize("family", sorted(TINY))
def test_meta_equals_fake_for_pure_bf16(family):
    setup = TrainingSetup(batch=2, seq=64, precision="bf16")
    _same(run_trace(TINY[family], setup, 2, "meta"), fake_trace(TINY[family], setup))


def test_qlora_meta_equals_fake():
    setup = TrainingSetup(
        batch=2, seq=64, method="qlora", precision="bf16", checkpointing=True, lora_targets=("q_proj", "v_proj")
    )
    _same(run_trace(TINY["llama"], setup, 2, "meta"), fake_trace(TINY["llama"], setup))


@pytest.mark.parametrize("double_quant", [True, False])
def test_qlora_cpu_run_equals_fake_trace(double_quant):
    """bitsandbytes' real CPU 4-bit kernels against the fake CUDA trace: same peaks (the CPU
    backend's internal temporaries differ, so the event sequence is not compared)."""
    pytest.importorskip("bitsandbytes")
    setup = TrainingSetup(
        batch=2,
        seq=64,
        method="qlora",
        precision="fp32",
        attention="eager",
        double_quant=double_quant,
        lora_targets=("q_proj", "v_proj"),
    )
    _same(run_trace(TINY["llama"], setup, 2, "cpu"), fake_trace(TINY["llama"], setup))
