"""A hand-written SVG of live memory over the traced steps (no plotting library needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

PHASE_COLORS = {
    "setup": "#e5e7eb",
    "forward": "#dbeafe",
    "backward": "#fde7d4",
    "optimizer": "#dcfce7",
}
LINE_COLOR = "#1f2937"
PEAK_COLOR = "#dc2626"
GIB = 2**30


def _nice_step(span: float, target: int = 6) -> float:
    raw = span / max(1, target)
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def timeline_svg(
    timeline: Sequence[Sequence[Any]],
    *,
    peak_bytes: int | None = None,
    peak_event: int | None = None,
    peak_phase: str | None = None,
    step_starts: Sequence[int] = (),
    title: str = "",
    width: int = 960,
    height: int = 420,
) -> str:
    """SVG text for ``timeline`` = [(event_index, phase, live_bytes), ...]."""
    ml, mr, mt, mb = 72, 20, 40, 64
    pw, ph = width - ml - mr, height - mt - mb
    pts = [(int(e), str(p), int(b)) for e, p, b in timeline]
    if not pts:
        pts = [(0, "setup", 0)]
    x_max = max(max(p[0] for p in pts), 1)
    y_top = max(max(p[2] for p in pts), peak_bytes or 0, 1) / GIB
    step = _nice_step(y_top)
    y_max = step * math.ceil(y_top / step) if y_top > 0 else 1.0

    def sx(e: float) -> float:
        return ml + pw * e / x_max

    def sy(gib: float) -> float:
        return mt + ph * (1 - gib / y_max)

    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
    ]
    # phase shading: runs of equal phase
    run_start = 0
    for i in range(1, len(pts) + 1):
        if i == len(pts) or pts[i][1] != pts[run_start][1]:
            x0 = sx(pts[run_start][0])
            x1 = sx(pts[i][0]) if i < len(pts) else sx(x_max)
            color = PHASE_COLORS.get(pts[run_start][1], "#f3f4f6")
            out.append(f'<rect x="{x0:.1f}" y="{mt}" width="{max(x1 - x0, 0.5):.1f}" height="{ph}" fill="{color}"/>')
            run_start = i
    # grid and y axis
    v = 0.0
    while v <= y_max + 1e-9:
        y = sy(v)
        out.append(f'<line x1="{ml}" y1="{y:.1f}" x2="{ml + pw}" y2="{y:.1f}" stroke="#d1d5db" stroke-width="0.5"/>')
        label = f"{v:g}"
        out.append(f'<text x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
        v += step
    out.append(f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{mt + ph}" stroke="#111827"/>')
    out.append(f'<line x1="{ml}" y1="{mt + ph}" x2="{ml + pw}" y2="{mt + ph}" stroke="#111827"/>')
    out.append(
        f'<text x="18" y="{mt + ph / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 18 {mt + ph / 2:.1f})">live allocated memory (GiB)</text>'
    )
    out.append(
        f'<text x="{ml + pw / 2:.1f}" y="{height - 28}" text-anchor="middle">'
        f"allocation event (malloc/free) index</text>"
    )
    # step boundaries
    for k, s in enumerate(step_starts):
        x = sx(s)
        out.append(
            f'<line x1="{x:.1f}" y1="{mt}" x2="{x:.1f}" y2="{mt + ph}" stroke="#6b7280" stroke-dasharray="4 3"/>'
        )
        out.append(f'<text x="{x + 3:.1f}" y="{mt + 12}" fill="#374151">step {k + 1}</text>')
    # the curve (a step function: the level holds until the next event)
    path = []
    for i, (e, _, b) in enumerate(pts):
        x, y = sx(e), sy(b / GIB)
        path.append(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}")
    out.append(f'<path d="{" ".join(path)}" fill="none" stroke="{LINE_COLOR}" stroke-width="1.3"/>')
    # peak
    if peak_bytes is not None and peak_event is not None:
        x, y = sx(max(peak_event, 0)), sy(peak_bytes / GIB)
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{PEAK_COLOR}"/>')
        label = f"peak {peak_bytes / GIB:.2f} GiB" + (f" ({escape(peak_phase)})" if peak_phase else "")
        anchor = "end" if x > ml + pw * 0.7 else "start"
        dx = -8 if anchor == "end" else 8
        out.append(
            f'<text x="{x + dx:.1f}" y="{max(y - 6, mt + 24):.1f}" text-anchor="{anchor}" '
            f'fill="{PEAK_COLOR}" font-weight="bold">{label}</text>'
        )
    # legend
    lx = ml
    for name in ("forward", "backward", "optimizer", "setup"):
        out.append(
            f'<rect x="{lx}" y="{height - 18}" width="12" height="12" fill="{PHASE_COLORS[name]}" stroke="#9ca3af"/>'
        )
        out.append(f'<text x="{lx + 16}" y="{height - 8}">{name}</text>')
        lx += 96
    if title:
        out.append(f'<text x="{ml}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_svg(result: Any, path: str, title: str = "") -> str:
    """Write the timeline of a :class:`~cabe.trace.TraceResult` (or its JSON dict) to ``path``."""
    d = result.to_json() if hasattr(result, "to_json") else dict(result)
    svg = timeline_svg(
        d["timeline"],
        peak_bytes=d.get("peak_bytes"),
        peak_event=d.get("peak_event"),
        peak_phase=d.get("peak_phase"),
        step_starts=d.get("step_starts", ()),
        title=title,
    )
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(svg)
    return path
