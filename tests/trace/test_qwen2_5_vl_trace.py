"""Qwen2.5-VL traced with images: the step feeds fake ``pixel_values`` and ``image_grid_thw`` (cabe.trace.vision),
so the vision tower runs forward and backward; cabe's estimate within 3% of that trace, and the methods act on
the tower as transformers and PEFT 0.21.2 do (full trains it, LoRA freezes it, all-linear adapts its linears)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe import families
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup
from configs import QWEN2_5_VL

pytestmark = pytest.mark.trace

IMAGES = dict(images=4, batch=2, seq=1024, image_size="448x448")  # 8 images of 32 x 32 patches: 8,192 patches
SLOW = pytest.mark.slow  # a trace of 8 images through the tower: about a minute each on 2 shared cores
SAMPLE = [
    pytest.param(dict(precision="bf16", **IMAGES), id="full-bf16"),
    pytest.param(dict(precision="bf16-amp", **IMAGES), id="full-bf16-amp", marks=SLOW),
    pytest.param(dict(precision="bf16", attention="eager", **IMAGES), id="full-eager", marks=SLOW),
    pytest.param(dict(method="lora", precision="bf16", lora_targets=("all-linear",), **IMAGES), id="lora-all-linear"),
    # the tower's input requires grad (enable_input_require_grads)
    pytest.param(dict(method="lora", precision="bf16", checkpointing=True, **IMAGES), id="lora-ckpt", marks=SLOW),
    # the frozen tower's forward sets the peak
    pytest.param(dict(method="freeze", trainable_layers=1, precision="bf16", **IMAGES), id="freeze", marks=SLOW),
    pytest.param(dict(method="qlora", lora_targets=("all-linear",), **IMAGES), id="qlora-all-linear", marks=SLOW),
    # the decoder's LoRA only: the 4-bit tower's forward (fp32 norms, qkv and residual after kbit prep) sets the peak
    pytest.param(dict(method="qlora", **IMAGES), id="qlora", marks=SLOW),
]


@pytest.mark.parametrize("kw", SAMPLE)
def test_estimate_within_3_percent_of_trace(kw):
    from cabe.trace import trace_step

    spec = families.from_config(dict(QWEN2_5_VL))
    setup = TrainingSetup(**kw)
    traced = trace_step(dict(QWEN2_5_VL), setup)
    estimated = estimate_model(spec, setup)
    assert abs(estimated.total_bytes - traced.peak_bytes) / traced.peak_bytes <= 0.03, (
        estimated.total_bytes,
        traced.peak_bytes,
    )
    if setup.method != "qlora":  # (4-bit weights count as packed bytes in the trace)
        assert traced.parameters - (traced.trainable_parameters if setup.method == "lora" else 0) == (
            spec.parameter_count
        )
    if setup.method in ("full", "lora"):  # full: every weight, the tower's too; LoRA: the adapters PEFT made
        assert traced.trainable_parameters == estimated.trainable_parameters


@SLOW
def test_images_grow_the_traced_step():
    from cabe.trace import trace_step

    setup = TrainingSetup(precision="bf16", batch=2, seq=1024)
    text = trace_step(dict(QWEN2_5_VL), setup).peak_bytes
    images = trace_step(dict(QWEN2_5_VL), setup.with_(images=4)).peak_bytes
    assert images > 2 * text  # the tower's saved tensors dwarf this tiny decoder's
