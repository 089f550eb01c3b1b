"""``--transformers 4|5|VERSION`` (cabe.transformers_line): what differs between transformers 4.x and 5.x and
changes memory, each difference against its arithmetic. Sources are cited in cabe/transformers_line.py."""

import subprocess
import sys

import pytest

from cabe import api, transformers_line
from cabe.analytic import estimate_model
from cabe.errors import InvalidValueError
from cabe.models import preset
from cabe.training import TrainingSetup


@pytest.mark.parametrize(("given", "kept"), [("4", "4"), ("5", "5"), ("4.51.3", "4.51.3"), ("v5.25.0", "5.25.0")])
def test_lines_and_versions_are_read(given, kept):
    assert transformers_line.parse(given) == kept
    assert TrainingSetup(transformers=given).transformers_line == int(kept[0])


@pytest.mark.parametrize(
    ("given", "code"),
    [
        ("4.45.2", "transformers_unsupported"),  # before ForCausalLMLoss (4.46)
        ("3", "transformers_unsupported"),
        ("6", "transformers_unsupported"),
        ("latest", "transformers_version"),
        ("4.x", "transformers_version"),
        ("", "transformers_version"),
    ],
)
def test_other_values_are_refused_with_a_code(given, code):
    with pytest.raises(InvalidValueError) as e:
        TrainingSetup(transformers=given)
    assert e.value.code == code and e.value.field == "transformers"


def test_not_given_is_the_installed_line_else_5():
    installed = transformers_line.installed()
    expected = int(installed.split(".")[0]) if installed and installed[0] in "45" else 5
    assert TrainingSetup().transformers_line == expected
    report = estimate_model(preset("llama-3.2-1b").spec, TrainingSetup(method="lora"))
    assert report.setup["transformers"] == (installed if installed and installed[0] in "45" else "5")


def _mixtral(line: str, **kw):
    setup = TrainingSetup(method="qlora", transformers=line, lora_targets=("all-linear",), checkpointing=True, **kw)
    return estimate_model(preset("mixtral-8x7b").spec, setup)


def test_mixtral_qlora_experts_are_4bit_modules_on_4_and_16bit_stacks_on_5():
    """4.x: each expert's w1 / w3 / w2 is an nn.Linear that bitsandbytes quantizes and all-linear adapts; 5.x: two
    fused 3-D stacks per layer that stay in 16 bits (fp32 after k-bit preparation)."""
    v4, v5 = _mixtral("4"), _mixtral("5")
    spec = preset("mixtral-8x7b").spec
    h, f, e, layers, r = spec.hidden_size, 14336, 8, 32, TrainingSetup().lora_rank
    kv = spec.kv_dim
    # per layer: q, k, v, o; the router gate (h -> 8); 8 experts × (w1, w3: h -> f; w2: f -> h)
    attention = (h + h) + (h + kv) + (h + kv) + (h + h)
    per_layer = attention + (h + e) + e * 3 * (h + f)
    assert v4.trainable_parameters == r * per_layer * layers
    expert_params = layers * e * 3 * h * f  # 45.1 B
    # 5.x with k-bit preparation keeps the experts in fp32: more than 4 B each; 4.x stores ~0.52-0.56 B each
    assert v5.components["weights"] > 4 * expert_params
    assert v4.components["weights"] < 0.6 * expert_params + 4e9
    assert v5.total_bytes > 6 * v4.total_bytes
    assert "transformers4_moe_modules" in v4.notes and "transformers4_moe_modules" not in v5.notes


def test_qwen3_moe_gate_proj_reaches_the_routed_experts_on_4_only():
    """4.x: every expert is a Qwen3MoeMLP whose gate_proj a target name reaches; 5.x: PEFT moves gate_proj onto
    the fused gate_up_proj (needing up_proj too), so naming gate_proj alone is refused there."""
    spec = preset("qwen3-30b-a3b").spec
    v4 = estimate_model(spec, TrainingSetup(method="lora", transformers="4", lora_targets=("gate_proj",)))
    h, fe, e, r = spec.hidden_size, 768, 128, TrainingSetup().lora_rank
    assert v4.trainable_parameters == r * (h + fe) * e * spec.num_layers
    with pytest.raises(InvalidValueError) as err:
        estimate_model(spec, TrainingSetup(method="lora", transformers="5", lora_targets=("gate_proj",)))
    assert err.value.code == "fused_lora_target"


def test_no_dtype_loads_fp32_on_4_and_the_checkpoint_dtype_on_5():
    spec = preset("llama-3.2-1b").spec
    v4 = estimate_model(spec, TrainingSetup(method="full", transformers="4", autocast="bf16"))
    v5 = estimate_model(spec, TrainingSetup(method="full", transformers="5", autocast="bf16"))
    assert v4.setup["dtype"] == "fp32" and v5.setup["dtype"] == "bf16"
    assert v4.components["weights"] == 2 * v5.components["weights"]  # 4 B vs 2 B per parameter
    assert "transformers4_dtype_default" in v4.notes and "transformers4_dtype_default" not in v5.notes
    given = estimate_model(spec, TrainingSetup(method="full", transformers="4", dtype="bf16", autocast="bf16"))
    assert given.total_bytes == v5.total_bytes and "transformers4_dtype_default" not in given.notes
    qlora = estimate_model(spec, TrainingSetup(method="qlora", transformers="4"))
    assert qlora.setup["dtype"] == "fp16"  # bitsandbytes' update_dtype


def test_gemma2_runs_sdpa_on_4_and_eager_on_5():
    spec = preset("gemma-2-2b").spec
    v4 = estimate_model(spec, TrainingSetup(method="lora", transformers="4", dtype="bf16", seq=2048))
    v5 = estimate_model(spec, TrainingSetup(method="lora", transformers="5", dtype="bf16", seq=2048))
    assert "gemma2_eager" in v5.notes and "gemma2_eager" not in v4.notes
    assert v4.total_bytes < v5.total_bytes  # no materialised 2048² scores


@pytest.mark.parametrize(
    ("kw", "code"),
    [
        (dict(method="freeze", checkpointing=True), "transformers4_freeze_checkpointing"),
        (dict(method="lora", checkpointing=True, checkpoint_every=2), "transformers4_no_saver"),
        (dict(method="lora", checkpointing=True, offload_activations=True), "transformers4_no_saver"),
    ],
)
def test_what_4_cannot_run_is_refused(kw, code):
    with pytest.raises(InvalidValueError) as e:
        TrainingSetup(transformers="4", **kw)
    assert e.value.code == code
    TrainingSetup(transformers="5", **kw)  # 5.x runs it
    TrainingSetup(transformers="4", recipe="llama-factory", **kw)  # LLaMA-Factory does it itself


def test_a_model_type_4_lacks_is_refused():
    with pytest.raises(InvalidValueError) as e:
        estimate_model(preset("deepseek-v3.2-exp").spec, TrainingSetup(method="lora", transformers="4.57.6"))
    assert e.value.code == "transformers_no_model_type"


def test_the_api_and_the_cli_take_it():
    out = api.estimate_json({"model": "mixtral-8x7b", "method": "qlora", "transformers": "4.51.3"})
    assert out["setup"]["transformers"] == "4.51.3"
    bad = subprocess.run(
        [sys.executable, "-m", "cabe", "estimate", "--model", "llama-3.2-1b", "--transformers", "3.0"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "4.46" in bad.stderr


def test_the_trace_refuses_the_line_it_does_not_run():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    installed = transformers_line.installed()
    other = "4" if installed.startswith("5") else "5"
    out = subprocess.run(
        [sys.executable, "-m", "cabe", "trace", "--model", "llama-3.2-1b", "--method", "lora", "--transformers", other],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr and installed in out.stderr


def test_qwen3_vl_moe_router_is_an_adaptable_linear_on_4_only():
    """Qwen3-VL-MoE's router: a bare-weight TopKRouter PEFT refuses on 5.x, an nn.Linear ``gate`` on 4.x
    (modeling_qwen3_vl_moe.py 4.57.6:135); its experts are 3-D parameters in both lines."""
    spec = preset("qwen3-vl-30b-a3b-instruct").spec
    v4 = estimate_model(spec, TrainingSetup(method="lora", transformers="4", lora_targets=("q_proj", "gate")))
    only_q = estimate_model(spec, TrainingSetup(method="lora", transformers="4", lora_targets=("q_proj",)))
    r, h, e = TrainingSetup().lora_rank, spec.hidden_size, spec.num_experts
    assert v4.trainable_parameters - only_q.trainable_parameters == r * (h + e) * spec.num_layers
    with pytest.raises(InvalidValueError) as err:
        estimate_model(spec, TrainingSetup(method="lora", transformers="5", lora_targets=("q_proj", "gate")))
    assert err.value.code == "lora_target_unsupported"


def test_flash_attention_where_4_has_none_is_refused():
    """Qwen3-Next's 4.57.6 classes do not set _supports_flash_attn (False by default): from_pretrained refuses it."""
    spec = preset("qwen3-next-80b-a3b").spec
    with pytest.raises(InvalidValueError) as e:
        estimate_model(spec, TrainingSetup(method="lora", transformers="4", attention="flash", dtype="bf16"))
    assert e.value.code == "flash_unsupported"
    estimate_model(spec, TrainingSetup(method="lora", transformers="5", attention="flash", dtype="bf16"))


def test_the_installed_version_is_read_as_importlib_metadata_reads_it():
    from importlib import metadata

    transformers_line.installed.cache_clear()
    try:
        expected = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        expected = None
    assert transformers_line.installed() == expected
