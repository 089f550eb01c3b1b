"""The random differential benchmark of DeepSpeed ZeRO: cabe's per-GPU estimate against rank 0 of DeepSpeed's own
engine, traced on PyTorch's fake process group (``cabe.trace.zero``), on configurations nobody chose.

    PYTHONPATH=src /work/ds-venv/bin/python benchmarks/differential/zero.py -n 30          # a new seed
    PYTHONPATH=src /work/ds-venv/bin/python benchmarks/differential/zero.py -n 30 --seed 7 # reproduce a run
    PYTHONPATH=src /work/ds-venv/bin/python benchmarks/differential/zero.py --rescore 7    # its traces, today's estimate

Needs DeepSpeed (0.19.8 traced) in the interpreter that runs it. The sampler draws the stage (ZeRO-1, 2, 3), the
world size (2 to 64 GPUs), the model (tied and untied embeddings: gpt2, qwen2.5-0.5b, llama-3.2-1b, a 4-layer
llama-3.1-8b at its widths), the method (full, freeze, LoRA), the precision (DeepSpeed's bf16 mode: fp32 weights,
``param_dtype`` bf16; plain fp32; plain bf16), checkpointing, attention, batch and sequence, and the client optimizer's
implementation (torch's AdamW, fused or foreach: DeepSpeed's FusedAdam is a kernel a CPU build lacks). DeepSpeed's
defaults throughout (``reduce_bucket_size`` 5e8, ``stage3_max_reuse_distance`` 1e9...: cabe.parallel.ShardConfig).
What cabe or the trace refuses is drawn again. The seed is printed first and is new on every run unless given.

Writes ``results/results-<seed>-zero.json`` and ``.md`` and a row of the table of every run (``results/README.md``).
Target (issue 30): max |error| <= 3 %.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import multigpu  # this directory's multi-GPU benchmark: its runner and summary (report)
import run as single  # this directory's single-GPU benchmark: its models, runner and writers

from cabe.analytic import estimate_model
from cabe.errors import CabeError
from cabe.training import TrainingSetup

#: tied (gpt2, qwen2.5-0.5b, llama-3.2-1b) and untied (llama-3.1-8b-4l) embeddings
MODELS = ["gpt2", "qwen2.5-0.5b", "llama-3.2-1b", "llama-3.1-8b-4l"]
STAGES = ["zero1", "zero2", "zero3"]
WORLDS = [2, 4, 8, 16, 32, 64]
METHODS = [("full", 3), ("freeze", 1), ("lora", 2)]
#: (dtype, param_dtype): DeepSpeed's bf16 mode (fp32 master partitions of a bf16 module), plain fp32, plain bf16
PRECISIONS = [("fp32", "bf16"), ("fp32", "bf16"), ("fp32", "none"), ("bf16", "none")]


def sample(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """One configuration: a model name and the setup's keyword arguments."""
    model = rng.choice(MODELS)
    spec = single.source(model).spec
    method = single._weighted(rng, METHODS)
    dtype, param_dtype = rng.choice(PRECISIONS)
    kw: dict[str, Any] = {
        "method": method,
        "dtype": dtype,
        "autocast": "none",
        "param_dtype": param_dtype,
        "optimizer": "adamw",
        "optimizer_impl": rng.choice(["fused", "fused", "foreach"]),
        "shard": rng.choice(STAGES),
        "gpus": rng.choice(WORLDS),
        "checkpointing": rng.random() < 0.5,
        "attention": rng.choice(["sdpa", "sdpa", "eager"]),
        "batch": rng.choice([1, 1, 2, 4]),
        "seq": rng.choice([128, 256, 512, 1024]),
    }
    if method == "lora":
        kw["lora_rank"] = rng.choice([8, 16, 64])
        if rng.random() < 0.4:
            kw["lora_targets"] = ("all-linear",)
    if method == "freeze":
        kw["trainable_layers"] = rng.randint(1, spec.num_layers)
    return model, kw


def draw(seed: int, n: int) -> list[tuple[str, dict[str, Any]]]:
    """``n`` configurations cabe estimates and the fake group can trace, drawn from ``seed``."""
    from cabe.trace.distributed import refusal

    rng = random.Random(seed)
    out: list[tuple[str, dict[str, Any]]] = []
    while len(out) < n:
        model, kw = sample(rng)
        try:
            setup = TrainingSetup(**kw)
            refusal(setup, dict(single.source(model).config))
            estimate_model(single.source(model).spec, setup)
        except CabeError:
            continue
        out.append((model, kw))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--seed", type=int)
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("--rescore", type=int, metavar="SEED", help="re-estimate a run's recorded traces with today's code")
    args = ap.parse_args(argv)
    if args.rescore is not None:
        return multigpu.rescore(args.rescore, None, "-zero")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    print(f"seed {seed}", flush=True)
    configs = draw(seed, args.n)
    multigpu.report(configs, seed, args.jobs, "-zero")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
