"""``cabe lora``: LoRA adapter parameters per target module, for a model and a rank."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from cabe import jsonio, schema
from cabe.cli import options
from cabe.errors import InvalidValueError
from cabe.i18n import fmt_number, t

COMMAND = "lora"


def add_arguments(p: argparse.ArgumentParser) -> None:
    # the schema's lora_rank / lora_targets, with the older --rank / --targets as aliases
    schema.add_arguments(p, COMMAND, groups=("model", "setup"))
    options.output(p, COMMAND)


@dataclass(frozen=True)
class Adapter:
    spec: Any
    rank: int
    rows: list[Any]

    @property
    def total(self) -> int:
        return sum(r.parameters for r in self.rows)


def gather(args: argparse.Namespace) -> Adapter:
    from cabe import models
    from cabe.method import lora_parameters
    from cabe.training import TrainingSetup, parse_targets

    if not args.model:
        raise InvalidValueError("empty_model", "model")
    spec = models.resolve(args.model).spec
    rank = (
        schema.to_int("lora_rank", args.lora_rank) if args.lora_rank is not None else schema.field("lora_rank").default
    )
    setup = TrainingSetup(lora_rank=rank, lora_targets=parse_targets(args.lora_targets) if args.lora_targets else ())
    return Adapter(spec, setup.lora_rank, lora_parameters(spec, setup.lora_rank, setup.lora_targets))


def render(a: Adapter, args: argparse.Namespace, lang: str, units: str) -> str:
    if args.json:
        out = {
            "rank": a.rank,
            "targets": [r.__dict__ for r in a.rows],
            "total": a.total,
            "base_parameters": a.spec.parameter_count,
        }
        return jsonio.dumps(out, indent=2)
    lines = [t("ui.lora_header", lang, r=a.rank) + ":"]
    for r in a.rows:
        layers = sum(g.count for g in a.spec.runs if any(lin.name == r.name for lin in g.linears))  # that have it
        lines.append(
            f"  {r.name:<16} {r.per_layer} × {layers} × {a.rank}·({r.in_features} + {r.out_features})"
            f" = {fmt_number(r.parameters, lang)}"
        )
    base = a.spec.parameter_count
    lines.append(t("ui.lora_total", lang, n=a.total, pct=round(100 * a.total / base, 4), base=base))
    return "\n".join(lines)
