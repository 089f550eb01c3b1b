"""``cabe fit``: make a training setup fit a card — largest micro-batch, longest sequence, fewest
GPUs, and the changes that would make it fit, ranked by memory saved and by their cost in speed."""

from __future__ import annotations

import argparse
from typing import Any

from cabe import jsonio, schema
from cabe.cli import options
from cabe.i18n import fmt_number, t

COMMAND = "fit"


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.training(p, COMMAND)
    schema.add_arguments(p, COMMAND, groups=("fit",))
    options.output(p, COMMAND)


def gather(args: argparse.Namespace) -> dict[str, Any]:
    from cabe import solver

    # the training request and the fit fields (gpu, solve, tokens, mfu, price), solved as /api/fit solves them
    body = options.request(args, COMMAND)
    body.update(schema.values_from_args(args, COMMAND, groups=("fit",)))
    return solver.plan_json(body, allow_files=True)


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
    """The single changes by memory saved, then the cheapest combination that fits (if any); time and GPU-hours
    for the same tokens, relative to the current setup."""
    lines = ["", t("plan.changes_header", lang)]
    for r in c["by_memory"]:
        label = _change_label(r, lang)
        verdict = t("ui.fits" if r["fits"] else "ui.does_not_fit", lang)
        lines.append(
            f"  {label:<46} {_b(r['needed_bytes'], lang, units):>11}  "
            f"−{_b(r['saved_bytes'], lang, units):>10}  {_x(r['slowdown'], lang)} {_x(r['gpu_hours_factor'], lang)} "
            f"{verdict}"
        )
    p = c["plan"]
    if p["steps"] and p["fits"]:
        lines.append("")
        slowdown, gpu_hours = (fmt_number(p[k], lang, 2) for k in ("slowdown", "gpu_hours_factor"))
        lines.append(t("plan.plan_header", lang, slowdown=slowdown, gpu_hours=gpu_hours))
        for s in p["steps"]:
            lines.append(
                f"  + {_change_label(s, lang):<44} → {_b(s['needed_bytes'], lang, units):>11}  "
                f"{_x(s['slowdown'], lang)} {_x(s['gpu_hours_factor'], lang)}".rstrip()
            )
    elif not c["fits_now"]:
        lines += ["", t("plan.plan_none", lang)]
    return lines


def _x(f: float, lang: str) -> str:
    return f"×{fmt_number(f, lang, 2):<6}"


def _time(tm: dict, lang: str) -> list[str]:
    """The time per step of the setup that fits (the current one, else the cheapest combination) and, given the
    tokens to train on, the run's hours, GPU-hours and, given a price, its cost; nothing when nothing fits."""
    if tm.get("for") is None:
        return ["", t("plan.time_none", lang)]
    lines = [
        "",
        t(
            "plan.time_step" if tm["for"] == "now" else "plan.time_step_plan",
            lang,
            seconds=fmt_number(round(tm["step_seconds"], 3), lang),
            tflops=fmt_number(round(tm["flops_per_step"] / 1e12, 1), lang),
            mfu=fmt_number(tm["mfu"], lang),
            overhead=fmt_number(tm["overhead"], lang, 2),
        ),
    ]
    if tm.get("run_hours") is not None:
        lines.append(
            t(
                "plan.time_run",
                lang,
                hours=fmt_number(round(tm["run_hours"], 2), lang),
                gpu_hours=fmt_number(round(tm["gpu_hours"], 1), lang),
                tokens=tm["tokens"],
            )
        )
    if tm.get("cost") is not None:
        lines.append(
            t(
                "plan.time_cost",
                lang,
                cost=fmt_number(round(tm["cost"], 2), lang),
                price=fmt_number(tm["price_per_gpu_hour"], lang),
            )
        )
    elif tm.get("price_per_gpu_hour") is not None:
        lines.append(t("plan.time_cost_needs_tokens", lang))
    return lines
