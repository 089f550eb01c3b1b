"""``cabe from-config FILE...``: estimate from the configs a run already has.

Reads TrainingArguments / SFTConfig, PEFT adapter configs, BitsAndBytesConfig, DeepSpeed,
accelerate (FSDP), axolotl and torchtune files, alone or together (:mod:`cabe.configs`), prints
the same report as ``cabe estimate`` and then which fields were read and which were ignored, and
why. ``--json``: ``cabe estimate --json``'s object plus ``"from_config"``.
"""

from __future__ import annotations

import argparse
from typing import Any

from cabe import jsonio, schema
from cabe.cli import options
from cabe.i18n import t

COMMAND = "from-config"


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.flag(p, "files", key="files", nargs="+", metavar="FILE")
    options.flag(p, "--format", key="config_format", dest="config_format", default=None)
    # the request fields the command line may override (the configs rarely say how many GPUs)
    schema.add_arguments(p, COMMAND, groups=options.TRAINING_GROUPS)
    options.flag(p, "--explain", key="explain", action="store_true")
    options.output(p, COMMAND)


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """What the flags override in the configs (the card is not in them: it is added after)."""
    return options.request(args, COMMAND, exclude=("gpu",))


def gather(args: argparse.Namespace) -> tuple[Any, Any]:
    from cabe import from_config

    # the readers and the request are cabe.from_config's (the page's /api/from-config reads the same way);
    # here local files, and unknown architectures traced in this process
    return from_config.gather(
        args.files,
        fmt=args.config_format,
        overrides=overrides_from_args(args),
        gpu=args.gpu,
        allow_files=True,
        trace="process",
        explain=bool(args.explain),  # each memory knob against the request without it (cabe.knob_effects)
    )


def render(result: tuple[Any, Any], args: argparse.Namespace, lang: str, units: str) -> str:
    from cabe.cli.estimate import fits_on_line
    from cabe.report.text import format_report

    combined, report = result
    if args.json:
        from cabe.from_config import answer_json

        return jsonio.dumps(answer_json(combined, report, lang), indent=2)
    lines = [format_report(report, lang=lang, units=units, explain=args.explain)]
    if report.mode != "simple" and not report.gpu:
        lines.append(fits_on_line(report, lang))
    return "\n".join([*lines, "", format_sources(combined, lang)])


def format_sources(combined: Any, lang: str = "en", max_names: int = 10) -> str:
    """The "read from" section: per file, the fields used, then the ignored ones grouped by reason."""
    lines = [t("from_config.read_from", lang) + ":"]
    for s in combined.sources:
        lines.append(f"  {s.path} ({t('from_config.format.' + s.format, lang)})")
        if s.used:
            lines.append(f"    {t('from_config.used', lang)}: {', '.join(s.used)}")
        by_reason: dict[str, list[str]] = {}
        for f, r in s.ignored:
            by_reason.setdefault(r, []).append(f)
        for reason, names in by_reason.items():
            shown = ", ".join(names[:max_names]) + (f" … (+{len(names) - max_names})" if len(names) > max_names else "")
            lines.append(f"    {t('from_config.ignored', lang)} — {t('from_config.reason.' + reason, lang)}: {shown}")
    req = ", ".join(f"{k}={_show(v)}" for k, v in combined.request.items())
    lines.append(f"  → {t('from_config.request', lang)}: {req}")
    for k in combined.overridden:
        lines.append("  · " + t("from_config.overridden_by_option", lang, field=k.replace("_", "-")))
    for k in combined.defaults:
        lines.append("  · " + t("from_config.default." + k, lang))
    return "\n".join(lines)


def _show(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
