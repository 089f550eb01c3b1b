"""Server-side SVG charts: a stacked bar against card capacities, and memory curves.

Plain strings, no dependencies. Each chart has a <title>/<desc> and role="img"; the page shows
the same numbers in a table next to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

PALETTE = (
    "#2f6db5", "#d9822b", "#3a9a5b", "#b8475a", "#7c5cbf", "#8c6d3f", "#c05fa8", "#5f7f8f", "#a3a3a3", "#4d4d4d",
    "#1f9e9e", "#9e8f1f",
    # the buffers of several GPUs (cabe.parallel): the parameters' in blues, the gradients' in greens and yellows,
    # the buckets' in reds and browns
    "#a1caf1", "#0b3c6b", "#6fd3e0", "#98df8a", "#8db600", "#2b3d26", "#0f7a52", "#c5e1a5", "#b5bd89", "#f3c300",
    "#f99379", "#e25822", "#c2b280", "#882d17", "#e68fac", "#17becf", "#5254a3",
    # TRL's trainers (cabe.objectives): the reference model, the colocated vLLM pool, the rollout buffer
    "#6b4c9a", "#d4a017", "#e7969c",
)  # fmt: skip
#: one colour per component everywhere (training and serving, bar and table): its index in PALETTE
COMPONENT_COLOURS = {
    "weights": 0,
    "optimizer": 1,
    "gradients": 2,
    "activations": 3,
    "weight_copies": 4,
    "logits": 5,
    "optimizer_temporaries": 6,
    "cuda_workspaces": 7,
    "allocator_slack": 8,
    "cuda_context": 9,
    "kv_cache": 10,
    "comm": 11,
    # on several GPUs: the components a sharded step adds (each run's moments hold up to 16 at once)
    "master_weights": 12,
    "gathered_params": 13,
    "prefetched_params": 14,
    "unsharded_grads": 15,
    "reduce_scatter_input": 16,
    "grads_in_partition": 17,
    "grad_partitions": 18,
    "fp32_grad_partition": 19,
    "whole_grad": 20,
    "whole_grad_reduced": 21,
    "ipg_buckets": 22,
    "ddp_buckets": 23,
    "reduce_flat": 24,
    "reduce_cast": 25,
    "grad_norm_or_flatten": 26,
    "p2p_buffers": 27,
    "gathered_experts": 28,
    "reference_weights": 29,
    "vllm_engine": 30,
    "rollout": 31,
}
#: the smallest text of a chart, in CSS px at the chart's narrowest (style.css: svg.chart text)
MIN_TEXT_PX = 12


def colour_index(key: str) -> int:
    """The palette index of a component (a key not in the map: a stable index from its name)."""
    return COMPONENT_COLOURS.get(key, sum(map(ord, key)) % len(PALETTE))


def _nice_max(x: float) -> float:
    if x <= 0:
        return 1.0
    import math

    e = 10 ** math.floor(math.log10(x))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * e >= x:
            return m * e
    return 10 * e


def _ticks(top: float, n: int = 5) -> list[float]:
    return [top * i / n for i in range(n + 1)]


def _label_x(cx: float, text: str, width: int, px: float) -> tuple[float, str]:
    """Where a label of a vertical line at ``cx`` goes so that it stays inside the chart: right of the
    line, else left of it, else against the right edge (its width estimated at 0.6 em a character)."""
    w = 0.6 * px * len(text)
    if cx + 4 + w <= width - 2:
        return cx + 4, "start"
    if cx - 4 - w >= 2:
        return cx - 4, "end"
    return width - 2, "end"


def _wrap(text: str, chars: int) -> list[str]:
    """``text`` as one line, or two split at the space nearest its middle when longer than ``chars``."""
    if len(text) <= chars or " " not in text:
        return [text]
    cut = min((i for i, c in enumerate(text) if c == " "), key=lambda i: abs(i - len(text) / 2))
    return [text[:cut], text[cut + 1 :]]


def stacked_bar(
    segments: Sequence[tuple[str, float, int]],
    markers: Sequence[tuple[str, float, bool]],
    *,
    title: str,
    unit: str,
    fmt: Callable[[float], str],
    width: int = 360,
) -> str:
    """A horizontal stacked bar (``segments``: label, value in ``unit``, palette index) and vertical
    markers (``markers``: card label, capacity in ``unit``, chosen?). 360 units wide, so its 13 px text
    is at least 12 px on a phone's column (about 340 px) and larger beside the form on a desktop."""
    total = sum(v for _, v, _ in segments)
    top = _nice_max(max([total] + [m[1] for m in markers]) * 1.02)
    left, right = 12, 16
    plot_w = width - left - right
    bar_y, bar_h = 34, 40
    label_rows = len(markers)
    height = bar_y + bar_h + 30 + 18 * label_rows + 8
    sx = lambda v: left + plot_w * (v / top)  # noqa: E731
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'role="img" aria-labelledby="bar-title"><title id="bar-title">{escape(title)}</title>'
    ]
    x = 0.0
    for label, v, colour in segments:
        if v <= 0:
            continue
        w = plot_w * (v / top)
        parts.append(
            f'<rect x="{sx(x):.1f}" y="{bar_y}" width="{max(w, 0.5):.1f}" height="{bar_h}" '
            f'fill="{PALETTE[colour % len(PALETTE)]}"><title>{escape(label)}: {escape(fmt(v))} {unit}</title></rect>'
        )
        x += v
    # axis
    axis_y = bar_y + bar_h + 14
    for tv in _ticks(top):
        parts.append(
            f'<line x1="{sx(tv):.1f}" x2="{sx(tv):.1f}" y1="{bar_y + bar_h}" y2="{bar_y + bar_h + 4}" '
            f'class="axis"/><text x="{sx(tv):.1f}" y="{axis_y}" class="tick" text-anchor="middle">'
            f"{escape(fmt(tv))}</text>"
        )
    parts.append(f'<text x="{left}" y="14" class="tick">{escape(unit)}</text>')
    for j, (label, cap, chosen) in enumerate(markers):
        cx = sx(cap)
        cls = "marker chosen" if chosen else "marker"
        ly = axis_y + 18 + 18 * j
        text = f"{label} · {fmt(cap)} {unit}"
        tx, anchor = _label_x(cx, text, width, 13 * (1.08 if chosen else 1.0))
        parts.append(
            f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{bar_y - 10}" y2="{ly - 4}" class="{cls}"/>'
            f'<text x="{tx:.1f}" y="{ly}" class="{"marker-label chosen" if chosen else "marker-label"}" text-anchor="{anchor}">'
            f"{escape(text)}</text>"
        )
    tx, anchor = _label_x(sx(total), f"{fmt(total)} {unit}", width, 14)
    parts.append(
        f'<text x="{tx:.1f}" y="{bar_y - 14}" class="total-label" text-anchor="{anchor}">{escape(fmt(total))} {unit}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def line_chart(
    points: Sequence[tuple[float, float]],
    limit: float | None,
    *,
    title: str,
    x_label: str,
    y_label: str,
    limit_label: str,
    fmt: Callable[[float], str],
    fmt_x: Callable[[float], str],
    width: int = 300,
    height: int = 210,
    chart_id: str = "c",
) -> str:
    """Memory (y) against a size (x, drawn on a log2 axis), with the card's limit as a line."""
    import math

    left, right, top_pad, bottom = 44, 18, 22, 40
    pw, ph = width - left - right, height - top_pad - bottom
    if not points:
        return ""
    xs = [math.log2(max(p[0], 1)) for p in points]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    ymax = _nice_max(max([p[1] for p in points] + ([limit] if limit else [])) * 1.05)
    sx = lambda lx: left + pw * (lx - x0) / (x1 - x0)  # noqa: E731
    sy = lambda v: top_pad + ph * (1 - v / ymax)  # noqa: E731
    tid = f"{chart_id}-title"
    x_lines = _wrap(x_label, int((width - 8) / (0.6 * 13)))  # a long axis label on two lines (a language's words)
    height += 16 * (len(x_lines) - 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-labelledby="{tid}"><title id="{tid}">{escape(title)}</title>'
    ]
    for tv in _ticks(ymax, 4):
        y = sy(tv)
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{left - 4}" y="{y + 4:.1f}" class="tick" text-anchor="end">{escape(fmt(tv))}</text>'
        )
    for (xv, _), lx in zip(points, xs):
        parts.append(
            f'<text x="{sx(lx):.1f}" y="{top_pad + ph + 14}" class="tick" text-anchor="middle">'
            f"{escape(fmt_x(xv))}</text>"
        )
    for j, line in enumerate(x_lines):
        x_mid = min(max(left + pw / 2, 4 + 0.3 * 13 * len(line)), width - 4 - 0.3 * 13 * len(line))
        parts.append(
            f'<text x="{x_mid:.1f}" y="{height - 6 - 16 * (len(x_lines) - 1 - j)}" class="axis-label" '
            f'text-anchor="middle">{escape(line)}</text>'
        )
    parts.append(f'<text x="4" y="12" class="axis-label">{escape(y_label)}</text>')
    if limit:
        ly = sy(limit)
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{ly:.1f}" y2="{ly:.1f}" class="limit"/>'
            f'<text x="{left + pw}" y="{ly - 4:.1f}" class="limit-label" text-anchor="end">'
            f"{escape(limit_label)}</text>"
        )
    path = " ".join(f"{sx(lx):.1f},{sy(p[1]):.1f}" for p, lx in zip(points, xs))
    parts.append(f'<polyline points="{path}" class="curve"/>')
    for p, lx in zip(points, xs):
        over = limit is not None and p[1] > limit
        parts.append(
            f'<circle cx="{sx(lx):.1f}" cy="{sy(p[1]):.1f}" r="3.5" class="{"pt over" if over else "pt"}">'
            f"<title>{escape(fmt_x(p[0]))}: {escape(fmt(p[1]))}</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)
