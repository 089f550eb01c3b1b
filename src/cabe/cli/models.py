"""``cabe models``: the model presets."""

from __future__ import annotations

import argparse
from typing import Any

from cabe import jsonio
from cabe.cli import options
from cabe.i18n import fmt_number, t


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.output(p)


def gather(args: argparse.Namespace) -> list[dict[str, Any]]:
    from cabe import models

    rows = []
    for name in models.preset_names():
        src = models.preset(name)
        rows.append(
            {
                "name": name,
                "display": src.meta.get("display", name),
                "parameters": src.meta.get("parameters"),
                "hf_id": src.meta.get("hf_id"),
                "model_type": src.config.get("model_type"),
                "attention": src.spec.attention_kind,
                "mlp": src.spec.mlp_kinds,
            }
        )
    return rows


def render(rows: list[dict[str, Any]], args: argparse.Namespace, lang: str, units: str) -> str:
    if args.json:
        return jsonio.dumps(rows, indent=2)
    lines = [t("ui.models_header", lang) + ":"]
    lines += [
        f"  {r['name']:<18} {fmt_number(r['parameters'], lang):>20}  {r['attention']:<12} {r['mlp']:<16} {r['hf_id'] or ''}"
        for r in rows
    ]
    return "\n".join(lines)
