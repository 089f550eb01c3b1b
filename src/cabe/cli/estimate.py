"""``cabe estimate``: the peak GPU memory of a training step, part by part, and where it fits."""

from __future__ import annotations

import argparse
from typing import Any

from cabe import jsonio
from cabe.cli import options
from cabe.i18n import t

COMMAND = "estimate"


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.training(p, COMMAND)
    options.flag(p, "--fits", key="fits", action="store_true")
    options.flag(p, "--explain", key="explain", action="store_true")
    options.output(p, COMMAND)


def gather(args: argparse.Namespace) -> Any:
    from cabe import api

    # an architecture the analytic path does not know is answered from the trace (cabe.via_trace)
    body = options.request(args, COMMAND)
    if args.explain:  # each memory knob against the request without it (cabe.knob_effects), in the text and the JSON
        body["explain"] = True
    return api.build(body, allow_files=True, trace="process")


def render(report: Any, args: argparse.Namespace, lang: str, units: str) -> str:
    from cabe import gpus
    from cabe.report.text import format_report
    from cabe.units import fmt_bytes

    if args.json:
        out = report.to_json()
        out["fits_on"] = gpus.fits_on(report)
        return jsonio.dumps(out, indent=2)
    lines = [format_report(report, lang=lang, units=units, explain=args.explain)]
    if args.fits:
        lines.append("")
        bf16 = gpus.needs_bf16(report)
        for g in gpus.fits_table(report):
            verdict = t("ui.fits" if g["fits"] else "ui.does_not_fit", lang)
            if bf16 and not g["bf16"]:
                verdict += " — " + t("ui.no_bf16", lang)
            lines.append(f"  {g['display']:<40} {fmt_bytes(g['memory_bytes'], lang, units, both=False):>12}  {verdict}")
    elif report.mode != "simple":
        lines.append(fits_on_line(report, lang))
    return "\n".join(lines)


def fits_on_line(report: Any, lang: str) -> str:
    """ "Fits on: ..." — the first eight cards of the catalog that hold the run."""
    from cabe import gpus
    from cabe.report.text import fits_on_line as line

    return line(gpus.fits_on(report), lang)
