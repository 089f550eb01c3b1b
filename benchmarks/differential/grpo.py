"""The random differential benchmark of GRPO (issue 33): cabe's estimate of a GRPOTrainer step against the step run
with TRL's own code on fake CUDA tensors (``cabe.trace.grpo``: the rollout's no-grad log-probs, ``_compute_loss``
forward and backward, the optimizer; ``generate`` on the generation batch traced in its own run and joined as the
generation phase), on configurations nobody chose.

    PYTHONPATH=src .venv/bin/python benchmarks/differential/grpo.py -n 6 -j 1          # a new seed
    PYTHONPATH=src .venv/bin/python benchmarks/differential/grpo.py -n 6 --seed 7      # reproduce a run
    PYTHONPATH=src .venv/bin/python benchmarks/differential/grpo.py --rescore 7        # its traces, today's estimate

Needs TRL (1.16.0 traced) beside the trace's extra. The sampler draws the model (tied and untied embeddings), the
method (full, LoRA, freeze), the precision (bf16 weights, bf16 autocast over fp32 weights), checkpointing, the
micro-batch of completions, ``num_generations``, ``steps_per_generation`` or gradient accumulation, the prompt and
completion lengths and ``beta`` (0: no reference; > 0: a second model, or the adapter disabled). vLLM is not drawn: it
does not run on fake tensors (its phase is modelled from source). What cabe or the trace refuses is drawn again.

Writes ``results/results-<seed>-grpo.json`` and ``.md`` and a row of the table of every run (``results/README.md``).
Target: max |error| <= 3 %.
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
METHODS = [("full", 3), ("lora", 3), ("freeze", 1)]
#: (dtype, autocast): bf16 weights under the Trainer's bf16 (GRPOConfig's default bf16=True), fp32 weights under it
PRECISIONS = [("bf16", "bf16"), ("bf16", "bf16"), ("fp32", "bf16")]


def sample(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """One configuration: a model name and the setup's keyword arguments."""
    model = rng.choice(MODELS)
    spec = single.source(model).spec
    method = single._weighted(rng, METHODS)
    dtype, autocast = rng.choice(PRECISIONS)
    k = rng.choice([2, 4, 8])
    batch = rng.choice([1, 2, 4, 8])
    kw: dict[str, Any] = {
        "objective": "grpo",
        "method": method,
        "dtype": dtype,
        "autocast": autocast,
        "checkpointing": rng.random() < 0.5,
        "batch": batch,
        "num_generations": k,
        "prompt_length": rng.choice([32, 64, 128, 256]),
        "max_completion_length": rng.choice([32, 64, 128, 256]),
        "beta": rng.choice([0.0, 0.0, 0.04]),
    }
    kw["seq"] = kw["prompt_length"] + kw["max_completion_length"]  # (what the policy step runs; run.py's invariants)
    if rng.random() < 0.5:
        kw["grad_accum"] = rng.choice([1, 2, 4])
    else:
        kw["steps_per_generation"] = rng.choice([1, 2, 4])
    if method == "lora":
        kw["lora_rank"] = rng.choice([8, 16, 64])
    if method == "freeze":
        kw["trainable_layers"] = rng.randint(1, spec.num_layers)
    return model, kw


def draw(seed: int, n: int) -> list[tuple[str, dict[str, Any]]]:
    """``n`` configurations cabe estimates, drawn from ``seed`` (a generation batch of whole groups)."""
    rng = random.Random(seed)
    out: list[tuple[str, dict[str, Any]]] = []
    while len(out) < n:
        model, kw = sample(rng)
        try:
            estimate_model(single.source(model).spec, TrainingSetup(**kw))
        except CabeError:
            continue
        out.append((model, kw))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=6)
    ap.add_argument("--seed", type=int)
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("--rescore", type=int, metavar="SEED", help="re-estimate a run's recorded traces with today's code")
    args = ap.parse_args(argv)
    if args.rescore is not None:
        return multigpu.rescore(args.rescore, None, "-grpo")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    print(f"seed {seed}", flush=True)
    configs = draw(seed, args.n)
    multigpu.report(configs, seed, args.jobs, "-grpo")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
