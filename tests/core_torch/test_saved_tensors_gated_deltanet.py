"""cabe.activations held to PyTorch for Qwen3-Next's layers: a gated DeltaNet layer and a gated attention layer.

The tiny Qwen3-Next config (tests/configs/files/qwen3_next_tiny_config.json) runs for real on the CPU, with the
kernels users run on GPUs (flash-linear-attention's ``chunk_gated_delta_rule``, causal-conv1d) replaced by
cabe.trace.linear_attention's model of their allocations — what the fake-CUDA trace runs too; saved-tensor hooks
record the storages first saved in layers 2 (linear) and 3 (full attention), whose inputs carry gradients.
Constants that do not grow with tokens (``-exp(A_log)``, the (1 + w) of the norms, 16 to 512 B) are within the
tolerance of 0.1%.
"""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from cabe import families  # noqa: E402
from cabe.activations import layer_activations  # noqa: E402
from cabe.precision import dtypes_for  # noqa: E402
from cabe.trace import linear_attention  # noqa: E402
from cabe.training import TrainingSetup  # noqa: E402

from .saved_tensors import layer_saved_bytes  # noqa: E402

pytestmark = pytest.mark.trace

TINY = json.loads((Path(__file__).resolve().parents[1] / "configs/files/qwen3_next_tiny_config.json").read_text())
B, S = 2, 128
TARGETS = ("q_proj", "v_proj", "in_proj_qkvz", "out_proj")


class _Patch:
    def __init__(self) -> None:
        self.undo: list[tuple[object, str, object]] = []

    def set(self, obj: object, name: str, value: object) -> None:
        self.undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("layer_index", [2, 3])
def test_qwen3_next_layer_saved_bytes_match_pytorch(method, layer_index):
    transformers.logging.set_verbosity_error()
    p = _Patch()
    linear_attention.patch(p)
    try:
        cfg = transformers.AutoConfig.for_model(**TINY)
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        if method == "lora":
            model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(TARGETS)))
        model.train()
        ids = torch.randint(2, 1000, (B, S))
        measured = layer_saved_bytes(model, ids, layer_index=layer_index)
    finally:
        for obj, name, old in reversed(p.undo):
            setattr(obj, name, old)
    spec = families.from_config(TINY)
    setup = TrainingSetup(precision="bf16", method=method, batch=B, seq=S, attention="sdpa", lora_rank=4,
                          lora_targets=TARGETS)  # fmt: skip
    run = spec.runs[layer_index]  # the tiny config alternates linear and full layers: one run per layer
    assert run.mixer == ("gated_deltanet" if layer_index == 2 else "attention")
    la = layer_activations(spec, setup, dtypes_for(setup), base_trainable=method == "full", adapters=setup.adapters,
                           group=run)  # fmt: skip
    estimate = la.bytes_per_token * B * S + la.per_layer_bytes
    assert estimate == pytest.approx(measured, rel=1e-3)
