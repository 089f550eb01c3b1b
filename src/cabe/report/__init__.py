"""The report every interface returns (:class:`Report`): its data (:mod:`cabe.report.data`: named components in
bytes that sum to the total, steps, notes, ``to_json()``) and its two views, the text one the CLI prints
(:mod:`cabe.report.text`) and the notebook's HTML (:mod:`cabe.report.html`). The views read the data; the report
hands itself to them (``explain()``, ``_repr_html_()``). Proved by tests/test_python_api.py."""

from __future__ import annotations

from cabe.report.data import ReportData, Step
from cabe.report.html import report_html
from cabe.report.text import render_explain, render_text
from cabe.units import fmt_bytes

__all__ = ["Report", "ReportData", "Step"]


class Report(ReportData):
    """The report, with its views: ``explain()`` (the worked steps in words, ``lang`` "en" or "es") and the
    notebook's rich display."""

    def _repr_html_(self) -> str:
        """Rich display in notebooks: a table in GB and GiB and a stacked bar (no network assets)."""
        return report_html(self)

    def explain(self, lang: str = "en", units: str = "GB") -> str:
        return render_explain(self, lang=lang, units=units)

    def text(self, lang: str | None = None, units: str | None = None) -> str:
        """The text report ``cabe estimate`` prints, in ``lang`` and ``units`` (by default those the report was asked
        in: :func:`cabe.estimate`'s ``lang`` and ``units``, else English and GB)."""
        view = self.__dict__.get("_view") or {}
        return render_text(
            self,
            lang=lang or view.get("lang") or "en",
            units=units or view.get("units") or "GB",
            fits_on=view.get("fits_on"),
        )

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        name = (self.model or {}).get("name")
        what = f"model={name!r}" if name else f"mode={self.mode!r}"
        return f"Report({what}, total={fmt_bytes(self.total_bytes, 'en', both=False)!r})"

    def viewed(self, *, lang: str | None = None, units: str | None = None, fits_on: list[str] | None = None) -> Report:
        """This report, shown by ``str`` in ``lang`` and ``units`` with the "Fits on" line (what the Python API
        sets; the data and ``to_json()`` do not change)."""
        object.__setattr__(self, "_view", {"lang": lang, "units": units, "fits_on": fits_on})
        return self
