"""``cabe gpus``: the GPU catalog."""

from __future__ import annotations

import argparse
from typing import Any

from cabe import jsonio
from cabe.cli import options
from cabe.i18n import t


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.output(p)


def gather(args: argparse.Namespace) -> list[dict[str, Any]]:
    from cabe import gpus

    return [g.to_json() for g in gpus.all_gpus()]


def render(rows: list[dict[str, Any]], args: argparse.Namespace, lang: str, units: str) -> str:
    from cabe.units import fmt_bytes

    if args.json:
        return jsonio.dumps(rows, indent=2)
    lines = [t("ui.gpus_header", lang) + ":"]
    for g in rows:
        memory = fmt_bytes(g["memory_bytes"], lang, units, both=False)
        usable = fmt_bytes(g["usable_bytes"], lang, units, both=False)
        lines.append(f"  {g['name']:<24} {memory:>12} {usable:>12}  bf16 {t('ui.yes' if g['bf16'] else 'ui.no', lang)}")
    return "\n".join(lines)
