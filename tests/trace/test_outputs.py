"""The SVG timeline, the CLI glue, the layer inventory, the subprocess path, the GPU grid's dry run."""

import argparse
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe.trace import layer_inventory, trace_step
from cabe.trace.tracker import round_up
from cabe.training import TrainingSetup
from configs import TINY

pytestmark = pytest.mark.trace
ROOT = Path(__file__).resolve().parents[2]
LLAMA = TINY["llama"]


def test_plot_svg(tmp_path):
    from cabe.trace.plot import write_svg

    res = trace_step(LLAMA, TrainingSetup(batch=2, seq=64, precision="bf16-amp"))
    path = write_svg(res, str(tmp_path / "t.svg"), title="tiny llama")
    text = Path(path).read_text()
    root = ET.fromstring(text)  # well-formed XML
    assert root.tag.endswith("svg")
    assert "GiB" in text and "peak" in text and "step 2" in text
    for phase in ("forward", "backward", "optimizer"):
        assert phase in text


def test_cli_run_writes_files_and_returns_json(tmp_path):
    from cabe.trace import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        [
            "--timeline",
            str(tmp_path / "t.json"),
            "--plot",
            str(tmp_path / "t.svg"),
            "--inventory",
            "--expandable-segments",
        ]
    )
    out = cli.run(args, LLAMA, TrainingSetup(batch=1, seq=32, precision="bf16"))
    assert json.loads(json.dumps(out))["peak_bytes"] == out["peak_bytes"]
    assert out["reserved_bytes"] == out["reserved_bytes_expandable_segments"]
    assert json.loads((tmp_path / "t.json").read_text())["timeline"]
    assert (tmp_path / "t.svg").read_text().startswith("<svg")
    assert "total activation" in out["inventory_text"]


def test_inventory_llama_layer_matches_hand_count():
    b, s, h, f, nh = 2, 64, LLAMA["hidden_size"], LLAMA["intermediate_size"], LLAMA["num_attention_heads"]
    d = h // nh
    rows = layer_inventory(LLAMA, TrainingSetup(batch=b, seq=s, precision="bf16", attention="sdpa"))
    act = sum(r["bytes"] for r in rows if r["kind"] == "activation")
    r = round_up
    norm = r(b * s * h * 4) + r(b * s * 4) + r(b * s * h * 2)  # fp32 upcast, rsqrt, bf16 output
    attn = (
        r(b * s * h * 2)  # q/k/v input (the norm output, shared)
        + 2 * r(s * d * 2)  # cos, sin
        + 3 * r(b * s * h * 2)  # rotated q, k; v
        + r(b * nh * s * 4)  # flash logsumexp
        + r(b * s * h * 2)  # attention output (o_proj input)
        + 2 * 512
    )  # flash rng_state
    mlp = r(b * s * h * 2) + 4 * r(b * s * f * 2)  # input; gate, up, silu, down input
    assert act == 2 * norm + attn + mlp
    kinds = {row["kind"] for row in rows}
    assert kinds == {"activation", "parameter"}
    assert any("ScaledDotProductFlashAttention" in row["saved_by"] for row in rows)


def test_inventory_cli_prints_table():
    cfg = ROOT / "tests" / "trace" / "_llama_tiny.json"
    cfg.write_text(json.dumps(LLAMA))
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "cabe.trace.inventory",
                str(cfg),
                "--precision",
                "bf16",
                "--batch",
                "1",
                "--seq",
                "32",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
    finally:
        cfg.unlink()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "total activation" in proc.stdout and "self_attn.q_proj" in proc.stdout


def test_subprocess_path_equals_in_process():
    from cabe.trace.engine import TraceResult, _subprocess

    setup = TrainingSetup(batch=2, seq=32, precision="bf16-amp")
    sub = TraceResult.from_json(_subprocess("trace", LLAMA, setup, 2))
    assert sub.peak_bytes == trace_step(LLAMA, setup).peak_bytes
    assert sub.mode == "fake"


def test_gpu_grid_dry_run():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu" / "run_grid.py"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "configurations built; stopping before CUDA" in proc.stdout
    assert proc.stdout.count("built:") >= 12
