"""Speed and memory of a 70B-sized trace: ``python benchmarks/trace/speed.py``.

Traces one Llama-3.1-70B-shaped training step setup (hidden 8192, 80 layers, 64 heads, 8 KV
heads, FFN 28672, vocab 128256; batch 1 x seq 512, pure bf16, AdamW; two steps) on fake
tensors and prints the wall time and the process's peak RSS (``resource.getrusage``).
Target: <= 60 s and < 2 GiB RSS on a 2-core CPU machine.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

t_import = time.perf_counter()
from cabe.trace import trace_step  # noqa: E402
from cabe.training import TrainingSetup  # noqa: E402

LLAMA_70B = {
    "model_type": "llama",
    "hidden_size": 8192,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "intermediate_size": 28672,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}


def main() -> int:
    setup = TrainingSetup(batch=1, seq=512, precision="bf16")
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import transformers  # noqa: F401

    t1 = time.perf_counter()
    res = trace_step(LLAMA_70B, setup)
    t2 = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    out = {
        "parameters": res.parameters,
        "peak_gib": round(res.peak_bytes / 2**30, 2),
        "peak_phase": res.peak_phase,
        "trace_seconds": round(t2 - t1, 2),
        "import_seconds": round(t1 - t0 + (t0 - t_import), 2),
        "total_seconds": round(t2 - t_import, 2),
        "peak_rss_mib": round(rss / 2**20, 1),
        "events": res.events,
        "ok": (t2 - t_import) <= 60 and rss < 2 * 2**30,
    }
    print(
        f"70B trace: {out['trace_seconds']} s (+{out['import_seconds']} s imports), "
        f"peak RSS {out['peak_rss_mib']} MiB, predicted peak {out['peak_gib']} GiB ({out['peak_phase']}), "
        f"{out['events']} allocation events"
    )
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
