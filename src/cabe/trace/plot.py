"""A hand-written SVG of live memory over the traced steps (no plotting library needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Frame:
    """The plot area: margins, size, and the scales from (event, GiB) to pixels."""

    width: int
    height: int
    x_max: float
    y_max: float
    step: float
    ml: int = 72
    mr: int = 20
    mt: int = 40
    mb: int = 64

    @property
    def pw(self) -> int:
        return self.width - self.ml - self.mr

    @property
    def ph(self) -> int:
        return self.height - self.mt - self.mb

    def sx(self, e: float) -> float:
        return self.ml + self.pw * e / self.x_max

    def sy(self, gib: float) -> float:
        return self.mt + self.ph * (1 - gib / self.y_max)


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
    pts = [(int(e), str(p), int(b)) for e, p, b in timeline]
    if not pts:
        pts = [(0, "setup", 0)]
    x_max = max(max(p[0] for p in pts), 1)
    y_top = max(max(p[2] for p in pts), peak_bytes or 0, 1) / GIB
    step = _nice_step(y_top)
    y_max = step * math.ceil(y_top / step) if y_top > 0 else 1.0
    f = _Frame(width, height, x_max, y_max, step)
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
    ]
    out += _phase_bands(f, pts)
    out += _axes(f)
    out += _step_lines(f, step_starts)
    out.append(_curve(f, pts))
    if peak_bytes is not None and peak_event is not None:
        out += _peak(f, peak_bytes, peak_event, peak_phase)
    out += _legend(f)
    if title:
        out.append(f'<text x="{f.ml}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _phase_bands(f: _Frame, pts: list[tuple[int, str, int]]) -> list[str]:
    """Phase shading: one rectangle per run of equal phase."""
    out = []
    run_start = 0
    for i in range(1, len(pts) + 1):
        if i == len(pts) or pts[i][1] != pts[run_start][1]:
            x0 = f.sx(pts[run_start][0])
            x1 = f.sx(pts[i][0]) if i < len(pts) else f.sx(f.x_max)
            color = PHASE_COLORS.get(pts[run_start][1], "#f3f4f6")
            out.append(
                f'<rect x="{x0:.1f}" y="{f.mt}" width="{max(x1 - x0, 0.5):.1f}" height="{f.ph}" fill="{color}"/>'
            )
            run_start = i
    return out


def _axes(f: _Frame) -> list[str]:
    """The grid, the y axis labels, both axes and their titles."""
    ml, mt, pw, ph = f.ml, f.mt, f.pw, f.ph
    out = []
    v = 0.0
    while v <= f.y_max + 1e-9:
        y = f.sy(v)
        out.append(f'<line x1="{ml}" y1="{y:.1f}" x2="{ml + pw}" y2="{y:.1f}" stroke="#d1d5db" stroke-width="0.5"/>')
        out.append(f'<text x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end">{v:g}</text>')
        v += f.step
    out.append(f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{mt + ph}" stroke="#111827"/>')
    out.append(f'<line x1="{ml}" y1="{mt + ph}" x2="{ml + pw}" y2="{mt + ph}" stroke="#111827"/>')
    out.append(
        f'<text x="18" y="{mt + ph / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 18 {mt + ph / 2:.1f})">live allocated memory (GiB)</text>'
    )
    out.append(
        f'<text x="{ml + pw / 2:.1f}" y="{f.height - 28}" text-anchor="middle">'
        f"allocation event (malloc/free) index</text>"
    )
    return out


def _step_lines(f: _Frame, step_starts: Sequence[int]) -> list[str]:
    out = []
    for k, s in enumerate(step_starts):
        x = f.sx(s)
        out.append(
            f'<line x1="{x:.1f}" y1="{f.mt}" x2="{x:.1f}" y2="{f.mt + f.ph}" stroke="#6b7280" stroke-dasharray="4 3"/>'
        )
        out.append(f'<text x="{x + 3:.1f}" y="{f.mt + 12}" fill="#374151">step {k + 1}</text>')
    return out


def _curve(f: _Frame, pts: list[tuple[int, str, int]]) -> str:
    """The curve (a step function: the level holds until the next event)."""
    path = []
    for i, (e, _, b) in enumerate(pts):
        x, y = f.sx(e), f.sy(b / GIB)
        path.append(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}")
    return f'<path d="{" ".join(path)}" fill="none" stroke="{LINE_COLOR}" stroke-width="1.3"/>'


def _peak(f: _Frame, peak_bytes: int, peak_event: int, peak_phase: str | None) -> list[str]:
    x, y = f.sx(max(peak_event, 0)), f.sy(peak_bytes / GIB)
    label = f"peak {peak_bytes / GIB:.2f} GiB" + (f" ({escape(peak_phase)})" if peak_phase else "")
    anchor = "end" if x > f.ml + f.pw * 0.7 else "start"
    dx = -8 if anchor == "end" else 8
    return [
        f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{PEAK_COLOR}"/>',
        f'<text x="{x + dx:.1f}" y="{max(y - 6, f.mt + 24):.1f}" text-anchor="{anchor}" '
        f'fill="{PEAK_COLOR}" font-weight="bold">{label}</text>',
    ]


def _legend(f: _Frame) -> list[str]:
    out = []
    lx = f.ml
    for name in ("forward", "backward", "optimizer", "setup"):
        out.append(
            f'<rect x="{lx}" y="{f.height - 18}" width="12" height="12" fill="{PHASE_COLORS[name]}" stroke="#9ca3af"/>'
        )
        out.append(f'<text x="{lx + 16}" y="{f.height - 8}">{name}</text>')
        lx += 96
    return out


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
