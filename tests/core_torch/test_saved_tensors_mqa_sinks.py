"""cabe.activations held to PyTorch for GPTBigCode (multi-query attention) and gpt-oss (attention sinks,
clamped-SwiGLU experts with biases): the bytes autograd saves in decoder layer 1 of tiny models run on the
CPU (see test_saved_tensors.py for the method).

GPTBigCode runs in fp32 and under bf16 autocast only: in pure bf16 the CPU LayerNorm keeps bf16 mean and
rstd where CUDA keeps fp32 (8 B per token fewer over two norms, as for the other LayerNorm families).
gpt-oss runs eager attention (transformers has no SDPA path for it: sinks), on which the CPU and CUDA
save the same tensors.
"""

import contextlib

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from cabe import families  # noqa: E402
from cabe.activations import layer_activations  # noqa: E402
from cabe.facts import sdpa_gqa_math  # noqa: E402
from cabe.precision import dtypes_for  # noqa: E402
from cabe.training import TrainingSetup  # noqa: E402
from cabe.units import round_alloc  # noqa: E402

from .saved_tensors import layer_saved_bytes  # noqa: E402

pytestmark = pytest.mark.trace

B, S = 2, 24
CONFIGS = {
    # dropout off: on the CPU dropout saves a float mask where CUDA's fused kernel saves 1 byte
    "gpt_bigcode": dict(
        n_embd=64, n_head=4, n_layer=3, n_inner=176, vocab_size=1000, n_positions=64, multi_query=True,
        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=1, eos_token_id=1,
    ),
    "gpt_bigcode:mha": dict(
        n_embd=64, n_head=4, n_layer=3, n_inner=176, vocab_size=1000, n_positions=64, multi_query=False,
        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=1, eos_token_id=1,
    ),
    # two sliding layers around a full one; layer 1 (measured) is the full-attention one
    "gpt_oss": dict(
        hidden_size=64, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=1000, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        pad_token_id=0, eos_token_id=1, bos_token_id=1,
    ),
}  # fmt: skip
CONFIGS["gpt_bigcode:proj"] = CONFIGS["gpt_bigcode"]
# gpt_bigcode:proj: the output and down projections (attn.c_proj, mlp.c_proj), whose lora_A output lora_B saves
TARGETS = {"gpt_bigcode": ("c_attn",), "gpt_bigcode:proj": ("c_proj",), "gpt_oss": ("q_proj", "v_proj")}


def _measure(case: str, precision: str, method: str, attention: str) -> tuple[int, int, int]:
    """(measured bytes, cabe's bytes, experts) of layer 1."""
    transformers.logging.set_verbosity_error()
    model_type = case.split(":")[0]
    cfg = transformers.AutoConfig.for_model(model_type, **CONFIGS[case])
    cfg._attn_implementation = attention
    cfg.use_cache = False  # as training runs it (the trace passes use_cache=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    targets = TARGETS.get(case, TARGETS[model_type])
    if method == "lora":
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(targets)))
    model.train()
    ids = torch.randint(2, 1000, (B, S))
    spec = families.from_config(cfg.to_dict())
    setup = TrainingSetup(
        precision=precision, method=method, batch=B, seq=S, attention=attention, lora_rank=4, lora_targets=targets
    )
    kernel = contextlib.nullcontext()
    if sdpa_gqa_math(spec, setup, dtypes_for(setup).compute):  # the kernel CUDA runs (see test_saved_tensors.py)
        kernel = torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH)
    with kernel:
        measured = layer_saved_bytes(model, ids, amp=precision == "bf16-amp")
    la = layer_activations(
        spec, setup, dtypes_for(setup), base_trainable=method == "full", adapters=method == "lora", group=spec.runs[0]
    )
    return measured, la.bytes_per_token * B * S + la.per_layer_bytes, spec.num_experts


CASES = [
    (case, p, m, a)
    for case in ("gpt_bigcode", "gpt_bigcode:mha")
    for p in ("fp32", "bf16-amp")
    for m in ("full", "lora")
    for a in ("eager", "sdpa")
] + [("gpt_oss", p, m, "eager") for p in ("bf16", "fp32", "bf16-amp") for m in ("full", "lora")]
CASES += [("gpt_bigcode:proj", p, "lora", a) for p in ("fp32", "bf16-amp") for a in ("eager", "sdpa")]


@pytest.mark.parametrize("case,precision,method,attention", CASES)
def test_layer_saved_bytes_match_pytorch(case, precision, method, attention):
    measured, cabe, experts = _measure(case, precision, method, attention)
    # the MoE's int32 offsets over the experts: 4·E bytes on the CPU, one 512-byte block of CUDA's allocator
    offsets = round_alloc(4 * experts) - 4 * experts if experts else 0
    assert cabe == measured + offsets, (measured, cabe)
