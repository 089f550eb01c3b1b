"""fp8 training (cabe.fp8): the recipes' mechanisms as arithmetic, the weight copies and saved inputs they change,
the refusals (methods, dtypes, plans, cards) and accelerate's fp8 config. The trace of torchao's recipes is
tests/trace/test_fp8_trace.py."""

import pytest

from cabe import fp8, gpus, schema
from cabe.activations import layer_activations
from cabe.analytic import estimate_model
from cabe.analytic.states import _weight_copies
from cabe.errors import InvalidValueError
from cabe.models import preset
from cabe.precision import dtypes_for
from cabe.training import TrainingSetup

LLAMA7 = preset("llama-7b").spec  # h 4096, f 11008, 32 layers, vocab 32000
# one layer's matrices: q, k, v, o (4096²) and gate, up, down (4096 × 11008)
LAYER_PARAMS = 4 * 4096 * 4096 + 3 * 4096 * 11008


def test_schema_field_and_choices():
    f = schema.field("fp8")
    assert f.default == "none" and f.choices == fp8.RECIPES
    assert "from-config" in f.commands and "api.estimate" in f.commands and "trace" in f.commands


def test_cast_and_backward_moment_arithmetic():
    # tensorwise, down_proj of llama-7b (i = f = 11008, o = h = 4096), 2048 tokens, bf16 (a = ρ = 2):
    # casts: T·(2ρo + a·i + 2·o + 9·i) + P; the weight's cast before them: T·(2ρo + o) + 9·P
    t, i, o, p = 2048, 11008, 4096, 11008 * 4096
    casts = t * (2 * 2 * o + 2 * i + 2 * o + 9 * i) + p
    weight = t * (2 * 2 * o + o) + 9 * p
    # 2048·145664 + 45088768 = 343408640 < 2048·20480 + 9·45088768 = 447741952: at 2048 tokens the weight's cast
    assert casts == 343_408_640 and weight == 447_741_952
    assert fp8.torchao_backward_moment("tensorwise", i, o, p, t, 2, 2) == weight
    # rowwise-gw-hp: grad_weight in high precision; grad_input's fp32 post-scale (4·i), grad_output fp8 (o), 2·P
    assert fp8.torchao_backward_moment("rowwise-gw-hp", i, o, p, t, 2, 2) == t * (4 * o + 2 * i + 4 * i + o) + 2 * p
    # forward: the input's cast (9·i·T) or the fp8 input and the weight's cast (i·T + 9·P)
    # 9·11008·2048 = 202899456 < 22544384 + 405798912 = 428343296
    assert fp8.torchao_forward_moment("tensorwise", i, p, t) == i * t + 9 * p == 428_343_296
    assert fp8.torchao_forward_moment("tensorwise", i, p, 16 * t) == 9 * i * 16 * t  # more tokens: the input's


def test_torchao_drops_autocast_weight_copies_te_saves_fp8_weights():
    base = TrainingSetup(precision="bf16-amp", batch=1, seq=512)
    dt = dtypes_for(base)
    # autocast's bf16 copies of the seven matrices: 2 bytes each (512-byte blocks: every size here is a multiple)
    assert _weight_copies(LLAMA7, base, dt).layer == 2 * LAYER_PARAMS == 404_750_336
    ao = base.with_(fp8="tensorwise")
    assert _weight_copies(LLAMA7, ao, dtypes_for(ao)).layer == 0  # Float8Linear casts only its input
    te = base.with_(fp8="te-delayed")
    assert _weight_copies(LLAMA7, te, dtypes_for(te)).layer == 2 * LAYER_PARAMS  # fp8 row-wise + its transpose
    mx = base.with_(fp8="te-mxfp8")
    mx_bytes = sum(2 * n + 2 * (n // 32) for n in [4096 * 4096] * 4 + [4096 * 11008] * 3)
    assert _weight_copies(LLAMA7, mx, dtypes_for(mx)).layer == mx_bytes
    # TE saves its fp8 weight without autocast too (pure bf16)
    pure = TrainingSetup(precision="bf16", fp8="te-current", batch=1, seq=512)
    assert _weight_copies(LLAMA7, pure, dtypes_for(pure)).layer == 2 * LAYER_PARAMS


def test_te_saves_fp8_inputs_torchao_saves_high_precision_ones():
    def terms(recipe):
        s = TrainingSetup(precision="bf16", attention="flash", batch=1, seq=512, fp8=recipe)
        acts = layer_activations(LLAMA7, s, dtypes_for(s), base_trainable=True, adapters=False)
        return {t.name: t.bytes_per_token for t in acts.terms}

    none, ao, te = terms("none"), terms("tensorwise"), terms("te-delayed")
    assert ao == none  # ctx.save_for_backward(input_hp, weight_hp_t): what nn.Linear saves
    assert "mlp.product" in none and "mlp.product" not in te
    assert te["mlp.down_proj.input_fp8"] == 11008  # 1 byte per element, column-wise
    assert te["attn.q_proj.input_fp8"] == te["mlp.gate_proj.input_fp8"] == 4096
    assert sum(te.values()) < sum(none.values())


def test_torchao_moves_the_peak_into_the_mlp_backward():
    s = TrainingSetup(precision="bf16", attention="flash", batch=1, seq=2048)
    none, ao = estimate_model(LLAMA7, s), estimate_model(LLAMA7, s.with_(fp8="tensorwise"))
    # (the step's peak is AdamW's here, unchanged; the backward's own peak grows by the casts' moment)
    assert ao.phase_peaks["backward"] > none.phase_peaks["backward"]
    assert ao.phase_peaks["optimizer"] == none.phase_peaks["optimizer"]
    assert "fp8_torchao" in ao.notes


@pytest.mark.parametrize(
    "kw, code",
    [
        (dict(method="lora"), "fp8_method"),
        (dict(method="qlora"), "fp8_method"),
        (dict(method="prompt-tuning"), "fp8_method"),
        (dict(precision="fp16-amp"), "fp8_fp16"),
        (dict(dtype="fp16", autocast="none"), "fp8_fp16"),
        (dict(gpus=2, shard="fsdp"), "fp8_distributed"),
    ],
)
def test_refusals(kw, code):
    with pytest.raises(InvalidValueError) as e:
        TrainingSetup(fp8="tensorwise", **kw)
    assert e.value.code == code and e.value.field == "fp8"


@pytest.mark.parametrize(
    "card, recipe, code",
    [
        ("a100-80gb-sxm", "tensorwise", "fp8_card"),  # sm 8.0: no fp8 tensor cores
        ("h100-sxm", "te-mxfp8", "fp8_card"),  # MXFP8 needs 10.x
        ("rtx-5090", "te-mxfp8", "fp8_card"),  # 12.0: TE's _compute_mxfp8_support says no
        ("mi300x", "te-delayed", "fp8_card_vendor"),
    ],
)
def test_cards_that_cannot(card, recipe, code):
    with pytest.raises(InvalidValueError) as e:
        gpus.check_fp8(gpus.gpu(card), recipe)
    assert e.value.code == code


@pytest.mark.parametrize(
    "card, recipe", [("h100-sxm", "te-delayed"), ("l4", "tensorwise"), ("b200", "te-mxfp8"), ("mi300x", "rowwise")]
)
def test_cards_that_can(card, recipe):
    gpus.check_fp8(gpus.gpu(card), recipe)


def test_fits_on_lists_only_cards_that_run_the_recipe():
    r = estimate_model(LLAMA7, TrainingSetup(precision="bf16", batch=1, seq=256, fp8="te-mxfp8"))
    cards = gpus.fits_on(r)
    assert cards and all((10, 0) <= gpus.gpu(c).compute_capability < (12, 0) for c in cards)


def test_api_refuses_a_card_without_fp8():
    from cabe import api

    with pytest.raises(InvalidValueError) as e:
        api.build({"model": "llama-7b", "precision": "bf16", "fp8": "rowwise", "gpu": "a100-80gb-sxm"})
    assert e.value.code == "fp8_card"


def test_accelerate_fp8_config(tmp_path):
    from cabe.configs import accelerate
    from cabe.configs._base import Collector

    def read(block):
        c = Collector()
        data = {"mixed_precision": "fp8", **({"fp8_config": block} if block is not None else {})}
        for k, v in data.items():
            accelerate.HANDLERS[k](c, k, v, data)
        return c.fields

    # accelerator.py:572-573 bf16 autocast for fp8; AO (or no backend, torchao installed) is tensorwise
    assert read(None) == {"precision": "bf16-amp", "fp8": "tensorwise"}
    assert read({"backend": "TE"})["fp8"] == "te-delayed"
    assert read({"backend": "TE", "use_mxfp8_block_scaling": True})["fp8"] == "te-mxfp8"


@pytest.mark.parametrize("recipe", ["tensorwise", "te-delayed"])
def test_falcon_parallel_block_refused(recipe):
    # modeling_falcon.py:432-433 ``mlp_output += attention_output`` on the fp8 linear's view output (traced: autograd's
    # "Output 0 of matmul_with_hp_or_float8_args is a view and is being modified inplace", differential seed 733034)
    with pytest.raises(InvalidValueError) as e:
        estimate_model(preset("falcon-7b").spec, TrainingSetup(precision="bf16", fp8=recipe, batch=1, seq=128))
    assert e.value.code == "fp8_inplace_output"
