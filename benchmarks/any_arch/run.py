"""Every causal LM transformers builds, through `cabe estimate` (the trace, for the architectures no family
module reads): which ones answer, on a tiny config of their own kind.

    PYTHONPATH=src python benchmarks/any_arch/run.py [--methods full,lora] [--out benchmarks/any_arch/results.json]

For each ``model_type`` of transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` that no cabe family module
reads: the architecture's default config with its layers cut to 4 (its widths as they are: fake tensors cost
no memory), and one traced step per method through :func:`cabe.via_trace.report` (batch 1 × 32 tokens). A row says ``ok`` (peak bytes, parameters, the class
built) or the error code and sentence. Results are appended as they come (one JSON line per row), so a run
that an architecture aborts resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import cabe.trace  # noqa: F401  (the fake-CUDA shim loads before torch)

#: The config keys that count layers (each architecture's own name for it).
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers")
#: Layers kept: enough for the patterns of most hybrids (sliding / full, linear / full attention).
LAYERS = 4


def _shrink(defaults: dict) -> dict:
    """The layer counts of a config made :data:`LAYERS`, and every per-layer list (``layer_types``...) cut to
    match; the widths stay the architecture's defaults (fake tensors cost no memory) so they agree."""
    out: dict = {}
    counts = {k: v for k, v in defaults.items() if k in LAYER_KEYS and isinstance(v, int) and v > LAYERS}
    for k in counts:
        out[k] = LAYERS
    for k, v in defaults.items():
        if isinstance(v, list) and v and len(v) in counts.values():
            out[k] = v[:LAYERS]
    return out


#: The second try, where the architecture's own defaults do not build (some transformers 5.24 config classes
#: leave a field None that their model needs): the usual shape keys made small, where the class declares them.
SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 128,
    "d_model": 64,
    "num_layers": 2,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
#: Error codes of a config transformers refused (rather than a step the trace could not run).
CONFIG_CODES = ("bad_config", "exception")


def small_config(model_type: str) -> dict:
    from transformers import AutoConfig

    defaults = AutoConfig.for_model(model_type).to_dict()
    cfg = {"model_type": model_type, **{k: v for k, v in SMALL.items() if k in defaults}}
    text = defaults.get("text_config")
    if isinstance(text, dict):
        cfg["text_config"] = {k: v for k, v in SMALL.items() if k in text}
    return cfg


def tiny_config(model_type: str) -> dict:
    """The architecture's default config with its layers cut (its ``text_config``'s too)."""
    from transformers import AutoConfig

    defaults = AutoConfig.for_model(model_type).to_dict()
    cfg = {"model_type": model_type, **_shrink(defaults)}
    text = defaults.get("text_config")
    if isinstance(text, dict):
        cfg["text_config"] = {**text, **_shrink(text)}
    return cfg


def main(argv: list[str] | None = None) -> int:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from cabe import families

    p = argparse.ArgumentParser()
    p.add_argument("--methods", default="full,freeze,lora,qlora")
    p.add_argument("--out", default=str(Path(__file__).with_name("results.jsonl")))
    p.add_argument("--only", default="")
    args = p.parse_args(argv)
    out = Path(args.out)
    done = set()
    if out.exists():
        done = {(r["model_type"], r["method"]) for r in map(json.loads, out.read_text().splitlines())}
    known = set(families.supported_model_types())
    types = sorted(t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if t not in known)
    if args.only:
        types = [t for t in types if t in args.only.split(",")]
    for model_type in types:
        for method in args.methods.split(","):
            if (model_type, method) in done:
                continue
            t0 = time.perf_counter()
            row = _row(model_type, method, tiny_config, "defaults")
            if not row["ok"] and row["code"] in CONFIG_CODES:
                row = _row(model_type, method, small_config, "small")
            row["seconds"] = round(time.perf_counter() - t0, 2)
            with out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(json.dumps(row)[:200], file=sys.stderr, flush=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    out.with_suffix(".md").write_text(summary(rows, sorted(known)))
    return 0


def summary(rows: list[dict], known: list[str]) -> str:
    """The table of the run: per method, how many architectures answered; then every refusal."""
    import transformers

    order = ("full", "freeze", "lora", "qlora")
    methods = sorted(dict.fromkeys(r["method"] for r in rows), key=lambda m: (order + (m,)).index(m))
    rows = sorted(rows, key=lambda r: (r["model_type"], methods.index(r["method"])))
    types = sorted({r["model_type"] for r in rows})
    lines = [
        f"# Every causal LM of transformers {transformers.__version__} that no cabe family module reads, traced",
        "",
        f"`PYTHONPATH=src python benchmarks/any_arch/run.py` — {len(types)} `model_type`s of "
        "`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` (the "
        f"{len(known)} that family modules read are left out); each one's default config with 4 layers, "
        "else small shape keys (`config: small`); batch 1 × 32 tokens, through `cabe.via_trace.report`.",
        "",
        "| method | answered | refused |",
        "|---|---:|---:|",
    ]
    for m in methods:
        ok = sum(1 for r in rows if r["method"] == m and r["ok"])
        bad = sum(1 for r in rows if r["method"] == m and not r["ok"])
        lines.append(f"| {m} | {ok} | {bad} |")
    lines += ["", "## Refused", "", "| model_type | method | code | sentence |", "|---|---|---|---|"]
    for r in rows:
        if not r["ok"]:
            sentence = r["error"].replace("|", "/").replace("\n", " ")[:160]
            lines.append(f"| {r['model_type']} | {r['method']} | {r['code']} | {sentence} |")
    return "\n".join(lines) + "\n"


def _row(model_type: str, method: str, make: Any, config: str) -> dict:
    """One traced step of ``make(model_type)``: ``ok`` and its figures, or the error's code and sentence."""
    from cabe import via_trace
    from cabe.errors import CabeError
    from cabe.training import TrainingSetup

    row: dict = {"model_type": model_type, "method": method, "config": config}
    try:
        cfg = make(model_type)
        rep = via_trace.report(cfg, TrainingSetup(method=method, batch=1, seq=32), name=model_type)
        row.update(
            ok=True,
            peak_bytes=rep.total_bytes,
            parameters=rep.parameters,
            trainable=rep.trainable_parameters,
            architecture=(rep.model or {}).get("architecture"),
            layers=(rep.model or {}).get("num_layers"),
            notes=list(rep.notes),
        )
    except CabeError as err:
        row.update(ok=False, code=err.code, error=err.to_dict("en")["message"][:300])
    except Exception as exc:  # the config class itself refused: recorded, not fatal
        row.update(ok=False, code="exception", error=f"{type(exc).__name__}: {str(exc)[:300]}")
    return row


if __name__ == "__main__":
    raise SystemExit(main())
