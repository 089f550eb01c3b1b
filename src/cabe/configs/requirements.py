"""A pip requirements file or ``pip freeze`` output (``requirements.txt``): the transformers the run installs.

The line it pins decides what cabe models (:mod:`cabe.transformers_line`: MoE experts' layout, the default load
dtype, checkpointing). ``transformers==4.51.3`` (or ``===``, ``~=4.51``) sets ``transformers``; a range (``>=4.46``)
sets the line only when its bounds allow one line (``>=4.46,<5``); every other package is read and left alone (no
figure of cabe depends on its version). Lines are PEP 508 requirements (pip's requirements-file syntax: comments,
``-r`` / ``-c`` / ``--index-url`` options, environment markers after ``;``, extras in brackets)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe.configs import _base
from cabe.configs._base import KEY as KEY
from cabe.configs._base import SPEC, Collector

FORMAT = "requirements"
TITLE = "pip requirements"


def read(path_or_dict: Any) -> Mapping[str, Any]:
    return _base.read(path_or_dict)  # (a requirements file is recognised there: _base.requirements_lines)


def looks_like(data: Mapping[str, Any]) -> bool:
    return isinstance(data.get(KEY), Mapping)


def to_request(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
    """Request fields, the fields used, and the ``(field, reason)`` pairs ignored."""
    return collect(data).result()


def collect(data: Mapping[str, Any]) -> Collector:
    c = Collector()
    for name, spec in (data.get(KEY) or {}).items():
        if name != "transformers":
            c.ignore(name, "no_effect")
            continue
        version = _transformers(str(spec))
        if version is None:
            c.ignore(name, "unsupported_value")
        else:
            c.set("transformers", version, name)
    return c


def _transformers(spec: str) -> str | None:
    """The version a specifier pins, or the one line its bounds allow, else None."""
    parts = dict(SPEC.findall(spec))
    pinned = parts.get("===") or parts.get("==")
    if pinned and "*" not in pinned:
        return pinned
    if "~=" in parts:  # ~=4.51 is >=4.51,==4.*
        return parts["~="].split(".", 1)[0]
    low = parts.get(">=") or parts.get(">")
    high = parts.get("<") or parts.get("<=")
    if low and high:
        lo, hi = int(low.split(".")[0]), int(high.split(".")[0])
        if lo == hi or (lo + 1 == hi and "<" in parts and high.split(".")[1:] in ([], ["0"], ["0", "0"])):
            return str(lo)
    return None
