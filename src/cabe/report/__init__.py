"""The report every interface returns (:class:`Report`): its data (:mod:`cabe.report.data`: named components in
bytes that sum to the total, steps, notes, ``to_json()``) and its two views, the text one the CLI prints
(:mod:`cabe.report.text`) and the notebook's HTML (:mod:`cabe.report.html`). The views read the data; the report
hands itself to them (``explain()``, ``_repr_html_()``). Proved by tests/test_python_api.py."""

from __future__ import annotations

from cabe.report.data import ReportData, Step
from cabe.report.html import report_html
from cabe.report.text import render_explain

__all__ = ["Report", "ReportData", "Step"]


class Report(ReportData):
    """The report, with its views: ``explain()`` (the worked steps in words, ``lang`` "en" or "es") and the
    notebook's rich display."""

    def _repr_html_(self) -> str:
        """Rich display in notebooks: a table in GB and GiB and a stacked bar (no network assets)."""
        return report_html(self)

    def explain(self, lang: str = "en", units: str = "GB") -> str:
        return render_explain(self, lang=lang, units=units)
