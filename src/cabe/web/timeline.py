"""The step's timeline as a chart: what is live at each moment of a training step, forward, backward and
optimizer, stacked by component, with the peak marked (issue 32 item 3).

The moments are the estimate's own (``moments`` of the JSON: :func:`cabe.step.timeline`, each with its phase, where
in the step, its total and its components); on several GPUs they are one GPU's (the estimate is per GPU). The
columns are the moments in the order the step reaches them (:func:`chronological`), not a time scale. Server-rendered SVG like
:mod:`cabe.web.charts` (the same palette: one colour per component), 360 units wide so that its 13 px text is at
least 12 px on a phone's column; the page shows the same numbers in a table beside it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any

from cabe import i18n
from cabe.web.charts import COMPONENT_COLOURS, PALETTE, _label_x, _nice_max, _ticks, colour_index

#: the text size of the chart (px in its viewBox; style.css: svg.chart text)
TEXT_PX = 13
_LAYER = re.compile(r"layer_(\d+)_from_top")


def order(keys: Sequence[str]) -> list[str]:
    """Components in the palette's order (weights at the bottom of a column), others after, by name."""
    rank = {k: i for i, k in enumerate(COMPONENT_COLOURS)}
    return sorted(keys, key=lambda k: (rank.get(k, len(rank)), k))


def peak_index(moments: Sequence[Mapping[str, Any]], at: str | None = None) -> int:
    """The largest moment: the one the estimate names (``peak_at``) among the largest, else the first of them."""
    totals = [int(m["total_bytes"]) for m in moments]
    top = [i for i, t in enumerate(totals) if t == max(totals)]
    return next((i for i in top if moments[i]["where"] == at), top[0])


#: the step's moments in the order they happen (cabe.step.timeline lists them in the order it works them out): the
#: forward's (the vision tower, the first unit gathered, the top layer, the loss), the backward's (the head, its
#: weight's gradient, the flush after it, the layers from the top down, each layer's parts in the order autograd
#: runs them, then the vision tower, the embedding and the end), the optimizer's step
_PHASES = ("forward", "backward", "optimizer")
_FORWARD = {"vision_tower": 0, "start": 1, "top_layer": 2, "loss": 4}
_BACKWARD_FIRST = {"head": 0, "lm_head": 1, "lm_head_chunks": 2, "head.flush": 3}
_BACKWARD_LAST = {"vision_tower": 0, "embedding": 1, "end_of_backward": 2}
_PART = {"recompute": 0, "experts": 1, "flush": 2, "": 3, "attention": 4}


def _when(m: Mapping[str, Any]) -> tuple[int, int, float, int]:
    phase, where = str(m["phase"]), str(m["where"])
    if phase != "backward":
        return (_PHASES.index(phase), 0, _FORWARD.get(where, 3), 0)
    if where in _BACKWARD_FIRST:
        return (1, 0, _BACKWARD_FIRST[where], 0)
    if where in _BACKWARD_LAST:
        return (1, 2, _BACKWARD_LAST[where], 0)
    base, _, part = where.partition(".")
    layer = _LAYER.fullmatch(base)
    index = 0.0 if base == "top_layer" else float("inf") if base == "bottom_layer" else None
    if layer:
        index = float(layer.group(1))
    return (1, 1, float("inf") if index is None else index, _PART.get(part, 3))


def chronological(moments: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The moments in the order the step reaches them, each once (a run of one layer is its top and its bottom: the
    same moment twice); as given when a phase is not the three of a supervised step."""
    if any(m["phase"] not in _PHASES for m in moments):
        return list(moments)
    out: list[Mapping[str, Any]] = []
    for m in sorted(moments, key=_when):
        if out and (out[-1]["phase"], out[-1]["where"], out[-1]["total_bytes"]) == (
            m["phase"],
            m["where"],
            m["total_bytes"],
        ):
            continue
        out.append(m)
    return out


def phase_label(phase: str, lang: str) -> str:
    key = f"web.timeline.phase.{phase}"
    return i18n.t(key, lang) if key in i18n.catalog(i18n.DEFAULT_LANG) else phase.replace("_", " ")


def _phase_words(phase: str, lang: str) -> str:
    """The phase as a sentence names it ("the backward pass": the page's ``web.phase.*``)."""
    key = f"web.phase.{phase}"
    return i18n.t(key, lang) if key in i18n.catalog(i18n.DEFAULT_LANG) else phase_label(phase, lang)


def where_label(where: str, lang: str) -> str:
    """``layer_30_from_top.attention`` -> "layer 30 from the top, attention's backward" (the catalog's words;
    a name the catalog does not know: the name with spaces)."""
    en = i18n.catalog(i18n.DEFAULT_LANG)
    base, _, suffix = where.partition(".")
    layer = _LAYER.fullmatch(base)
    if layer:
        text = i18n.t("web.timeline.where.layer_from_top", lang, n=int(layer.group(1)))
    elif f"web.timeline.where.{base}" in en:
        text = i18n.t(f"web.timeline.where.{base}", lang)
    else:
        text = base.replace("_", " ")
    if suffix:
        key = f"web.timeline.where_part.{suffix}"
        text = i18n.t("web.timeline.where_with", lang, where=text, part=i18n.t(key, lang) if key in en else suffix)
    return text


def _bands(moments: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, int]]:
    """The runs of consecutive moments of one phase: (phase, first index, last index + 1)."""
    out: list[tuple[str, int, int]] = []
    for i, m in enumerate(moments):
        if out and out[-1][0] == m["phase"]:
            out[-1] = (out[-1][0], out[-1][1], i + 1)
        else:
            out.append((str(m["phase"]), i, i + 1))
    return out


def _rows(labels: Sequence[tuple[float, str]], lo: float, hi: float) -> list[tuple[float, int, str]]:
    """Place each centred label (x, text) on the first row where it overlaps no other, kept inside [lo, hi]
    (widths estimated at 0.6 em a character): (x, row, text)."""
    ends: list[float] = []  # each row's right end so far
    out = []
    for x, text in labels:
        w = 0.6 * TEXT_PX * len(text)
        x = min(max(x, lo + w / 2), hi - w / 2)
        row = next((r for r, end in enumerate(ends) if x - w / 2 >= end + 6), len(ends))
        if row == len(ends):
            ends.append(0.0)
        ends[row] = x + w / 2
        out.append((x, row, text))
    return out


def timeline_chart(
    moments: Sequence[Mapping[str, Any]],
    *,
    title: str,
    unit: str,
    div: float,
    fmt: Callable[[float], str],
    peak_text: str,
    peak: int,
    labels: Mapping[str, str],
    phases: Mapping[str, str],
    wheres: Sequence[str],
    width: int = 360,
) -> str:
    """One column per moment (its components stacked, in ``unit`` = bytes / ``div``), the phases as bands
    labelled under the axis, the peak's column (index ``peak``) outlined and labelled ``peak_text`` with its total.
    ``labels``: component -> its name; ``phases``: phase -> its name; ``wheres``: each moment's place, in words."""
    if not moments:
        return ""
    n = len(moments)
    totals = [int(m["total_bytes"]) / div for m in moments]
    top = _nice_max(max(totals) * 1.04)
    left, right, pad_top, plot_h = 46, 8, 40, 170
    pw = width - left - right
    slot = pw / n
    bar_w = max(slot * 0.72, 1.0)
    y0 = pad_top + plot_h
    sx = lambda i: left + slot * i  # noqa: E731
    sy = lambda v: pad_top + plot_h * (1 - v / top)  # noqa: E731
    bands = _bands(moments)
    placed = _rows([(sx(a) + slot * (b - a) / 2, phases.get(p, p)) for p, a, b in bands], 2, width - 2)
    rows = 1 + max(r for _, r, _ in placed)
    height = y0 + 10 + 18 * rows + 6
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart timeline" viewBox="0 0 {width} {height}" '
        f'role="img" aria-labelledby="timeline-title"><title id="timeline-title">{escape(title)}</title>'
    ]
    for j, (phase, a, b) in enumerate(bands):  # the phases: alternate shades behind their columns
        parts.append(
            f'<rect x="{sx(a):.1f}" y="{pad_top}" width="{slot * (b - a):.1f}" height="{plot_h}" '
            f'class="band{j % 2}" data-phase="{escape(phase)}"/>'
        )
    for tv in _ticks(top, 4):
        y = sy(tv)
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{left - 4}" y="{y + 4:.1f}" class="tick" text-anchor="end">{escape(fmt(tv))}</text>'
        )
    parts.append(f'<text x="4" y="14" class="axis-label">{escape(unit)}</text>')
    for i, m in enumerate(moments):
        comps = m.get("components") or {"total": m["total_bytes"]}
        x = sx(i) + (slot - bar_w) / 2
        name = f"{phases.get(m['phase'], m['phase'])} · {wheres[i]}: {fmt(totals[i])} {unit}"
        cls = "moment peak" if i == peak else "moment"
        parts.append(
            f'<g class="{cls}" data-bytes="{int(m["total_bytes"])}" data-phase="{escape(str(m["phase"]))}" '
            f'data-where="{escape(str(m["where"]))}"><title>{escape(name)}</title>'
        )
        acc = 0.0
        for k in order([k for k, v in comps.items() if v > 0]):
            v = comps[k] / div
            parts.append(
                f'<rect x="{x:.1f}" y="{sy(acc + v):.1f}" width="{bar_w:.1f}" height="{max(sy(acc) - sy(acc + v), 0.3):.1f}" '
                f'fill="{PALETTE[colour_index(k) % len(PALETTE)]}"><title>{escape(labels.get(k, k))}: '
                f"{escape(fmt(v))} {unit}</title></rect>"
            )
            acc += v
        parts.append("</g>")
    # the peak: its column outlined, a mark above it and its total
    px, py = sx(peak) + (slot - bar_w) / 2, sy(totals[peak])
    text = f"{peak_text} · {fmt(totals[peak])} {unit}"
    tx, anchor = _label_x(px + bar_w / 2 - 4, text, width, TEXT_PX * 1.08)
    cx = px + bar_w / 2
    parts.append(
        f'<rect x="{px - 1.5:.1f}" y="{py - 1.5:.1f}" width="{bar_w + 3:.1f}" height="{y0 - py + 1.5:.1f}" '
        f'class="peak-outline"/><path d="M{cx - 5:.1f},{py - 12:.1f} L{cx + 5:.1f},{py - 12:.1f} L{cx:.1f},{py - 4:.1f} Z" '
        f'class="peak-mark"/><text x="{tx:.1f}" y="{min(py - 16, pad_top - 6):.1f}" class="peak-label" '
        f'text-anchor="{anchor}">{escape(text)}</text>'
    )
    parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y0}" y2="{y0}" class="axis"/>')
    for (_phase, a, b), (lx, row, label) in zip(bands, placed):  # the phases' names, under their columns
        ly = y0 + 18 + 18 * row
        parts.append(
            f'<line x1="{sx(a) + 2:.1f}" x2="{sx(b) - 2:.1f}" y1="{y0 + 4}" y2="{y0 + 4}" class="phase-rule"/>'
            + (f'<line x1="{lx:.1f}" x2="{lx:.1f}" y1="{y0 + 4}" y2="{ly - 12}" class="phase-lead"/>' if row else "")
            + f'<text x="{lx:.1f}" y="{ly}" class="phase-label" text-anchor="middle">{escape(label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def view(
    out: Mapping[str, Any], u: Any, lang: str, component_label: Callable[[str, str], str]
) -> dict[str, Any] | None:
    """What timeline.html shows of an estimate: the chart, its legend and the moments as a table (None when the
    estimate has no moments: the seed calculator's, a lesson's). ``u``: the page's units (cabe.web.page.Units)."""
    moments = chronological(out.get("moments") or [])
    if not moments:
        return None
    from markupsafe import Markup

    keys = order(list({k for m in moments for k, v in (m.get("components") or {}).items() if v > 0}))
    labels = {k: component_label(k, lang) for k in keys}
    phases = {m["phase"]: phase_label(m["phase"], lang) for m in moments}
    wheres = [where_label(str(m["where"]), lang) for m in moments]
    per_gpu = bool(out.get("distributed"))
    peak = peak_index(moments, out.get("peak_at"))
    svg = timeline_chart(
        moments,
        title=i18n.t("web.timeline.title_gpu" if per_gpu else "web.timeline.title", lang),
        unit=u.name,
        div=u.div,
        fmt=u.num,
        peak_text=i18n.t("web.timeline.peak", lang),
        peak=peak,
        labels=labels,
        phases=phases,
        wheres=wheres,
    )
    rows = [
        (phases[m["phase"]], wheres[i], u.of(m["total_bytes"]), i == peak, int(m["total_bytes"]))
        for i, m in enumerate(moments)
    ]
    return {
        "svg": Markup(svg),
        "legend": [(f"c{colour_index(k)}", labels[k]) for k in keys],
        "rows": rows,
        "per_gpu": per_gpu,
        "peak": (_phase_words(moments[peak]["phase"], lang), wheres[peak], u.label(moments[peak]["total_bytes"])),
    }
