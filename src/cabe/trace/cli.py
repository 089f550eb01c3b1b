"""Command-line glue for ``cabe trace`` / ``cabe measure`` (no printing in the engine).

The main CLI registers the subcommands, parses the common model and setup options, and calls
:func:`run` with the config dict and the :class:`~cabe.training.TrainingSetup`; this module
adds only the trace-specific flags. ``python -m cabe.trace CONFIG.json [setup flags]`` is a
standalone equivalent (see :func:`main`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from cabe.errors import CabeError, ConfigError, InvalidValueError

GIB = 2**30


from cabe.trace_options import add_arguments  # noqa: E402  (torch-free, so `cabe --help` stays fast)


def run(args: argparse.Namespace, config: dict[str, Any], setup: Any) -> dict[str, Any]:
    """Trace, write the requested files, and return the JSON object (``TraceResult.to_json``)."""
    from cabe.trace import layer_inventory, trace_step

    steps = getattr(args, "steps", 2)
    mode = getattr(args, "mode", "auto") or "auto"
    res = trace_step(config, setup, steps=steps, mode=mode)
    out = res.to_json()
    if getattr(args, "expandable_segments", False):
        out["reserved_bytes_default"] = out["reserved_bytes"]
        out["reserved_bytes"] = out["reserved_bytes_expandable_segments"]
    timeline = getattr(args, "timeline", None)
    if timeline:
        _write(
            timeline,
            json.dumps(
                {
                    k: out[k]
                    for k in ("timeline", "step_starts", "peak_event", "peak_bytes", "peak_phase", "phase_peaks")
                },
                indent=1,
            ),
        )
        out["timeline_file"] = timeline
    plot = getattr(args, "plot", None)
    if plot:
        from cabe.trace.plot import write_svg

        title = f"{config.get('model_type', 'model')} · {setup.method} · {setup.precision} · b{setup.batch}×{setup.seq}"
        try:
            write_svg(out, plot, title=title)
        except OSError as exc:
            raise InvalidValueError("cannot_write", "plot", path=plot, reason=str(exc)) from None
        out["plot_file"] = plot
    if getattr(args, "inventory", False):
        rows = layer_inventory(config, setup, mode=mode)
        out["inventory"] = rows
        out["inventory_text"] = format_inventory(rows)
    return out


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise InvalidValueError("cannot_write", "timeline", path=path, reason=str(exc)) from None


def format_inventory(rows: list[dict[str, Any]]) -> str:
    """A fixed-width table of :func:`cabe.trace.layer_inventory` rows, with totals per kind."""
    head = f"{'#':>3}  {'module':<24} {'allocated by (op)':<28} {'saved by (autograd node)':<46} {'shape':<24} {'dtype':<9} {'kind':<11} {'bytes':>14}"
    lines = [head, "-" * len(head)]
    totals: dict[str, int] = {}
    for i, r in enumerate(rows):
        shape = "×".join(str(s) for s in r["shape"]) or "()"
        kind = r["kind"]
        b = r["bytes"]
        totals[kind] = totals.get(kind, 0) + b
        note = f"  (same storage as #{r['shared_with']})" if r.get("shared_with") is not None else ""
        if r.get("name"):
            note += f"  {r['name']}"
        lines.append(
            f"{i:>3}  {r['module'][:24]:<24} {r['op'].replace('.default', '')[:28]:<28} {r.get('saved_by', '')[:46]:<46} {shape[:24]:<24} "
            f"{r['dtype']:<9} {kind:<11} {b:>14,}{note}"
        )
    lines.append("-" * len(head))
    for kind in sorted(totals):
        lines.append(f"     total {kind:<12} {totals[kind]:>16,} B  ({totals[kind] / 2**20:,.2f} MiB)")
    lines.append(f"     total {'all':<12} {sum(totals.values()):>16,} B  ({sum(totals.values()) / 2**20:,.2f} MiB)")
    return "\n".join(lines)


# ---- standalone -------------------------------------------------------------------------
def add_setup_arguments(p: argparse.ArgumentParser) -> None:
    """The TrainingSetup options, spelled as in the main CLI."""
    s = p.add_argument_group("training setup")
    for flag in (
        "method",
        "precision",
        "optimizer",
        "optimizer-impl",
        "attention",
        "lora-alpha",
        "lora-targets",
        "quant",
        "compute-dtype",
    ):
        s.add_argument(f"--{flag}")
    for flag in ("batch", "seq", "grad-accum", "lora-rank", "trainable-layers", "prompt-tokens"):
        s.add_argument(f"--{flag}", type=int)
    s.add_argument("--checkpointing", action="store_true", default=None)
    s.add_argument("--no-double-quant", dest="double_quant", action="store_false", default=None)


def setup_from_args(args: argparse.Namespace) -> Any:
    from cabe.training import TrainingSetup

    kw: dict[str, Any] = {}
    for name in (
        "method",
        "precision",
        "optimizer",
        "optimizer_impl",
        "attention",
        "quant",
        "compute_dtype",
        "batch",
        "seq",
        "grad_accum",
        "lora_rank",
        "trainable_layers",
        "prompt_tokens",
        "checkpointing",
        "double_quant",
        "lora_targets",
    ):
        v = getattr(args, name, None)
        if v is not None:
            kw[name] = v
    if getattr(args, "lora_alpha", None) is not None:
        kw["lora_alpha"] = float(args.lora_alpha)
    return TrainingSetup(**kw)


def load_config(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except OSError as exc:
        raise ConfigError("cannot_read", "model", path=path, reason=str(exc)) from None
    except json.JSONDecodeError as exc:
        raise ConfigError("bad_json", "model", path=path, reason=str(exc)) from None
    if not isinstance(cfg, dict):
        raise ConfigError("config_not_object", "model", path=path)
    return cfg


def print_summary(out: dict[str, Any], file: Any = None) -> None:
    file = file or sys.stdout
    p = lambda s="": print(s, file=file)  # noqa: E731
    p(f"peak allocated      {out['peak_bytes'] / GIB:10.2f} GiB  ({out['peak_bytes']:,} B, {out['peak_phase']})")
    p(
        f"reserved (replay)   {out['reserved_bytes'] / GIB:10.2f} GiB  "
        f"(expandable segments {out['reserved_bytes_expandable_segments'] / GIB:.2f} GiB)"
    )
    if out.get("paged_bytes"):
        p(f"paged (managed)     {out['paged_bytes'] / GIB:10.2f} GiB  (not in allocated/reserved)")
    p(f"first step peak     {out['first_step_peak_bytes'] / GIB:10.2f} GiB")
    p("at the peak:")
    for k, v in out["components"].items():
        if v:
            p(f"  {k:<22} {v / GIB:10.3f} GiB")
    p("phase peaks:  " + ", ".join(f"{k} {v / GIB:.2f}" for k, v in out["phase_peaks"].items()))
    p(
        f"parameters {out['parameters']:,} (trainable {out['trainable_parameters']:,}); "
        f"attention kernels {out['attention_kernels']}; mode {out['mode']}; {out['seconds']:.1f} s"
    )
    for n in out.get("notes", []):
        p(f"note: {n}")
    if out.get("inventory_text"):
        p()
        p(out["inventory_text"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cabe.trace", description="Trace a training step on fake tensors.")
    parser.add_argument("config", help="a config.json")
    parser.add_argument("--json", action="store_true", help="print the JSON object")
    add_setup_arguments(parser)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        setup = setup_from_args(args)
        out = run(args, config, setup)
    except CabeError as exc:
        print(f"error: {exc.code} ({exc.field}): {dict(exc.params)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print_summary(out)
    return 0
