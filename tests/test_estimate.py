"""Architecture-mode estimates: hand-checked breakdowns and properties."""

from hypothesis import given, settings
from hypothesis import strategies as st

from cabe.analytic import estimate_model
from cabe.errors import InvalidValueError
from cabe.models import preset
from cabe.training import TrainingSetup
from cabe.units import GiB

LLAMA7 = preset("llama-7b").spec


def test_llama7b_fp32_foreach_adamw_is_20_bytes_per_param_at_the_step():
    # 4 (weights) + 4 (grads) + 8 (Adam) + 4 (foreach sqrt copy) per parameter, each tensor rounded to
    # 512 B (125.51 GiB, the fake-tensor trace of benchmarks/trace/notes.md), + cuBLAS's two 32 MiB
    # workspaces (cabe.units.CUDA_WORKSPACES, measured on an H200): 125.5130 + 0.0625 = 125.58 GiB.
    r = estimate_model(LLAMA7, TrainingSetup(precision="fp32", batch=4, seq=512))
    assert r.peak_phase == "optimizer"
    assert r.components["weights"] == r.components["gradients"] == 4 * 6_738_415_616
    assert r.components["optimizer"] == 8 * 6_738_415_616
    assert r.components["optimizer_temporaries"] == 4 * 6_738_415_616
    assert r.components["cuda_workspaces"] == 2 * 32 * 2**20
    assert round(r.total_bytes / GiB, 2) == 125.58


def test_fused_adamw_has_no_temporaries():
    r = estimate_model(LLAMA7, TrainingSetup(precision="fp32", optimizer_impl="fused", batch=1, seq=128))
    assert r.components.get("optimizer_temporaries", 0) == 0


def test_pure_bf16_model_states_are_8_bytes_per_param():
    r = estimate_model(LLAMA7, TrainingSetup(precision="bf16", optimizer_impl="fused", batch=1, seq=16))
    assert r.components["weights"] == 2 * 6_738_415_616
    assert r.components["optimizer"] >= 4 * 6_738_415_616


def test_llama_layer_activation_terms_per_token_bf16_flash():
    # Hand count for one Llama layer in pure bf16 with flash attention (bytes per token):
    # two RMSNorms 2 × (4h + 4 + 2h + 2h), q 2q, k 2kv, v 2kv, out 2q, lse 4·nh, SwiGLU 4 × 2f
    from cabe.activations import layer_activations
    from cabe.precision import dtypes_for

    s = TrainingSetup(precision="bf16")
    la = layer_activations(LLAMA7, s, dtypes_for(s), base_trainable=True, adapters=False)
    h, f, nh = 4096, 11008, 32
    expected = 2 * (8 * h + 4) + 2 * h + 2 * h + 2 * h + 2 * h + 4 * nh + 8 * f
    assert la.bytes_per_token == expected


def test_components_sum_to_total_and_names():
    r = estimate_model(LLAMA7, TrainingSetup(method="lora", batch=2, seq=256))
    assert sum(r.components.values()) == r.total_bytes
    for k in ("weights", "gradients", "optimizer", "activations"):
        assert k in r.components


def test_lora_parameters_llama7b_r8_qv():
    r = estimate_model(LLAMA7, TrainingSetup(method="lora", lora_rank=8, lora_targets=("q_proj", "v_proj")))
    assert r.trainable_parameters == 32 * 2 * 8 * (4096 + 4096)  # 4,194,304 as PEFT prints


def test_qlora_weights_use_nf4_double_quant_storage():
    r = estimate_model(LLAMA7, TrainingSetup(method="qlora", batch=1, seq=16))
    quantized = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    per_param = 0.5 + 1 / 64 + 4 / (64 * 256)
    dense = (
        2 * 32000 * 4096 * 4 + 65 * 4096 * 4
    )  # embeddings + lm_head + norms, fp32 after prepare_model_for_kbit_training
    adapters = 4_194_304 * 4  # LoRA r8 on q, v in fp32
    # 224 quantized tensors each carry a 1 KiB nested code + 64 B code book + rounding
    assert abs(r.components["weights"] - (quantized * per_param + dense + adapters)) < 224 * 4096


SETUPS = st.fixed_dictionaries(
    {
        "method": st.sampled_from(["full", "lora", "qlora", "freeze", "prompt-tuning"]),
        "precision": st.sampled_from(["fp32", "bf16-amp", "bf16"]),
        "optimizer": st.sampled_from(["adamw", "adamw-8bit", "sgd-momentum", "lion", "adafactor"]),
        "checkpointing": st.booleans(),
        "attention": st.sampled_from(["eager", "sdpa", "flash"]),
    }
)
MODELS = st.sampled_from(["llama-3.2-1b", "gpt2", "qwen2.5-0.5b", "gemma-2-2b", "phi-3-mini", "pythia-1.4b"])


@settings(max_examples=60, deadline=None)
@given(SETUPS, MODELS, st.integers(1, 8), st.integers(16, 4096))
def test_memory_never_falls_as_batch_or_sequence_grows(kw, model, batch, seq):
    spec = preset(model).spec
    try:
        a = estimate_model(spec, TrainingSetup(batch=batch, seq=seq, **kw))
    except InvalidValueError as e:  # a combination cabe refuses (flash on fp32 without autocast)
        assert e.code == "flash_needs_16bit"
        return
    b = estimate_model(spec, TrainingSetup(batch=batch + 1, seq=seq, **kw))
    c = estimate_model(spec, TrainingSetup(batch=batch, seq=seq * 2, **kw))
    assert b.total_bytes >= a.total_bytes
    assert c.total_bytes >= a.total_bytes
    assert sum(a.components.values()) == a.total_bytes


@settings(max_examples=40, deadline=None)
@given(MODELS, st.integers(1, 8), st.integers(16, 4096), st.sampled_from(["bf16-amp", "bf16"]))
def test_method_ordering(model, batch, seq, precision):
    spec = preset(model).spec
    common = dict(batch=batch, seq=seq, precision=precision)
    full_r = estimate_model(spec, TrainingSetup(method="full", **common))
    full = full_r.total_bytes
    lora = estimate_model(spec, TrainingSetup(method="lora", **common)).total_bytes
    qlora_r = estimate_model(spec, TrainingSetup(method="qlora", **common))
    lora_r = estimate_model(spec, TrainingSetup(method="lora", **common))
    # LoRA <= full while model states dominate. PEFT keeps adapters in fp32, so each adapted linear saves an
    # fp32 cast of its input: with all-linear targets (Phi-3's default) and huge batch × sequence, LoRA's
    # activations outgrow full fine-tuning's 16-bit ones (the trace agrees on the per-layer inventory).
    states = sum(full_r.components.get(k, 0) for k in ("weights", "gradients", "optimizer"))
    if states >= full_r.components["activations"] + full_r.components.get("logits", 0):
        assert lora <= full
    # QLoRA keeps embeddings (and the residual stream) in fp32 after prepare_model_for_kbit_training:
    # on small models with large vocabularies that outweighs the 4-bit savings on the layers.
    if spec.quantizable_count > 4 * spec.embedding_count:
        assert qlora_r.components["weights"] <= lora_r.components["weights"]
    # In total, QLoRA <= LoRA only while the weights dominate: under the Trainer's autocast, QLoRA's fp32
    # residual stream and fp32 Linear4bit outputs make its activations larger than bf16 LoRA's (the trace
    # agrees), so at long sequences QLoRA can need more memory than LoRA on a bf16 base.
    big_layers = spec.quantizable_count > 4 * spec.embedding_count
    per_token = lora_r.components["activations"] + lora_r.components.get("logits", 0)
    if big_layers and lora_r.components["weights"] > 4 * per_token:
        assert qlora_r.total_bytes <= lora_r.total_bytes
    ck = estimate_model(spec, TrainingSetup(method="full", checkpointing=True, **common)).total_bytes
    assert ck <= full
    lck = estimate_model(spec, TrainingSetup(method="lora", checkpointing=True, **common)).total_bytes
    assert lck <= lora


def test_grad_accumulation_keeps_gradients_during_forward():
    one = estimate_model(LLAMA7, TrainingSetup(precision="bf16", batch=4, seq=1024))
    acc = estimate_model(LLAMA7, TrainingSetup(precision="bf16", batch=4, seq=1024, grad_accum=8))
    assert acc.total_bytes >= one.total_bytes
    assert acc.setup["effective_batch"] == 32


def test_korthikanti_undercounts_llama():
    from cabe.activations import korthikanti, layer_activations
    from cabe.precision import dtypes_for

    s = TrainingSetup(precision="bf16", attention="flash", batch=4, seq=512)
    ours = layer_activations(LLAMA7, s, dtypes_for(s), base_trainable=True, adapters=False).bytes_per_token * 2048
    textbook = korthikanti(LLAMA7, s)
    # flash: no 5as/h term really saved; the textbook counts 34·sbh — about 25-45% under ours
    assert 0.25 < 1 - (textbook - 5 * 4 * 512 * 32 * 512) / ours < 0.45 or textbook < ours


def test_setup_accepts_targets_as_list_string_or_tuple():
    a = TrainingSetup(method="lora", lora_targets=["q_proj", "v_proj"])
    b = TrainingSetup(method="lora", lora_targets="q_proj,v_proj")
    assert a == b == TrainingSetup(method="lora", lora_targets=("q_proj", "v_proj"))
    assert estimate_model(LLAMA7, a).total_bytes == estimate_model(LLAMA7, b).total_bytes
