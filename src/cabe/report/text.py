"""Pure text rendering of reports (``format_*`` return strings; the CLI prints them).

Every figure names its unit: the chosen one first (GB = 10^9 bytes or GiB = 2^30 bytes), the
other beside it in parentheses.
"""

from __future__ import annotations

from typing import Any

from cabe.i18n import fill, fmt_number, t
from cabe.report.data import ReportData
from cabe.report.knobs import lines as knob_lines
from cabe.units import check_output, fmt_bytes


def format_report(report: ReportData, *, lang: str = "en", units: str = "GB", explain: bool = False) -> str:
    check_output(units, lang)
    lines = _header(report, lang, units)
    lines.append("")
    lines += _components(report, lang, units)
    lines += _beside_peak(report, lang, units)
    lines += _phases(report, lang, units)
    lines += _distributed(report, lang, units)
    if (host := report.extra.get("host")) and host.get("offloaded_activations_bytes"):
        lines.append(fill(t("ui.host_offload", lang), {"host": fmt_bytes(host["pinned_bytes"], lang, units)}, lang))
    if report.paged_bytes:
        lines.append(fill(t("ui.paged", lang), {"paged": fmt_bytes(report.paged_bytes, lang, units)}, lang))
    lines += _lesson(report, lang)
    lines += _fit(report, lang, units)
    facts = {
        "model_type": (report.model or {}).get("model_type", ""),
        **report.setup,
        "lora_unmatched": report.extra.get("lora_unmatched", ""),
    }
    for note in report.notes:
        if note in REPORT_NOTES:
            lines.append("· " + t("note." + note, lang, **facts))
    if explain:
        lines.append("")
        lines.append(format_explain(report, lang=lang))
        if report.extra.get("knobs"):  # each memory knob against the request without it (cabe.knob_effects)
            lines += ["", *knob_lines(report.extra["knobs"], lang, units)]
    return "\n".join(lines)


#: Components listed even when zero (the others only when they hold memory).
ALWAYS_SHOWN = ("weights", "gradients", "optimizer", "activations", "model_states")
#: ReportData notes printed under the table (the distributed notes come with their section).
REPORT_NOTES = (
    "simple_mode",
    "lesson_mode",
    "gemma2_eager",
    "sdpa_gqa_math",
    "paged_outside_allocator",
    "optimizer_modelled",
    "optimizer_layerwise",
    "optimizer_in_backward",
    "grad_accum_keeps_grads",
    "qlora_moe_experts_unquantized",
    "vision_tower_weights_only",
    "llama4_causal_lm_drops_tower",
    "vision_text_only",
    "vision_images",
    "vision_images_siglip",
    "vision_images_qwen3_vl",
    "dora_qlora_modelled",
    "activations_offloaded",
    "mamba2_kernel_modelled",
    "lora_targets_moved_to_experts",
    "lora_experts_not_adapted",
    "lora_target_unmatched",
    "gated_deltanet_kernels_modelled",
    "loss_assumed_hf",
    "fp8_torchao",  # what an fp8 recipe keeps in fp8 and in high precision (cabe.fp8)
    "fp8_te",
    "loss_modelled",
    "objective_dpo",
    "objective_kto",
    "objective_orpo",
    "seq_beyond_max_positions",
    "packing_modelled",
    "analytic_unknown_architecture",
    "trace_lora_all_linear",
    "trace_eager_fallback",
    "trace_grad_accum_simulated",
    "trace_grad_scaler",
    "qlora_no_kbit_prep",
    "qlora_moe_experts_16bit",
    "transformers4_dtype_default",
    "transformers4_moe_modules",
    "transformers4_reentrant",
    "knobs_not_traced",
)
#: Width of the component-label column.
WIDTH = 44


def _header(report: ReportData, lang: str, units: str) -> list[str]:
    """The total (and the phase of the peak), the model, and the parameter and setup lines."""
    lines = [
        f"{t('ui.total', lang)}: {fmt_bytes(report.total_bytes, lang, units)}"
        + (
            f" — {t('ui.peak_at', lang, phase=t('phase.' + report.peak_phase, lang))}"
            if report.mode == "architecture"
            else ""
        )
    ]
    if report.model and report.model.get("name"):
        lines.append(f"model: {report.model.get('display') or report.model['name']} ({report.model['model_type']})")
    if report.mode == "architecture":
        s = report.setup
        lines.append(t("ui.parameters", lang, n=report.parameters, t=report.trainable_parameters))
        lines.append(
            fill(
                t("ui.setup", lang),
                {
                    "method": s["method"],
                    "dtype": s["dtype"],
                    "autocast": s["autocast"],
                    "optimizer": s["optimizer"],
                    "batch": s["batch"],
                    "seq": s["seq"],
                    "eff": s["effective_batch"],
                    "tf": s.get("transformers") or "5",
                },
                lang,
            )
        )
        lines += _loss_line(report, lang)
    return lines


def _loss_line(report: ReportData, lang: str) -> list[str]:
    """The loss kernel and the recipe: what was given, what was assumed, what is not modelled."""
    info = report.extra.get("loss")
    if not info:
        return []
    loss = info["loss"] + (f" ×{info['loss_chunks']}" if info.get("loss_chunks") else "")
    recipe = info["recipe"] or t("ui.recipe_none", lang)
    line = t("ui.loss", lang, loss=loss, recipe=recipe)
    if info["assumed"]:
        line += " " + t("ui.assumed", lang, fields=", ".join(info["assumed"]))
    out = [line]
    if info["unmodelled"]:
        topics = ", ".join(t("recipe.topic." + x, lang) for x in info["unmodelled"])
        out.append(t("ui.recipe_unmodelled", lang, topics=topics))
    return out


def _components(report: ReportData, lang: str, units: str) -> list[str]:
    """One row per component (label, bytes, share of the total), a rule, and the total."""
    lines: list[str] = []
    for name, nbytes in report.components.items():
        if not nbytes and name not in ALWAYS_SHOWN:
            continue
        label = t("component." + name, lang)
        share = f"{fmt_number(round(100 * nbytes / report.total_bytes, 1), lang, 1)}%" if report.total_bytes else ""
        lines.append(f"  {label:<{WIDTH}} {fmt_bytes(nbytes, lang, units):>28}  {share:>6}")
    lines.append(f"  {'─' * (WIDTH + 36)}")
    lines.append(f"  {t('ui.total', lang):<{WIDTH}} {fmt_bytes(report.total_bytes, lang, units):>28}")
    return lines


#: the phases of an SFT step; a report with others (GRPO's generation and reference) lists each phase's peak
SFT_PHASES = ("forward", "backward", "optimizer")
#: the order a preference trainer runs its phases in: it precomputes (before training) or runs KTO's KL rows before
#: the policy's forward, its reference forward after it (cabe.objectives.preference)
STEP_ORDER = ("precompute", "kl", "forward", "reference", "backward", "optimizer")


def _phases(report: ReportData, lang: str, units: str) -> list[str]:
    """A step of several phases (cabe.objectives): each phase's peak, the largest marked."""
    if set(report.phase_peaks) <= set(SFT_PHASES):
        return []
    lines = ["", t("ui.phase_peaks", lang) + ":"]
    order = list(report.phase_peaks)  # GRPO lists its own in the order it runs them
    if (report.setup or {}).get("objective") in ("dpo", "orpo", "kto"):
        order = [p for p in STEP_ORDER if p in order] + [p for p in order if p not in STEP_ORDER]
    for name in order:
        nbytes = report.phase_peaks[name]
        mark = "  ← " + t("ui.peak", lang) if name == report.peak_phase else ""
        lines.append(f"  {t('phase.' + name, lang):<{WIDTH}} {fmt_bytes(nbytes, lang, units):>28}{mark}")
    if (grpo := report.extra.get("grpo")) is not None:
        lines.append(fill(t("ui.grpo_shape." + grpo["generator"], lang), grpo, lang))
    return lines


def _beside_peak(report: ReportData, lang: str, units: str) -> list[str]:
    """Architecture mode: the allocator slack, CUDA context and device figure beside the peak."""
    if report.mode != "architecture":
        return []
    return [
        "",
        fill(
            t("ui.beside_peak", lang),
            {
                "slack": fmt_bytes(report.allocator_slack_bytes, lang, units, both=False),
                "ctx": fmt_bytes(report.cuda_context_bytes, lang, units, both=False),
                "device": fmt_bytes(report.device_bytes, lang, units, both=False),
            },
            lang,
        ),
    ]


def _distributed(report: ReportData, lang: str, units: str) -> list[str]:
    """Several GPUs: the layout, the host RAM per node, and the distributed notes."""
    dist = report.extra.get("distributed")
    if not dist:
        return []
    lines = [
        fill(
            t("ui.distributed", lang),
            {
                "gpus": dist["world_size"],
                "dp": dist["dp"],
                "tp": dist["tp"],
                "pp": dist["pp"],
                "strategy": dist["strategy"],
                "offload": dist["offload"],
            },
            lang,
        )
    ]
    if dist.get("host_ram_bytes_per_node"):
        lines.append(
            fill(
                t("ui.host_ram", lang),
                {
                    "host": fmt_bytes(dist["host_ram_bytes_per_node"], lang, units),
                    "load": fmt_bytes(dist.get("host_ram_load_peak_bytes_per_node", 0), lang, units),
                },
                lang,
            )
        )
    if dist.get("load_path"):
        lines.append(
            fill(
                t("ui.load", lang),
                {
                    "path": t("load.path." + dist["load_path"], lang),
                    "gpu": fmt_bytes(dist["gpu_load_peak_bytes"], lang, units),
                    "host": fmt_bytes(dist["host_ram_load_peak_bytes_per_node"], lang, units),
                    "cache": fmt_bytes(dist["host_page_cache_load_bytes_per_node"], lang, units),
                },
                lang,
            )
        )
    for note in dist.get("notes", []):
        lines.append("· " + t("note." + note, lang))
    return lines


def _lesson(report: ReportData, lang: str) -> list[str]:
    """Lesson mode: the lesson's figure beside the correct one."""
    if not report.lesson:
        return []
    return [
        "",
        t(
            "ui.lesson_vs_correct",
            lang,
            lesson=report.lesson["lesson_gib"],
            correct=report.lesson["correct_gib"],
            bpp=report.lesson["bytes_per_param"],
        ),
    ]


def _fit(report: ReportData, lang: str, units: str) -> list[str]:
    """With a card: whether it fits, what is needed and the margin."""
    if not report.gpu:
        return []
    g = report.gpu
    return [
        "",
        fill(
            t("ui.fit_line", lang),
            {
                "gpu": g["display"],
                "verdict": t("ui.fits" if g["fits"] else "ui.does_not_fit", lang),
                "need": fmt_bytes(g["needed_bytes"], lang, units, both=False),
                "have": fmt_bytes(g["memory_bytes"], lang, units, both=False),
                "margin": fmt_bytes(g["margin_bytes"], lang, units, both=False),
            },
            lang,
        ),
    ]


def format_explain(report: ReportData, *, lang: str = "en") -> str:
    lines = [t("ui.explain", lang) + ":"]
    steps = [(s.key, s.formula, s.params) for s in report.steps]
    dist = report.extra.get("distributed")
    if dist:
        steps += [(d["key"], d["formula"], d.get("params", {})) for d in dist.get("steps", [])]
    for i, (key, formula, step_params) in enumerate(steps, 1):
        params = {k: v for k, v in step_params.items() if k != "detail"}
        label = t("step." + key, lang)
        if label == "step." + key:  # catalogs of other modules key their steps without the prefix
            label = t(key, lang)
        lines.append(f"{i:>2}. {label}")
        lines.append(f"    {fill(formula, _round_params(params), lang)}")
        for d in step_params.get("detail", []) or []:
            lines.append(f"      {d['name']:<36} {d['formula']:>10} = {fmt_number(d['bytes_per_token'], lang)} B")
    return "\n".join(lines)


def render_explain(report: ReportData, *, lang: str = "en", units: str = "GB") -> str:
    """``Report.explain()``: the worked steps, then (a report asked with ``explain=True``) each knob's effect."""
    check_output(units, lang)
    text = format_explain(report, lang=lang)
    if report.extra.get("knobs"):
        text += "\n\n" + "\n".join(knob_lines(report.extra["knobs"], lang, units))
    return text


def _round_params(params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in params.items():
        if isinstance(v, float):
            out[k] = round(v, 2) if abs(v) >= 1 else round(v, 4)
        else:
            out[k] = v
    return out


def fits_on_line(names: list[str], lang: str) -> str:
    """ "Fits on: ..." — the first eight cards of the catalog that hold the run (:func:`cabe.gpus.fits_on`)."""
    if not names:
        return t("ui.fits_on_none", lang)
    return t("ui.fits_on", lang, list=", ".join(names[:8]) + (" …" if len(names) > 8 else ""))


def render_text(report: ReportData, *, lang: str = "en", units: str = "GB", fits_on: list[str] | None = None) -> str:
    """What ``cabe estimate`` prints: the report, then (given the cards it fits on) the "Fits on" line."""
    check_output(units, lang)
    text = format_report(report, lang=lang, units=units)
    if fits_on is not None and report.mode != "simple":
        text += "\n" + fits_on_line(fits_on, lang)
    return text
