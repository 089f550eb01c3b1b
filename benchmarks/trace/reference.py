"""Reference figures: ``python benchmarks/trace/reference.py`` (LLaMA-7B, batch 4 x seq 512, 2 steps).

Prints, for each setup, the steady-state (step 2) peak of allocated memory, the step-1 peak,
the predicted reserved memory, and the components at the peak, in GiB -- next to the figures
in benchmarks/trace/notes.md where there is one.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from cabe.trace import trace_step
from cabe.training import TrainingSetup

LLAMA_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
QV = ("q_proj", "v_proj")
G = 2**30

CASES = [
    ("(a) fp32 + AdamW foreach", dict(precision="fp32", optimizer_impl="foreach"), "125.51"),
    (
        "(b) bf16-amp, fused AdamW",
        dict(precision="bf16-amp", optimizer_impl="fused"),
        "100.41 (step 1) / 102.31 (step 2)",
    ),
    ("(c) pure bf16, flash, fused", dict(precision="bf16", attention="flash", optimizer_impl="fused"), "50.21 / 50.31"),
    ("(d) LoRA r8 q,v, bf16 base", dict(method="lora", precision="bf16", lora_targets=QV), "23.34"),
    (
        "(d) LoRA r8 q,v, bf16 base, ckpt",
        dict(method="lora", precision="bf16", lora_targets=QV, checkpointing=True),
        "13.83",
    ),
    ("(e) QLoRA nf4, bf16-amp", dict(method="qlora", lora_targets=QV), "14.30"),
    ("(e) QLoRA nf4, bf16-amp, ckpt", dict(method="qlora", lora_targets=QV, checkpointing=True), "4.78"),
    ("(e') QLoRA nf4, no autocast (bf16)", dict(method="qlora", precision="bf16", lora_targets=QV), "-"),
]


def main() -> int:
    print(
        f"{'setup':<38} {'peak':>8} {'step1':>8} {'reserved':>9} {'phase':<9} {'notes file':<34} components at the peak"
    )
    for name, kw, notes in CASES:
        r = trace_step(LLAMA_7B, TrainingSetup(batch=4, seq=512, **kw))
        comps = ", ".join(f"{k} {v / G:.2f}" for k, v in r.components.items() if v >= 2**20)
        print(
            f"{name:<38} {r.peak_bytes / G:8.2f} {r.first_step_peak_bytes / G:8.2f} {r.reserved_bytes / G:9.2f} "
            f"{r.peak_phase:<9} {notes:<34} {comps}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
