"""``cabe recipes``: the trainers' recipes (:mod:`cabe.recipes`), what each sets and where it comes from."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cabe.cli import options
from cabe.i18n import t


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="one recipe (its facts with their sources)")
    options.output(p)


def gather(args: argparse.Namespace) -> list[dict[str, Any]]:
    from cabe import recipes
    from cabe.errors import InvalidValueError

    name = getattr(args, "name", None)
    if name is not None and name not in recipes.NAMES:
        raise InvalidValueError("bad_choice", "recipe", value=name, allowed=", ".join(recipes.NAMES))
    return [recipes.load(n) for n in recipes.NAMES if name is None or n == name]


def _sets(r: dict[str, Any]) -> str:
    return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in r["sets"].items())


def render(rows: list[dict[str, Any]], args: argparse.Namespace, lang: str, units: str) -> str:
    if args.json:
        return json.dumps(rows, ensure_ascii=False, indent=2)
    lines = [t("ui.recipes_header", lang) + ":"]
    detail = getattr(args, "name", None) is not None
    for r in rows:
        lines.append(f"  {r['name']:<14} {r['project']} {r['version']}")
        lines.append(f"  {'':<14} {t('ui.recipe_sets', lang)}: {_sets(r)}")
        missing = [f for f in r["facts"] if not f["modelled"]]
        if missing and not detail:
            topics = ", ".join(t("recipe.topic." + f["topic"], lang) for f in missing)
            lines.append(f"  {'':<14} {t('ui.recipe_not_modelled', lang)}: {topics}")
        if detail:
            for f in r["facts"]:
                mark = "" if f["modelled"] else f"  [{t('ui.recipe_not_modelled', lang)}: "
                mark += "" if f["modelled"] else t("recipe.unmodelled." + f["unmodelled"], lang) + "]"
                lines.append(f"    {t('recipe.topic.' + f['topic'], lang)}: {f['value']}{mark}")
                lines.append(f"      ← {f['source']}")
    return "\n".join(lines)
