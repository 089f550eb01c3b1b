"""Speed of the analytic path: one estimate in process (target <= 100 µs) and the CLI's cold
start to an answer (target <= 0.3 s). Run: .venv/bin/python benchmarks/speed.py"""

import statistics
import subprocess
import sys
import time

from cabe.analytic import estimate_model
from cabe.models import preset
from cabe.training import TrainingSetup


def per_estimate_us(model: str, setup: TrainingSetup, n: int = 2000) -> float:
    spec = preset(model).spec
    estimate_model(spec, setup)
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            estimate_model(spec, setup)
        best.append((time.perf_counter() - t0) / n * 1e6)
    return min(best)


def cli_cold_start_s(runs: int = 7) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "cabe", "estimate", "--model", "llama-3.1-8b", "--method", "lora", "--json"],
            check=True,
            capture_output=True,
        )
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


if __name__ == "__main__":
    cases = [
        ("llama-3.1-8b", TrainingSetup(method="full", batch=4, seq=2048)),
        ("llama-3.1-8b", TrainingSetup(method="qlora", batch=4, seq=2048, checkpointing=True)),
        ("llama-3.1-405b", TrainingSetup(method="lora", precision="bf16", batch=1, seq=8192)),
    ]
    for model, setup in cases:
        print(
            f"estimate {model:<16} {setup.method:<6}: {per_estimate_us(model, setup):7.1f} µs per estimate (target <= 100)"
        )
    print(f"CLI cold start to JSON answer: {cli_cold_start_s():.3f} s median of 7 (target <= 0.3)")
