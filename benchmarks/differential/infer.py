"""The random differential benchmark of inference: ``cabe infer``'s analytic peak of transformers' ``generate``
against that ``generate`` run on fake CUDA tensors (``cabe infer --trace``: :mod:`cabe.trace.generate`), on
configurations nobody chose.

    .venv/bin/python benchmarks/differential/infer.py -n 150            # a new seed
    .venv/bin/python benchmarks/differential/infer.py -n 20 --seed 7    # reproduce a run
    .venv/bin/python benchmarks/differential/infer.py -n 20 --small     # the small models only (fast)
    .venv/bin/python benchmarks/differential/infer.py -j 2              # two worker processes

The sampler draws a model of every family the trace builds (dense, MoE, multi-head latent attention, sliding windows
and hybrids of them, gated-DeltaNet hybrids (Mamba-2 ones are refused: mamba-ssm's kernels), a vision-language model fed text), a preset or a preset's
config at its real widths with fewer layers (:data:`DERIVED`: the trace runs every decode step through every layer),
the weights in a format that runs on fake tensors (bf16, fp16, fp32: quantized formats' kernels are CUDA-only, and
``cabe infer --trace`` refuses them), the KV cache in the weights' dtype (transformers' caches keep keys and values as
the layer computes them; ``cabe.trace.generate.check``), the batch, the context, the generated tokens within it, the
cache (dynamic or static) and a prefill chunk. The seed is printed first and is new on every run unless given.

Writes ``results/results-<seed>-infer.json`` and ``.md`` and a row of the table of every run (``results/README.md``).
Target (issue 31): max |error| <= 3 % on >= 150 configurations.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import cabe.trace  # noqa: F401  (the fake-CUDA shim, before torch)

HERE = Path(__file__).parent
RESULTS = HERE / "results"

#: presets the trace runs whole in seconds
SMALL_MODELS = ["gpt2", "qwen2.5-0.5b", "qwen3-0.6b", "llama-3.2-1b", "gemma-3-1b", "pythia-1.4b", "starcoderbase-1b"]
#: presets at their widths with fewer decoder layers (``layer_types`` cut to match, :data:`LAYER_TYPES` where the
#: preset's first layers would leave out a kind): (preset, layers)
DERIVED: dict[str, tuple[str, int]] = {
    "gemma-2-2b-4l": ("gemma-2-2b", 4),
    "phi-3-mini-4l": ("phi-3-mini", 4),
    "mistral-7b-v0.1-4l": ("mistral-7b-v0.1", 4),
    "llama-3.1-8b-4l": ("llama-3.1-8b", 4),
    "qwen3-8b-4l": ("qwen3-8b", 4),
    "olmo-2-7b-4l": ("olmo-2-7b", 4),
    "gemma-3-4b-6l": ("gemma-3-4b", 6),
    "qwen3-30b-a3b-4l": ("qwen3-30b-a3b", 4),
    "mixtral-8x7b-2l": ("mixtral-8x7b", 2),
    "gpt-oss-20b-4l": ("gpt-oss-20b", 4),
    "deepseek-v3-2l": ("deepseek-v3", 2),
    "qwen3-next-80b-a3b-4l": ("qwen3-next-80b-a3b", 4),
    "qwen2.5-vl-3b-instruct-4l": ("qwen2.5-vl-3b-instruct", 4),
}
#: the layer kinds of a derived model whose preset's first layers are all of one kind (none today: Granite-4.0-H's
#: Mamba-2 hybrids are refused by ``cabe infer --trace``, their inference kernels being mamba-ssm's)
LAYER_TYPES: dict[str, list[str]] = {}
#: config keys a derived model changes beside its layers (DeepSeek-V3's first layer dense, its second MoE: 256 experts
#: of 2048 top-8 and a shared one, under multi-head latent attention)
OVERRIDES: dict[str, dict[str, Any]] = {"deepseek-v3-2l": {"first_k_dense_replace": 1}}
MODELS = SMALL_MODELS + list(DERIVED)
WEIGHTS = [("bf16", 5), ("fp16", 3), ("fp32", 2)]
BATCHES = [1, 1, 2, 4, 8, 16]
CONTEXTS = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
NEW_TOKENS = [1, 2, 4, 8, 16, 32, 64]
CHUNKS = [64, 128, 256, 512]
#: the share of draws with a static cache, and with a prefill chunk
STATIC_SHARE = 0.3
CHUNK_SHARE = 0.25


def config(model: str) -> dict[str, Any]:
    """The config a model name stands for: a preset's, or one of :data:`DERIVED` (its preset's with fewer layers)."""
    from cabe.models import preset

    if model not in DERIVED:
        return dict(preset(model).config)
    base, layers = DERIVED[model]
    cfg = dict(preset(base).config)
    if model in LAYER_TYPES:
        cfg["layer_types"] = LAYER_TYPES[model]
    cfg.update(OVERRIDES.get(model, {}))
    return {**_cut(cfg, layers), **({"text_config": _cut(cfg["text_config"], layers)} if "text_config" in cfg else {})}


def _cut(cfg: dict[str, Any], layers: int) -> dict[str, Any]:
    out = {**cfg, "num_hidden_layers": layers}
    for key in ("layer_types", "mlp_layer_types"):
        if isinstance(cfg.get(key), list) and len(cfg[key]) > layers:
            out[key] = cfg[key][:layers]
    return out


def sample(rng: random.Random, *, small: bool = False) -> tuple[str, dict[str, Any]]:
    """One configuration: a model name and the request's keywords."""
    model = rng.choice(SMALL_MODELS if small else MODELS)
    weights = rng.choices([w for w, _ in WEIGHTS], weights=[k for _, k in WEIGHTS])[0]
    context = rng.choice(CONTEXTS)
    new = min(rng.choice(NEW_TOKENS), context - 1)
    kw: dict[str, Any] = {
        "weights": weights,
        "kv_dtype": weights,
        "batch": rng.choice(BATCHES),
        "context": context,
        "new_tokens": new,
        "cache": "static" if rng.random() < STATIC_SHARE else "dynamic",
        "prefill_chunk": None,
    }
    if rng.random() < CHUNK_SHARE and context - new > min(CHUNKS):
        kw["prefill_chunk"] = rng.choice([c for c in CHUNKS if c < context - new])
    return model, kw


def draw(seed: int, n: int, *, small: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """``n`` configurations drawn from ``seed`` (the context within the model's positions)."""
    from cabe.models import from_mapping

    rng = random.Random(seed)
    out: list[tuple[str, dict[str, Any]]] = []
    while len(out) < n:
        model, kw = sample(rng, small=small)
        limit = from_mapping(config(model), model).spec.max_positions or 1 << 20
        if kw["context"] > limit:
            continue
        out.append((model, kw))
    return out


def one(model: str, kw: dict[str, Any]) -> dict[str, Any]:
    """Trace and estimate one configuration."""
    from cabe.errors import CabeError
    from cabe.inference import estimate_inference
    from cabe.models import from_mapping
    from cabe.trace.generate import trace_generate

    cfg = config(model)
    row: dict[str, Any] = {"model": model, "request": kw, "error": None, "relative_error": None}
    t0 = time.perf_counter()
    try:
        est = estimate_inference(from_mapping(cfg, model).spec, **kw)
        row["estimate_bytes"] = est["total_bytes"]
        row["estimate_moment"] = est.get("peak_moment")
        tr = trace_generate(
            cfg,
            weights=kw["weights"],
            kv_dtype=kw["kv_dtype"],
            prompt=kw["context"] - kw["new_tokens"],
            new_tokens=kw["new_tokens"],
            batch=kw["batch"],
            prefill_chunk=kw["prefill_chunk"],
            cache=kw["cache"],
        )
    except CabeError as exc:
        row["error"] = f"{exc.code}: {dict(exc.params)}"[:300]
        return row
    row.update(
        trace_bytes=tr["trace_peak_bytes"],
        trace_reserved_bytes=tr["trace_reserved_bytes"],
        trace_stage=tr["trace_peak_stage"],
        trace_components=tr["trace_components"],
        attention_kernels=tr["trace_attention_kernels"],
        relative_error=round((row["estimate_bytes"] - tr["trace_peak_bytes"]) / tr["trace_peak_bytes"], 6),
        seconds=round(time.perf_counter() - t0, 2),
    )
    return row


def _one(args: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return one(*args)


def run(configs: list[tuple[str, dict[str, Any]]], *, jobs: int = 1, quiet: bool = False) -> list[dict[str, Any]]:
    """Every configuration traced and estimated, in order (``jobs`` worker processes)."""
    if jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            rows = []
            for r in pool.imap(_one, configs):
                rows.append(r)
                if not quiet:
                    _print(r)
            return rows
    rows = []
    for c in configs:
        rows.append(one(*c))
        if not quiet:
            _print(rows[-1])
    return rows


def _print(r: dict[str, Any]) -> None:
    kw = " ".join(f"{k}={v}" for k, v in r["request"].items() if v is not None)
    if r["error"]:
        print(f"{r['model']:28s} error {r['error']}  {kw}", flush=True)
        return
    print(
        f"{r['model']:28s} {100 * r['relative_error']:+7.2f}%  trace {r['trace_bytes'] / 2**30:8.3f} GiB "
        f"({r['trace_stage']}; cabe: {r['estimate_moment']})  {kw}",
        flush=True,
    )


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errs = sorted(abs(r["relative_error"]) for r in rows if r["relative_error"] is not None)
    return {
        "configurations": len(rows),
        "traced": len(errs),
        "within_3pct": sum(e <= 0.03 for e in errs),
        "max_abs_error": errs[-1] if errs else None,
        "median_abs_error": statistics.median(errs) if errs else None,
    }


def write(rows: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    """``results/results-<seed>-infer.json`` and ``.md``, and the run's row of ``results/README.md``."""
    sys.path.insert(0, str(HERE))
    from run import append_row  # this directory's single-GPU benchmark: the table's writer

    RESULTS.mkdir(exist_ok=True)
    s = summary(rows)
    name = f"results-{seed}-infer"
    (RESULTS / f"{name}.json").write_text(json.dumps({"seed": seed, "summary": s, "rows": rows}, indent=1) + "\n")
    lines = [
        f"# Inference differential, seed {seed}",
        "",
        f"{s['traced']} of {s['configurations']} traced; within 3%: {s['within_3pct']}; "
        f"max |error| {100 * (s['max_abs_error'] or 0):.2f}%, median {100 * (s['median_abs_error'] or 0):.3f}%",
        "",
        "| model | weights | batch | context | new | cache | chunk | trace GiB | stage | cabe moment | error |",
        "|---|---|---:|---:|---:|---|---:|---:|---|---|---:|",
    ]
    for r in rows:
        q = r["request"]
        head = (
            f"| {r['model']} | {q['weights']} | {q['batch']} | {q['context']} | {q['new_tokens']} | {q['cache']} | "
            f"{q['prefill_chunk'] or ''} | "
        )
        if r["error"]:
            lines.append(head + f"— | — | — | {r['error'][:80].replace('|', '/')} |")
        else:
            lines.append(
                head + f"{r['trace_bytes'] / 2**30:.3f} | {r['trace_stage']} | {r['estimate_moment']} | "
                f"{100 * r['relative_error']:+.2f}% |"
            )
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    append_row(RESULTS / "README.md", seed, "infer", s, f"{name}.json")
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=150)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--small", action="store_true", help="the small presets only")
    ap.add_argument("-j", "--jobs", type=int, default=1)
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    print(f"seed {seed}", flush=True)
    t0 = time.perf_counter()
    rows = run(draw(seed, args.n, small=args.small), jobs=args.jobs)
    s = write(rows, seed)
    print(
        f"seed {seed}: {s['traced']} of {s['configurations']} traced in {time.perf_counter() - t0:.0f} s; "
        f"max |error| {100 * (s['max_abs_error'] or 0):.2f}%, median {100 * (s['median_abs_error'] or 0):.2f}%, "
        f"within 3%: {s['within_3pct']}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
