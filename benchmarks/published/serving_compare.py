"""cabe's serving engines against the startup figures the engines printed (``serving.csv``), a peer beside them.

    PYTHONPATH=src .venv/bin/python benchmarks/published/serving_compare.py    # prints the table, writes serving.md

Each row of ``serving.csv`` is one figure of one run: the engine, the model (``cabe_model``: the preset with its
shapes), the card, the tensor-parallel degree, the settings the run states (``key=value;...``, passed to the engine
module: cabe.engines.vllm / sglang / llamacpp) and the metric. cabe's figure is the engine module's at those settings,
on the card of cabe's catalog. For the vLLM token count and SGLang's pool, cabe is also shown *given the measured
pool*, which isolates the allocator (groups, pages, blocks) from the budget's other terms.

The peer: cabe before issue 31 (``serving()`` in cabe.inference up to this branch: one vLLM-style pool, the profile
run as transformers' forward and 6 bytes per logit), reconstructed below for the vLLM rows; no estimator we know of
models SGLang's or llama.cpp's startup accounting, so those rows have none.

Every vLLM / SGLang / transformers row goes through ``cabe.inference.infer_json`` (what ``cabe infer --json`` answers),
with ``tp`` where the run used tensor parallelism: the engine then budgets the fullest GPU of the replica with its
share (``cabe.engines.share``: weights per rank, NCCL and custom all-reduce buffers). A row whose card is not named
is computed on ``HOST_GPU`` only where its figure does not depend on the card (weights, the KV bytes of one sequence,
the allocator given the measured pool). The peers: cabe before issue 31 (above) and llm-analysis's ``infer``
(``llm_analysis_serving.py``), each where it can express the row.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from cabe import gpus
from cabe.engines import llamacpp, vllm
from cabe.inference import forward_bytes, infer_json, logits_bytes
from cabe.models import from_mapping, preset
from cabe.weights import weights_bytes

HERE = Path(__file__).parent
CSV = HERE / "serving.csv"
OUT = HERE / "serving.md"
PEER_JSON = HERE / "llm_analysis_serving.json"
GIB, MIB = 1 << 30, 1 << 20
UNIT = {"GiB": GIB, "MiB": MIB, "GB": 1e9, "tokens": 1}
#: the row's settings that are request fields of ``cabe infer`` (cabe.schema); the rest are the engine module's
REQUEST_KEYS = (
    "context",
    "batch",
    "weights",
    "kv_dtype",
    "gpu_memory_utilization",
    "max_num_batched_tokens",
    "max_num_seqs",
    "mem_fraction_static",
)


def settings(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in filter(None, text.split(";")):
        k, v = part.split("=", 1)
        out[k] = float(v) if "." in v and v.replace(".", "").isdigit() else int(v) if v.isdigit() else v
    return out


def model_field(row: dict[str, str]) -> dict[str, Any]:
    """The request's model: a preset, or ``config:<file>`` (a config.json under configs/, its ``_source`` noted)."""
    name = row["cabe_model"]
    if name.startswith("config:"):
        cfg = json.loads((HERE / "configs" / name.removeprefix("config:")).read_text())
        cfg.pop("_source", None)
        return {"config": cfg}
    return {"model": name}


def spec_of(row: dict[str, str]) -> Any:
    m = model_field(row)
    return from_mapping(m["config"]).spec if "config" in m else preset(m["model"]).spec


def request(row: dict[str, str], kw: dict[str, Any]) -> dict[str, Any]:
    """The ``cabe infer --json`` request (``cabe.inference.infer_json``) of the row: model, card, engine, tp."""
    body: dict[str, Any] = {**model_field(row), **{k: kw[k] for k in REQUEST_KEYS if k in kw}}
    if row["engine"] != "hf":
        body["engine"] = row["engine"]
        body["gpu"] = row["cabe_gpu"] or HOST_GPU
    if int(row["tp"]) > 1:
        body["tp"] = int(row["tp"])
    return body


#: the card a request runs on where the row's figure does not depend on one (the row names none): weights, the KV
#: bytes of one sequence, the allocator given the measured pool
HOST_GPU = "h100-sxm"


def before(spec: Any, card: Any, kw: dict[str, Any], tp: int) -> dict[str, float]:
    """cabe's ``serving()`` before issue 31 (one pool; the HF forward at 8192 tokens + 6 B logits of 256 rows)."""
    w = weights_bytes(spec, kw.get("weights", "auto"), 128)["total_bytes"] / tp
    act = forward_bytes(spec, 8192) + logits_bytes(spec, 256)
    pool = kw.get("gpu_memory_utilization", 0.9) * card.memory_bytes - w - act - card.cuda_context_bytes
    per_token = 2 * max(1, spec.num_kv_heads // tp) * spec.head_dim * 2 * spec.attention_layers
    return {
        "weights": w,
        "activation_peak": act,
        "non_torch": card.cuda_context_bytes,
        "kv_cache": pool,
        "kv_cache_tokens": pool // (16 * per_token) * 16,
        "kv_per_sequence": per_token * kw.get("context", 4096),
    }


def llm_analysis_peer(row: dict[str, str]) -> float | None:
    """llm-analysis's inference figure for the row (``llm_analysis_serving.json``, from llm_analysis_serving.py)."""
    if not PEER_JSON.exists():
        return None
    return json.loads(PEER_JSON.read_text())["figures"].get(row["id"])


def cabe_figure(row: dict[str, str]) -> tuple[float | None, float | None, float | None, str]:
    """(cabe, cabe given the measured pool, cabe before issue 31, how) in the row's unit."""
    spec = spec_of(row)
    tp = int(row["tp"])
    kw = settings(row["settings"])
    metric, unit = row["metric"], UNIT[row["unit"]]
    figure: float | None
    given = peer = None
    out: dict[str, Any] = {}
    if row["engine"] in ("vllm", "sglang", "hf"):
        body = request(row, kw)
        shown = {k: (row["cabe_model"] if k == "config" else v) for k, v in body.items()}  # a config by its file
        how = f"infer_json({json.dumps(shown)})"
        out = infer_json(body)
    if row["engine"] == "hf":
        figure = out["total_bytes"]
    elif row["engine"] == "vllm":
        s = out["engine"]
        figure = {
            "weights": s["weights_bytes"],
            "non_torch": s["non_torch_bytes"],
            "activation_peak": s["activation_profile_bytes"],
            "kv_cache": s["kv_pool_bytes"],
            "kv_cache_tokens": s.get("kv_cache_tokens", 0),
            "kv_per_sequence": s.get("bytes_per_sequence"),
        }[metric]
        if not row["cabe_gpu"] and metric not in ("weights", "kv_per_sequence"):
            figure = None  # the card is not named: only the allocator given the measured pool
        if row["cabe_gpu"]:
            peer = before(spec, gpus.gpu(row["cabe_gpu"]), kw, tp)[metric]
        elif metric == "weights":
            peer = before(spec, gpus.gpu(HOST_GPU), kw, tp)[metric]
        if metric == "kv_cache_tokens":  # the allocator alone: the measured pool (the row's sibling) in blocks
            pool = _sibling(row, "kv_cache")
            if pool is not None:
                kinds = vllm.kv_kinds(spec, kw.get("kv_dtype", "fp16"), 16, tp)
                size, page = vllm.group_size(kinds), max(k.page for k in kinds)
                given = int(pool * GIB // page // size) // len(vllm.groups(kinds)) * 16
    elif row["engine"] == "sglang":
        s = out["engine"]
        figure = {"kv_cache_tokens": s["max_total_num_tokens"], "k_size": s["k_size_gib"] * GIB}[metric]
        if metric == "kv_cache_tokens":  # the measured K + V bytes in cells
            k_size = _sibling(row, "k_size")
            given = None if k_size is None else int(2 * k_size * GIB // s["cell_bytes"])
    else:
        card = gpus.gpu(row["cabe_gpu"])
        n_ctx = kw.pop("n_ctx", 4096)
        s = llamacpp.serving(spec, card, context=n_ctx, **kw)
        figure = {
            "model_buffer": s["model_buffer_bytes"],
            "compute_buffer": s["compute_buffer_bytes"],
            "kv_buffer_full": s["kv_buffer_full_bytes"],
            "kv_buffer_swa": s["kv_buffer_swa_bytes"],
            "file_size": s["file_bytes"],
        }[metric]
        how = f"llamacpp.serving(n_ctx={n_ctx}, {row['settings']})"

    def conv(x: float | None) -> float | None:
        return None if x is None else x / unit

    return conv(figure), conv(given) if metric != "kv_cache_tokens" else given, conv(peer), how


def _sibling(row: dict[str, str], metric: str) -> float | None:
    """The measured ``metric`` of the same run (the row id's prefix), None when the run did not log it."""
    prefix = row["id"].rsplit("-", 1)[0]
    for r in ROWS:
        if r["id"].startswith(prefix) and r["metric"] == metric:
            return float(r["measured"])
    return None


def err(x: float | None, measured: float) -> str:
    return "—" if x is None else f"{100 * (x - measured) / measured:+.1f}%"


def fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "—"
    return f"{x:,.0f}" if unit == "tokens" or x >= 1000 else f"{x:.2f}"


ROWS: list[dict[str, str]] = []

NOTES = (HERE / "serving_notes.md").read_text()


def main() -> int:
    ROWS.extend(csv.DictReader(CSV.open()))
    lines = [
        "# Serving: cabe against the engines' startup logs and transformers' generate peaks",
        "",
        "Generated by `PYTHONPATH=src .venv/bin/python benchmarks/published/serving_compare.py` from `serving.csv`"
        " (source, URL and setup per row there; the request of each row is listed at the end). *given pool*: cabe's"
        " allocator fed the measured pool. *cabe before*: cabe before issue 31 (one vLLM-style pool, transformers'"
        " forward as the profile). *llm-analysis*: `llm_analysis.analysis.infer` (0.2.2) where it can express the"
        " row (`llm_analysis_serving.py`, figures in `llm_analysis_serving.json`). Status `shown`: logged, not"
        " scored (see its notes).",
        "",
        "| row | engine | metric | measured | cabe | error | cabe given pool | error | cabe before | error |"
        " llm-analysis | error | status |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    scored: list[float] = []
    hows: list[str] = []
    for row in ROWS:
        measured = float(row["measured"])
        figure, given, peer, _how = cabe_figure(row)
        llma = llm_analysis_peer(row)
        llma = None if llma is None else llma / UNIT[row["unit"]]
        score = figure if figure is not None else given  # a row naming no card: the allocator given its pool
        if row["status"] == "compared" and score is not None:
            scored.append(abs(score - measured) / measured)
        hows.append(f"* `{row['id']}`: `{_how}`")
        lines.append(
            f"| {row['id']} | {row['engine']} {row['engine_version']} | {row['metric']} ({row['unit']}) | "
            f"{fmt(measured, row['unit'])} | {fmt(figure, row['unit'])} | {err(figure, measured)} | "
            f"{fmt(given, row['unit'])} | {err(given, measured)} | {fmt(peer, row['unit'])} | {err(peer, measured)} | "
            f"{fmt(llma, row['unit'])} | {err(llma, measured)} | "
            f"{row['status']} |"
        )
    lines += [
        "",
        f"Scored rows (status `compared`): {len(scored)}; median |error| {100 * statistics.median(scored):.1f}%, "
        f"largest {100 * max(scored):.1f}%.",
    ]
    lines += ["", NOTES, "## The requests", "", *hows]
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
