"""The optimizer registry: the HF Trainer's ``optim`` names, torchao's low-bit AdamW, GaLore (and its
layer-wise step), bitsandbytes' one-state optimizers — each rule's bytes with its arithmetic."""

import pytest

from cabe import api, optimizer
from cabe.analytic import estimate_model
from cabe.errors import InvalidValueError
from cabe.models import preset
from cabe.tensors import Tensor
from cabe.training import TrainingSetup

MiB = 1 << 20


def _t(rows: int, cols: int, name: str = "q_proj", role: str = "attn", kind: str = "base") -> Tensor:
    # the module path a Llama layer gives it (cabe.parameters.linear_path), which GaLore's targets match
    path = {"attn": "self_attn.", "mlp": "mlp."}.get(role, "") + name if role in ("attn", "mlp") else ""
    return Tensor(name, rows * cols, 1, True, kind, rows, cols, role, path)


# ---- names --------------------------------------------------------------------------------------
def test_every_trainer_optim_name_is_modelled_or_refused_by_name():
    OptimizerNames = pytest.importorskip("transformers.training_args").OptimizerNames
    for o in OptimizerNames:
        assert (o.value in optimizer.HF_NAMES) != (o.value in optimizer.HF_NOT_MODELLED), o.value


@pytest.mark.parametrize(
    ("given", "name", "impl"),
    [
        ("adamw_torch_fused", "adamw", "fused"),
        ("paged_adamw_8bit", "paged-adamw-8bit", None),
        ("galore_adamw_8bit_layerwise", "galore-adamw-8bit-layerwise", None),
        ("adamw_torch_4bit", "adamw-torch-4bit", None),
        ("adamw_torch_8bit", "adamw-torch-8bit", None),  # torchao's AdamW8bit, not bitsandbytes'
        ("lion_8bit", "lion-8bit", None),
        ("rmsprop_bnb", "rmsprop-bnb", None),
        ("adafactor", "adafactor", None),
        ("adamw-8bit", "adamw-8bit", None),  # cabe's own name stays
    ],
)
def test_trainer_names_become_the_registry_entry(given, name, impl):
    s = TrainingSetup(optimizer=given)
    assert (s.optimizer, s.optimizer_impl, s.optimizer_given) == (name, impl, given)


def test_api_and_json_echo_both_names():
    out = api.estimate_json({"model": "qwen2.5-0.5b", "optimizer": "adamw_torch_fused"})
    setup = out["setup"]
    assert (setup["optimizer"], setup["optimizer_given"], setup["optimizer_impl"]) == (
        "adamw",
        "adamw_torch_fused",
        "fused",
    )


def test_unmodelled_trainer_name_is_a_typed_error_listing_the_modelled_ones():
    with pytest.raises(InvalidValueError) as e:
        TrainingSetup(optimizer="apollo_adamw")
    assert e.value.code == "optimizer_not_modelled"
    assert "galore_adamw_layerwise" in e.value.params["allowed"]


def test_implementation_contradicting_the_name_is_refused():
    with pytest.raises(InvalidValueError) as e:
        TrainingSetup(optimizer="adamw_torch_fused", optimizer_impl="for-loop")
    assert e.value.code == "optimizer_impl_conflict"


# ---- bitsandbytes one-state 8-bit --------------------------------------------------------------------
def test_bnb_one_state_8bit():
    rule = optimizer.get("lion-8bit").state
    # 4096 x 4096: a uint8 state (16 MiB) + an fp32 absmax per 256: 65536 x 4 = 256 KiB
    assert rule(_t(4096, 4096), 2, "foreach") == 16 * MiB + 256 * 1024
    # under 4096 elements: one fp32 state, 1000 x 4 = 4000 -> 4096 (512-byte rounding)
    assert rule(Tensor("norm", 1000, 1, True, "norm"), 2, "foreach") == 4096
    # paged: the uint8 state is paged (>= 1e5 elements), the absmax stays on the device
    paged = optimizer.get("paged-lion-8bit")
    assert paged.device_and_paged(_t(4096, 4096), 2, "foreach") == (256 * 1024, 16 * MiB)


# ---- torchao ------------------------------------------------------------------------------------
def test_torchao_4bit_state():
    # torchao optim/subclass_4bit.py: codes n/2 uint8, scale n/128 fp32, qmap 16 fp32 (-> 512 B), per moment
    per = 4096 * 4096 // 2 + 4096 * 4096 // 128 * 4 + 512
    assert optimizer.get("torchao-adamw-4bit").state(_t(4096, 4096), 2, "foreach") == 2 * per
    # the HF Trainer passes block_size=256 (trainer_optimizer.py:471): half the scales
    per_hf = 4096 * 4096 // 2 + 4096 * 4096 // 256 * 4 + 512
    assert optimizer.get("adamw-torch-4bit").state(_t(4096, 4096), 2, "foreach") == 2 * per_hf


def test_torchao_8bit_and_fp8_state():
    n = 4096 * 4096
    # subclass_8bit.py: codes n uint8, scale n/256 fp32, qmap 256 fp32 = 1024 B
    assert optimizer.get("adamw-torch-8bit").state(_t(4096, 4096), 4, "foreach") == 2 * (n + n // 256 * 4 + 1024)
    # subclass_fp8.py: codes n float8_e4m3fn, scale n/256 fp32, no qmap
    assert optimizer.get("adamw-fp8").state(_t(4096, 4096), 4, "foreach") == 2 * (n + n // 256 * 4)


def test_torchao_keeps_small_or_unaligned_tensors_in_the_parameter_dtype():
    rule = optimizer.get("torchao-adamw-4bit").state
    # adam.py:75: quantized only when numel >= 4096 and numel % block_size == 0; else zeros_like(p)
    small = Tensor("norm", 2048, 1, True, "norm")
    assert rule(small, 2, "foreach") == 2 * 4096  # 2048 x 2 B
    odd = Tensor("x", 4096 + 64, 1, True, "base")  # 4160 is not a multiple of 128
    assert rule(odd, 4, "foreach") == 2 * 16896  # 4160 x 4 = 16640 -> 16896


# ---- GaLore -------------------------------------------------------------------------------------
def _galore(rank=128, targets=("attn", "mlp"), **kw):
    return TrainingSetup(optimizer="galore_adamw", galore_rank=rank, galore_targets=targets, **kw)


def test_galore_projected_moments_and_projection_16bit():
    o = optimizer.get("galore-adamw")
    # q_proj 4096 x 4096 in bf16, rank 128: moments of the (4096, 128) projected gradient, 2 x 524288 x 2 B,
    # plus the projection cast back to bf16, 128 x 4096 x 2 B
    assert o.tensor_state(_t(4096, 4096), 2, "foreach", _galore()) == 2 * 524288 * 2 + 128 * 4096 * 2
    # down_proj 4096 x 11008 (rows < cols): projected on the left, (128, 11008); projection U[:, :128] 4096 x 128
    down = _t(4096, 11008, "down_proj", "mlp")
    assert o.tensor_state(down, 2, "foreach", _galore()) == 2 * 128 * 11008 * 2 + 4096 * 128 * 2


def test_galore_fp32_projection_keeps_the_whole_svd_factor():
    # galore_projector.py:86-92: for fp32 B = Vh[:rank, :] is a view of Vh (k x k with k = min(rows, cols));
    # confirmed on CPU torch: a (256, 64) fp32 gradient at rank 16 keeps 64 x 64 x 4 = 16384 B of storage
    o = optimizer.get("galore-adamw")
    assert o.tensor_state(_t(4096, 4096), 4, "foreach", _galore()) == 2 * 524288 * 4 + 4096 * 4096 * 4


def test_galore_rank_is_capped_by_the_smaller_side_and_untargeted_keep_full_state():
    o = optimizer.get("galore-adamw")
    small = _t(64, 256, "k_proj")  # rank 128 > 64: r = 64, projected (64, 256), projection 64 x 64
    assert o.tensor_state(small, 2, "foreach", _galore()) == 2 * round_up(64 * 256 * 2) + round_up(64 * 64 * 2)
    head = _t(32000, 4096, "lm_head", "", "lm_head")  # not matched by attn, mlp: full AdamW state
    assert o.tensor_state(head, 2, "foreach", _galore()) == 2 * 32000 * 4096 * 2
    # all-linear takes every nn.Linear, lm_head too (trainer_optimizer.py:134, 140-147)
    assert optimizer.galore_targeted(head, ("all-linear",))
    assert optimizer.galore_targeted(_t(4096, 4096, "q_proj"), ("self_attn",))  # a substring of the path
    assert not optimizer.galore_targeted(_t(4096, 4096, "up_proj", "mlp"), ("attn",))


def round_up(n: int) -> int:
    return -(-n // 512) * 512


def test_galore_adafactor_works_in_fp32():
    # adafactor.py:178-179 upcasts a 16-bit gradient; its state is .to(grad): fp32 factored rows + cols of the
    # projected (4096, 128) gradient, and the fp32 projection keeps the whole 4096 x 4096 factor
    o = optimizer.get("galore-adafactor")
    setup = TrainingSetup(optimizer="galore_adafactor")
    assert o.tensor_state(_t(4096, 4096), 2, "foreach", setup) == 4096 * 4 + 512 + 4096 * 4096 * 4


def test_galore_projects_lora_adapters_as_the_trainer_does():
    # PEFT's lora_A / lora_B are nn.Linear under ...self_attn.q_proj: "attn" matches them (traced: qwen2.5-0.5b
    # LoRA r16 + GaLore all-linear rank 8, fp32, estimate within 0.02 % of the trace)
    a = Tensor("q_proj.lora_A", 16 * 896, 1, True, "adapter", 16, 896, "attn", "self_attn.q_proj.lora_A")
    assert optimizer.galore_targeted(a, ("attn",)) and not optimizer.galore_targeted(a, ("mlp",))


def test_galore_matches_the_family_module_names():
    # transformers' names: GPT-NeoX's attention is ``attention.query_key_value`` ("attn" is no substring of it),
    # GPT-2's matrices are Conv1D, which the Trainer skips (trainer_optimizer.py:143): nothing to project, refused
    from cabe.errors import InvalidValueError
    from cabe.parameters import parameter_tensors

    galore = dict(method="full", optimizer="galore_adamw", galore_targets=("attn", "mlp"))
    neox = parameter_tensors(preset("pythia-1.4b").spec, TrainingSetup(**galore))
    targeted = {t.path for t in neox if optimizer.galore_targeted(t, ("attn", "mlp"))}
    assert targeted == {"mlp.dense_h_to_4h", "mlp.dense_4h_to_h"}
    with pytest.raises(InvalidValueError) as err:
        estimate_model(preset("gpt2").spec, TrainingSetup(**galore))
    assert err.value.code == "galore_no_targets"


def test_galore_uses_less_state_than_adamw_on_llama_7b():
    spec = preset("llama-7b").spec
    adam = estimate_model(spec, TrainingSetup(optimizer="adamw")).components["optimizer"]
    galore = estimate_model(spec, _galore()).components["optimizer"]
    assert galore < adam / 5


def test_layerwise_galore_keeps_one_gradient_at_a_time():
    spec = preset("llama-7b").spec  # untied: embed_tokens and lm_head 32000 x 4096
    kw = dict(precision="bf16", checkpointing=True)
    whole = estimate_model(spec, TrainingSetup(optimizer="galore_adamw", **kw))
    r = estimate_model(spec, TrainingSetup(optimizer="galore_adamw_layerwise", **kw))
    # every bf16 gradient at the optimizer step: 6738415616 parameters x 2 B
    assert whole.peak_phase == "optimizer" and whole.components["gradients"] == 6738415616 * 2
    # layer-wise: one gradient at a time. The peak is the step of the last one made, the embedding's
    # (32000 x 4096 x 2 B, with the optimizer's temporaries), a few MB above a layer's backward moment, which
    # holds the layer's largest (gate/up/down 11008 x 4096 x 2 B)
    assert r.peak_phase == "optimizer" and r.components["gradients"] == 32000 * 4096 * 2
    assert whole.total_bytes - r.total_bytes > 6738415616 * 2 - 32000 * 4096 * 2 - 2**30
    assert r.components["optimizer"] == whole.components["optimizer"]  # the same state
    assert "optimizer_layerwise" in r.notes and "optimizer_modelled" in r.notes


@pytest.mark.parametrize(
    ("kw", "code"),
    [
        (dict(optimizer="galore_adamw_layerwise", grad_accum=2), "layerwise_no_grad_accum"),
        (dict(optimizer="galore_adamw_layerwise", gpus=2, shard="ddp"), "layerwise_single_gpu"),
        (dict(optimizer="galore_adamw", gpus=2, shard="zero3"), "galore_whole_weights"),
    ],
)
def test_galore_refusals(kw, code):
    with pytest.raises(InvalidValueError) as e:
        TrainingSetup(**kw)
    assert e.value.code == code


def test_modelled_entries_are_the_ones_without_a_trace_factory():
    modelled = {o.name for o in optimizer.REGISTRY if o.modelled}
    # torchao's step is torch.compile'd; GaLore's 8-bit AdamW hands bitsandbytes a tensor norm; the layer-wise
    # step runs inside backward hooks: modelled from their source. GaLore AdamW / Adafactor are traced.
    assert modelled == {
        "torchao-adamw-4bit",
        "adamw-torch-4bit",
        "adamw-torch-8bit",
        "adamw-fp8",
        "galore-adamw-8bit",
        "galore-adamw-layerwise",
        "galore-adamw-8bit-layerwise",
        "galore-adafactor-layerwise",
    }


def test_training_arguments_galore_keys():
    from cabe import configs

    data = {"optim": "galore_adamw_layerwise", "optim_target_modules": ["attn", "mlp"], "optim_args": "rank=64"}
    fields, used, ignored = configs.module("training_args").to_request(data)
    assert fields["optimizer"] == "galore-adamw-layerwise" and set(used) == set(data)
    assert (fields["galore_targets"], fields["galore_rank"]) == (("attn", "mlp"), 64)
    assert ignored == []


def test_galore_all_but_lm_head_is_llama_factorys_all():
    # LLaMA-Factory's galore_target "all": find_all_linear_modules, lm_head forbidden
    # (src/llamafactory/model/model_utils/misc.py:28-52); transformers' all-linear takes the lm_head too
    head = _t(32000, 4096, "lm_head", "", "lm_head")
    assert not optimizer.galore_targeted(head, (optimizer.ALL_BUT_HEAD,))
    assert optimizer.galore_targeted(_t(4096, 4096, "q_proj"), (optimizer.ALL_BUT_HEAD,))
    assert optimizer.galore_targeted(_t(4096, 11008, "up_proj", "mlp"), (optimizer.ALL_BUT_HEAD,))


def test_optimizer_in_backward_needs_one_gpu_and_no_accumulation():
    import pytest

    from cabe.errors import InvalidValueError
    from cabe.training import TrainingSetup

    for kw, code in (
        (dict(grad_accum=4), "in_backward_no_grad_accum"),
        (dict(gpus=2, shard="ddp"), "in_backward_single_gpu"),
    ):
        with pytest.raises(InvalidValueError) as e:
            TrainingSetup(method="full", optimizer_in_backward=True, **kw)
        assert e.value.code == code
    TrainingSetup(method="full", optimizer_in_backward=True)


def test_torchtune_optimizer_in_bwd_is_read():
    from pathlib import Path

    from cabe import configs

    path = Path(__file__).parent / "configs" / "files" / "torchtune_1B_full_single_device.yaml"
    combined = configs.from_files([str(path)])
    assert combined.request["optimizer_in_backward"] is True
    assert combined.request["optimizer"] == "paged-adamw-8bit"


def test_optimizer_in_backward_under_fp16_autocast_is_refused():
    import pytest

    from cabe.errors import InvalidValueError
    from cabe.training import TrainingSetup

    with pytest.raises(InvalidValueError) as e:
        TrainingSetup(method="lora", precision="fp16-amp", optimizer_in_backward=True)
    assert e.value.code == "in_backward_grad_scaler"
    TrainingSetup(method="lora", precision="bf16-amp", optimizer_in_backward=True)
