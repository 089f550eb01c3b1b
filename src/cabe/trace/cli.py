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

from cabe import schema
from cabe.errors import CabeError, ConfigError, InvalidValueError

GIB = 2**30
COMMAND = "trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The trace-only flags (``--steps``, ``--mode``, ``--timeline``...), as :mod:`cabe.schema` declares them."""
    schema.add_arguments(parser, COMMAND, groups=("trace",))


def trace_options(args: argparse.Namespace) -> dict[str, Any]:
    """The trace-only options: what the flags give, the schema's defaults for the rest."""
    out = {f.name: f.default for f in schema.fields_for(COMMAND) if f.group == "trace"}
    out.update(schema.values_from_args(args, COMMAND, groups=("trace",)))
    return out


def run(args: argparse.Namespace, config: dict[str, Any], setup: Any) -> dict[str, Any]:
    """Trace, write the requested files, and return the JSON object (``TraceResult.to_json``)."""
    from cabe.trace import layer_inventory, trace_step

    opts = trace_options(args)
    mode = opts["mode"] or "auto"
    res = trace_step(config, setup, steps=opts["steps"], mode=mode)
    out = res.to_json()
    if opts["expandable_segments"]:
        out["reserved_bytes_default"] = out["reserved_bytes"]
        out["reserved_bytes"] = out["reserved_bytes_expandable_segments"]
    if opts["timeline"]:
        _write_timeline(opts["timeline"], out)
    if opts["plot"]:
        _write_plot(opts["plot"], out, config, setup)
    if opts["inventory"]:
        rows = layer_inventory(config, setup, mode=mode)
        out["inventory"] = rows
        out["inventory_text"] = format_inventory(rows)
    return out


def _write_timeline(path: str, out: dict[str, Any]) -> None:
    keys = ("timeline", "step_starts", "peak_event", "peak_bytes", "peak_phase", "phase_peaks")
    _write(path, json.dumps({k: out[k] for k in keys}, indent=1))
    out["timeline_file"] = path


def _write_plot(path: str, out: dict[str, Any], config: dict[str, Any], setup: Any) -> None:
    from cabe.trace.plot import write_svg

    title = f"{config.get('model_type', 'model')} · {setup.method} · {setup.dtype}+autocast {setup.autocast} · b{setup.batch}×{setup.seq}"
    try:
        write_svg(out, path, title=title)
    except OSError as exc:
        raise InvalidValueError("cannot_write", "plot", path=path, reason=str(exc)) from None
    out["plot_file"] = path


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
    """The TrainingSetup options, spelled as in the main CLI (the schema's ``setup`` group)."""
    schema.add_arguments(p, COMMAND, groups=("setup",))


def setup_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~cabe.training.TrainingSetup` of the setup flags given (the rest defaulted)."""
    from cabe.training import TrainingSetup

    return TrainingSetup(**schema.values_from_args(args, COMMAND, groups=("setup",)))


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
