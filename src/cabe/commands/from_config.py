"""``cabe from-config FILE...``: estimate from the configs a run already has.

Reads TrainingArguments / SFTConfig, PEFT adapter configs, BitsAndBytesConfig, DeepSpeed,
accelerate (FSDP), axolotl and torchtune files, alone or together (:mod:`cabe.configs`), prints
the same report as ``cabe estimate`` and then which fields were read and which were ignored, and
why. ``--json``: ``cabe estimate --json``'s object plus ``"from_config"``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from cabe.i18n import t


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="config files (JSON or YAML): TrainingArguments/SFTConfig, adapter_config.json, "
        "BitsAndBytesConfig, DeepSpeed, accelerate, axolotl, torchtune",
    )
    p.add_argument(
        "--format",
        dest="config_format",
        default=None,
        help="force the format of every FILE: training_args | peft_config | bnb | deepspeed | "
        "accelerate | axolotl | torchtune (default: detected from the content)",
    )
    p.add_argument("--model", "-m", help="override the model (preset, config.json path or Hugging Face id)")
    p.add_argument("--seq", help="override the sequence length (tokens)")
    p.add_argument("--batch", help="override the micro-batch size")
    p.add_argument("--grad-accum", help="override the gradient-accumulation steps")
    p.add_argument("--gpus", help="total number of GPUs (the configs rarely say; launchers do)")
    p.add_argument("--gpu", help="a card from `cabe gpus`: does it fit?")
    p.add_argument("--explain", action="store_true", help="show each figure's formula and worked numbers")


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    from cabe.cli import _to_int

    out: dict[str, Any] = {}
    if getattr(args, "model", None):
        out["model"] = args.model
    for name in ("seq", "batch", "grad_accum", "gpus"):
        v = getattr(args, name, None)
        if v is not None:
            out[name] = _to_int(name, v)
    return out


def run(args: argparse.Namespace, lang: str, units: str) -> int:
    from cabe import api, configs, gpus
    from cabe.render import format_report

    combined = configs.from_files(args.files, fmt=args.config_format, overrides=overrides_from_args(args))
    body = dict(combined.request)
    if args.gpu:
        body["gpu"] = args.gpu
    report = api.build(body, allow_files=True)
    if args.json:
        out = report.to_json()
        out["fits_on"] = gpus.fits_on(report)
        out["from_config"] = combined.to_json(lang)
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return 0
    print(format_report(report, lang=lang, units=units, explain=args.explain))
    if report.mode != "simple" and not report.gpu:
        fits_on = gpus.fits_on(report)
        print(
            t("ui.fits_on", lang, list=", ".join(fits_on[:8]) + (" …" if len(fits_on) > 8 else ""))
            if fits_on
            else t("ui.fits_on_none", lang)
        )
    print()
    print(format_sources(combined, lang))
    return 0


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
