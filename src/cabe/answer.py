"""The answer of :func:`cabe.fit`, :func:`cabe.infer`, :func:`cabe.lora` and :func:`cabe.trace`: the JSON object the
HTTP API returns and the CLI's ``--json`` prints (a ``dict``: index it, ``json.dumps`` it, compare it), whose ``str``
is the text the CLI prints and whose ``repr`` is one short line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cabe.units import check_output

#: how an answer is written as text: (the answer's data, lang, units) -> the CLI's text
Render = Callable[[dict[str, Any], str, str], str]


class Answer(dict[str, Any]):
    """A command's JSON object, with the CLI's text as ``str`` (in the ``lang`` and ``units`` it was asked in, or
    any other through :meth:`text`)."""

    def __init__(self, data: dict[str, Any], *, command: str, render: Render, lang: str, units: str, summary: str):
        super().__init__(data)
        self._command = command
        self._render = render
        self._lang = lang
        self._units = units
        self._summary = summary

    @property
    def command(self) -> str:
        """The command that answered: ``fit``, ``infer``, ``lora`` or ``trace``."""
        return self._command

    def text(self, lang: str | None = None, units: str | None = None) -> str:
        """The text ``cabe <command>`` prints for the same request."""
        lang, units = lang or self._lang, units or self._units
        check_output(units, lang)
        return self._render(dict(self), lang, units)

    def to_json(self) -> dict[str, Any]:
        """The plain JSON object (a copy)."""
        return dict(self)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"{self._command.capitalize()}({self._summary})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython shows the short line, not the whole object
        p.text(repr(self))
