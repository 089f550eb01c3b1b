"""Rich display of a :class:`~cabe.report.Report` in Jupyter: a table and an inline SVG bar.

``Report._repr_html_`` calls :func:`report_html`; nothing is fetched from the network (no scripts,
fonts or style sheets), so it renders the same offline and in exported notebooks.
"""

from __future__ import annotations

from html import escape

from cabe.i18n import fmt_number, t
from cabe.report.data import ReportData
from cabe.units import GB, GiB

#: One colour per component, in report order; others cycle through the tail.
COLORS = {
    "weights": "#4C72B0",
    "master_weights": "#64B5CD",
    "weight_copies": "#8172B3",
    "gradients": "#DD8452",
    "optimizer": "#C44E52",
    "optimizer_temporaries": "#DA8BC3",
    "cuda_workspaces": "#8C8C8C",
    "activations": "#55A868",
    "logits": "#CCB974",
    "model_states": "#4C72B0",
    "other": "#8C8C8C",
}
_CYCLE = ("#937860", "#8C8C8C", "#76B7B2", "#EDC948", "#B07AA1", "#FF9DA7", "#9C755F", "#BAB0AC")


def _color(name: str, i: int) -> str:
    return COLORS.get(name) or _CYCLE[i % len(_CYCLE)]


def _num(x: float, lang: str) -> str:
    return fmt_number(round(x, 2 if x < 10 else 1), lang, 2 if x < 10 else 1)


def report_html(report: ReportData, lang: str = "en") -> str:
    """An HTML fragment: a caption, a stacked bar (inline SVG) and a table of components in GB and GiB."""
    total = report.total_bytes
    parts = [(name, n) for name, n in report.components.items() if n > 0]
    width, height = 600, 28
    x = 0.0
    rects = []
    for i, (name, n) in enumerate(parts):
        w = width * n / total if total else 0
        label = escape(t("component." + name, lang))
        rects.append(
            f'<rect x="{x:.2f}" y="0" width="{w:.2f}" height="{height}" fill="{_color(name, i)}">'
            f"<title>{label}: {_num(n / GB, lang)} GB</title></rect>"
        )
        x += w
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'viewBox="0 0 {width} {height}" style="display:block;margin:4px 0">{"".join(rects)}</svg>'
    )
    rows = []
    for i, (name, n) in enumerate(report.components.items()):
        share = f"{fmt_number(round(100 * n / total, 1), lang, 1)}%" if total else ""
        swatch = (
            f'<span style="display:inline-block;width:10px;height:10px;margin-right:6px;'
            f'background:{_color(name, i)}"></span>'
        )
        rows.append(
            f'<tr><td style="text-align:left">{swatch}{escape(t("component." + name, lang))}</td>'
            f"<td>{_num(n / GB, lang)} GB</td><td>{_num(n / GiB, lang)} GiB</td><td>{share}</td></tr>"
        )
    head = (
        f'<tr><th style="text-align:left">{escape(t("notebook.component", lang))}</th><th>GB</th><th>GiB</th>'
        f"<th>{escape(t('notebook.share', lang))}</th></tr>"
    )
    foot = (
        f'<tr style="font-weight:bold"><td style="text-align:left">{escape(t("notebook.total", lang))}</td>'
        f"<td>{_num(total / GB, lang)} GB</td><td>{_num(total / GiB, lang)} GiB</td><td></td></tr>"
    )
    model = (report.model or {}).get("display") or (report.model or {}).get("name")
    caption = escape(t("notebook.caption", lang, model=model)) if model else escape(t("notebook.total", lang))
    return (
        f'<div class="cabe-report"><div style="font-weight:bold">{caption}: {_num(total / GB, lang)} GB '
        f"({_num(total / GiB, lang)} GiB)</div>{svg}"
        f'<table style="border-collapse:collapse;text-align:right">{head}{"".join(rows)}{foot}</table></div>'
    )
