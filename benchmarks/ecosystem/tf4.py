"""The trace on transformers 4 (issue 29, item 2): builds a venv with the last 4.x release and traces a few tiny and
small models with ``cabe trace --json``, printing the traced peak against cabe's estimate (which models transformers 5).

    python benchmarks/ecosystem/tf4.py                 # builds .venv-tf4 (once), then traces
    python benchmarks/ecosystem/tf4.py --venv DIR --rebuild

The venv: ``pip install -e '.[trace]' torch==2.13.0 transformers==4.57.6`` (PEFT 0.21.2, accelerate 1.16.0 and
bitsandbytes 0.50.2 install with it). Families whose trace needs transformers 5 are refused in one sentence
(``trace_unsupported_transformers``): the MoE blocks' per-expert loop, granite's fused Mamba-2 call. Results and
commands: benchmarks/ecosystem/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRANSFORMERS = "4.57.6"
#: (name, model preset or tiny config, extra flags)
CASES = [
    ("llama-3.2-1b lora", "llama-3.2-1b", ["--method", "lora"]),
    ("llama-3.2-1b qlora", "llama-3.2-1b", ["--method", "qlora"]),
    ("qwen2.5-0.5b lora", "qwen2.5-0.5b", ["--method", "lora"]),
    ("qwen2.5-0.5b qlora", "qwen2.5-0.5b", ["--method", "qlora"]),
    ("qwen2.5-0.5b lora flash ckpt", "qwen2.5-0.5b", ["--method", "lora", "--attention", "flash", "--checkpointing"]),
    ("falcon-7b lora", "falcon-7b", ["--method", "lora"]),
    ("mixtral tiny lora", "tests/trace:mixtral", ["--method", "lora"]),
    ("mixtral tiny qlora", "tests/trace:mixtral", ["--method", "qlora"]),
]
COMMON = ["--batch", "1", "--seq", "256", "--json"]


def build(venv: Path, rebuild: bool) -> None:
    if rebuild or not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "-e", f"{ROOT}[trace]", "torch==2.13.0", f"transformers=={TRANSFORMERS}"], check=True)
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list"], capture_output=True, text=True, check=True
    ).stdout
    keep = ("torch ", "transformers ", "peft ", "bitsandbytes ", "accelerate ")
    print(" | ".join(" ".join(line.split()) for line in out.splitlines() if line.lower().startswith(keep)))


def model_arg(model: str, tmp: Path) -> str:
    if not model.startswith("tests/trace:"):
        return model
    sys.path.insert(0, str(ROOT / "tests" / "trace"))
    from configs import TINY

    path = tmp / f"{model.split(':')[1]}.json"
    path.write_text(json.dumps(TINY[model.split(":")[1]]))
    return str(path)


def trace(venv: Path, model: str, flags: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cmd = [str(venv / "bin" / "cabe"), "trace", "--model", model, *flags, *COMMON]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0:
        return {"refused": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv-tf4")
    ap.add_argument("--rebuild", action="store_true")
    args = ap.parse_args()
    build(args.venv, args.rebuild)
    tmp = ROOT / "artifacts" / "tf4"
    tmp.mkdir(parents=True, exist_ok=True)
    print(f"{'case':32} {'trace peak':>14} {'estimate':>14} {'error':>8}")
    for name, model, flags in CASES:
        out = trace(args.venv, model_arg(model, tmp), flags)
        if "refused" in out:
            print(f"{name:32} refused: {out['refused']}")
            continue
        peak, est = out["peak_bytes"], out.get("estimate_bytes")
        err = f"{(est - peak) / peak:+.2%}" if est else "-"
        print(f"{name:32} {peak:>14,} {est or 0:>14,} {err:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
