"""Time per solve (target: milliseconds). Run: python benchmarks/solver.py"""

from __future__ import annotations

import statistics
import time

from cabe import gpus, inference, solver
from cabe.models import preset
from cabe.training import TrainingSetup

CASES = [
    (
        "llama-3.1-8b",
        "lora bf16 ckpt b4 s2048, 1×RTX 4090",
        TrainingSetup(method="lora", precision="bf16", batch=4, seq=2048, checkpointing=True),
        "rtx-4090",
    ),
    ("llama-3.1-8b", "full b4 s2048, 1×RTX 4090", TrainingSetup(batch=4, seq=2048), "rtx-4090"),
    (
        "llama-3.1-70b",
        "full ckpt, 16×A100 ZeRO-3",
        TrainingSetup(batch=1, seq=4096, checkpointing=True, gpus=16, shard="zero3"),
        "a100-80gb",
    ),
    (
        "llama-3.1-70b",
        "qlora ckpt b1 s2048, 1×H100",
        TrainingSetup(method="qlora", batch=1, seq=2048, checkpointing=True),
        "h100-80gb",
    ),
]


def bench(fn, repeat: int = 20) -> float:
    fn()  # warm caches
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    print(f"{'case':<42} {'solve':<8} {'ms (median)':>12}")
    for model, label, setup, card_name in CASES:
        spec, card = preset(model).spec, gpus.gpu(card_name)
        for what in ("batch", "seq", "gpus", "changes"):
            ms = bench(lambda spec=spec, setup=setup, card=card, what=what: solver.solve(spec, setup, card, (what,)))
            print(f"{label:<42} {what:<8} {ms:>12.2f}")
    spec, card = preset("llama-3.1-8b").spec, gpus.gpu("rtx-4090")
    print(
        f"{'llama-3.1-8b nf4 inference, RTX 4090':<42} {'context':<8} "
        f"{bench(lambda: inference.max_context(spec, card, weights='nf4')):>12.2f}"
    )
    print(
        f"{'llama-3.1-8b nf4 inference, RTX 4090':<42} {'batch':<8} "
        f"{bench(lambda: inference.max_batch(spec, card, weights='nf4')):>12.2f}"
    )
    print(
        f"{'llama-3.1-8b fp16 serving, A100 80GB':<42} {'serving':<8} "
        f"{bench(lambda: inference.serving(spec, gpus.gpu('a100-80gb'), context=8192)):>12.2f}"
    )


if __name__ == "__main__":
    main()
