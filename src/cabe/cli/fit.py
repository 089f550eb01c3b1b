"""``cabe fit``: make a training setup fit a card — largest micro-batch, longest sequence, fewest
GPUs, and the changes that would make it fit, ranked by memory saved and by their cost in speed."""

from __future__ import annotations

import argparse
from typing import Any

from cabe import jsonio, schema
from cabe.cli import options
from cabe.errors import InvalidValueError
from cabe.i18n import fmt_number, t

COMMAND = "fit"


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.training(p, COMMAND)
    schema.add_arguments(p, COMMAND, groups=("fit",))
    options.output(p, COMMAND)


def gather(args: argparse.Namespace) -> dict[str, Any]:
    from cabe import api, gpus, solver

    body = options.request(args, COMMAND)
    card_name = body.pop("gpu", None)
    src = api.model_source(body, allow_files=True)
    if src is None:
        raise InvalidValueError("missing_model", "model")
    setup = api.setup_from(body)
    card = gpus.gpu(str(card_name))
    what = tuple(w.strip() for w in args.solve.split(",")) if args.solve else solver.SOLVES
    out = solver.solve(src.spec, setup, card, what)
    if args.tokens is not None or args.mfu is not None:
        from cabe.flops import run_time

        tokens = schema.to_float("tokens", args.tokens) if args.tokens is not None else None
        mfu = schema.to_float("mfu", args.mfu) if args.mfu is not None else schema.field("mfu").default
        out["time"] = run_time(src.spec, setup, card, tokens=tokens, mfu=mfu)
    return out


def render(out: dict[str, Any], args: argparse.Namespace, lang: str, units: str) -> str:
    if args.json:
        return jsonio.dumps(out, indent=2)
    return format_plan(out, lang, units)


def _b(n: int, lang: str, units: str) -> str:
    from cabe.units import fmt_bytes

    return fmt_bytes(n, lang, units, both=False)


def format_plan(out: dict, lang: str, units: str) -> str:
    g = out["gpu"]
    now = out["now"]
    lines = [
        t(
            "plan.now",
            lang,
            gpu=g["display"],
            need=_b(now["needed_bytes"], lang, units),
            have=_b(g["memory_bytes"], lang, units),
            verdict=t("ui.fits" if now["fits"] else "ui.does_not_fit", lang),
        )
    ]
    for key in ("batch", "seq"):
        if out.get(key):
            lines.append(_largest_line(key, out[key], lang, units))
    if out.get("gpus"):
        lines.append(_gpus_line(out["gpus"], lang, units))
    if out.get("changes"):
        lines += _changes(out["changes"], lang, units)
    if out.get("time"):
        lines += _time(out["time"], lang)
    lines.append(t("plan.elapsed", lang, ms=out["elapsed_ms"]))
    return "\n".join(lines)


def _largest_line(key: str, a: dict, lang: str, units: str) -> str:
    """The largest micro-batch or longest sequence that fits, and what one more would need."""
    if a["value"] is None:
        return t(f"plan.{key}_none", lang)
    line = t(f"plan.{key}", lang, value=a["value"], need=_b(a["at_value"]["needed_bytes"], lang, units))
    if a.get("one_more"):
        line += " " + t(
            "plan.one_more", lang, value=a["value"] + 1, need=_b(a["one_more"]["needed_bytes"], lang, units)
        )
    elif a["capped"]:
        line += " " + t("plan.capped", lang, limit=a["limit"])
    return line


def _gpus_line(a: dict, lang: str, units: str) -> str:
    if a["value"] is None:
        return t("plan.gpus_none", lang, limit=a["limit"])
    shard = a["shard"] + (f" --param-dtype {a['param_dtype']}" if a.get("param_dtype") else "")
    return t("plan.gpus", lang, value=a["value"], shard=shard, need=_b(a["at_value"]["needed_bytes"], lang, units))


def _change_label(r: dict, lang: str) -> str:
    return t("plan.change." + r["change"], lang, **{k: v for k, v in r["set"].items() if isinstance(v, int)})


def _changes(c: dict, lang: str, units: str) -> list[str]:
    """The single changes by memory saved, then the cheapest combination that fits (if any)."""
    lines = ["", t("plan.changes_header", lang)]
    for r in c["by_memory"]:
        label = _change_label(r, lang)
        verdict = t("ui.fits" if r["fits"] else "ui.does_not_fit", lang)
        lines.append(
            f"  {label:<52} {_b(r['needed_bytes'], lang, units):>11}  "
            f"−{_b(r['saved_bytes'], lang, units):>10}  ×{fmt_number(r['slowdown'], lang, 2):<5} {verdict}"
        )
    p = c["plan"]
    lines.append("")
    if p["steps"] and p["fits"]:
        lines.append(t("plan.plan_header", lang, slowdown=p["slowdown"]))
        for s in p["steps"]:
            lines.append(f"  + {_change_label(s, lang):<50} → {_b(s['needed_bytes'], lang, units)}")
    elif not c["fits_now"]:
        lines.append(t("plan.plan_none", lang))
    return lines


def _time(tm: dict, lang: str) -> list[str]:
    """The time per step and, given the tokens to train on, the run's hours and GPU-hours."""
    lines = [
        "",
        t(
            "plan.time_step",
            lang,
            seconds=round(tm["step_seconds"], 3),
            tflops=round(tm["flops_per_step"] / 1e12, 1),
            mfu=tm["mfu"],
        ),
    ]
    if tm.get("run_hours") is not None:
        lines.append(
            t(
                "plan.time_run",
                lang,
                hours=round(tm["run_hours"], 2),
                gpu_hours=round(tm["gpu_hours"], 1),
                tokens=tm["tokens"],
            )
        )
    return lines
