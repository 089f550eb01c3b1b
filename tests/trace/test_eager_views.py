"""Eager attention: what the two matmuls save, and in which dtype the softmax runs (issue 10, seed 1715652071's
rows and their neighbours), each held against the fake-tensor trace of the same request within 0.5%:

- ``torch.matmul`` folds (b, heads, s, d) into bmm's (b·heads, s, d) with ``reshape``: a view for one sequence, a
  compact copy for more. A v that is a slice of a fused qkv output is saved as that whole storage only at b = 1
  (phi-3-mini QLoRA eager b8 was +7.8% with the view at every batch, LoRA fp32 b1 -1.1% with the copy);
  one kv head expanded by ``repeat_kv`` stays a stride-0 view at b = 1 (starcoderbase QLoRA eager b1 +5.8%,
  with GPTBigCode's q, k and v all views of c_attn's output).
- gpt-oss's sink logits are concatenated in the sinks' dtype: bf16 weights under autocast keep a bf16 softmax
  (gpt-oss-20b prompt tuning, ``--dtype auto`` (bf16) ``--autocast bf16``, +12.6% when read as fp32), and fp16
  sinks with bf16 scores promote to fp32 (``--dtype fp16 --autocast bf16``: -14.2% when read as 16-bit).
- Falcon's eager softmax runs in the LayerNorm output's dtype, not fp32 cast back (falcon-7b LoRA bf16 eager
  +7.4% before); its multi-query k and v are copies (advanced indexing), not views of the fused output.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from conftest import fake_trace

from cabe import models
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup

pytestmark = [pytest.mark.trace, pytest.mark.slow]

EAGER = dict(attention="eager", seq=256, optimizer="sgd")
CASES = {
    "phi3-qlora-fused-v-b1": ("phi-3-mini", EAGER | dict(method="qlora", dtype="bf16", autocast="none", batch=1)),
    "phi3-qlora-fused-v-b2": ("phi-3-mini", EAGER | dict(method="qlora", dtype="bf16", autocast="none", batch=2)),
    "pythia-lora-fp32-b1": ("pythia-1.4b", EAGER | dict(method="lora", dtype="fp32", autocast="none", batch=1)),
    "starcoder-qlora-mqa-b1": (
        "starcoderbase-1b",
        EAGER | dict(method="qlora", dtype="fp16", autocast="none", batch=1),
    ),
    "starcoder-qlora-autocast-b1": (
        "starcoderbase-1b",
        EAGER | dict(method="qlora", dtype="bf16", autocast="bf16", batch=1),
    ),
    "gpt-oss-prompt-bf16-autocast": (
        "gpt-oss-20b",
        EAGER | dict(method="prompt-tuning", dtype="bf16", autocast="bf16", batch=1, prompt_tokens=20),
    ),
    "gpt-oss-prompt-fp16-under-bf16": (
        "gpt-oss-20b",
        EAGER | dict(method="prompt-tuning", dtype="fp16", autocast="bf16", batch=2, prompt_tokens=16),
    ),
    "falcon-lora-bf16-b2": ("falcon-7b", EAGER | dict(method="lora", dtype="bf16", autocast="none", batch=2)),
    "falcon-lora-fp32-b1": ("falcon-7b", EAGER | dict(method="lora", dtype="fp32", autocast="none", batch=1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_eager_attention_saves_what_the_trace_saves(case):
    name, kw = CASES[case]
    src = models.preset(name)
    setup = TrainingSetup(**kw)
    traced = fake_trace(src.config, setup)
    est = estimate_model(src.spec, setup).total_bytes
    assert abs(est - traced.peak_bytes) / traced.peak_bytes < 0.005, (est, traced.peak_bytes)
