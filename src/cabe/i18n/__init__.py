"""Words live here, never in the core: one catalog per language (``i18n/<lang>/*.json``).

Each language folder holds JSON files of ``key -> template``; they are merged into one catalog
(``core.json`` for the CLI and reports, ``web.json`` for the page). Templates use ``{name}``
placeholders filled with localized numbers. A test checks that ``es`` and ``en`` have the same
keys and the same placeholders.
"""

from __future__ import annotations

import json
import locale
import math
import os
import re
from functools import cache
from importlib import resources
from typing import Any

LANGS = ("en", "es")
DEFAULT_LANG = "en"


@cache
def catalog(lang: str) -> dict[str, str]:
    lang = lang if lang in LANGS else DEFAULT_LANG
    out: dict[str, str] = {}
    folder = resources.files("cabe") / "i18n" / lang
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".json"):
            out.update(json.loads(entry.read_text(encoding="utf-8")))
    return out


def detect_lang(explicit: str | None = None) -> str:
    """``--lang`` if given, else the locale (LC_ALL / LC_MESSAGES / LANG), else English."""
    if explicit:
        code = explicit.lower()[:2]
        return code if code in LANGS else DEFAULT_LANG
    for var in ("LC_ALL", "LC_MESSAGES", "LANG", "LANGUAGE"):
        v = os.environ.get(var)
        if v:
            code = v.lower()[:2]
            if code in LANGS:
                return code
            if v not in ("C", "POSIX", "C.UTF-8"):
                break
    try:
        loc = locale.getlocale()[0] or ""
    except ValueError:
        loc = ""
    return "es" if loc.lower().startswith("es") else DEFAULT_LANG


def safe_str(x: Any) -> str:
    """``str(x)``, or its type's name where ``str`` itself fails (a list holding 10**5000 passes str()'s digit
    limit): an error's sentence about a value must never raise while it is written."""
    try:
        return str(x)
    except Exception:
        return f"<{type(x).__name__}>"


def fmt_number(x: Any, lang: str, digits: int | None = None) -> str:
    """7.5 -> '7.5' (en) / '7,5' (es); 6738415616 -> '6,738,415,616' / '6.738.415.616'."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return safe_str(x)
    if isinstance(x, int) and x.bit_length() > 200:  # ~60 digits: say how large, not every digit
        return f"{'-' if x < 0 else ''}10^{int((x.bit_length() - 1) * 0.30103)}"
    if isinstance(x, float) and (not math.isfinite(x) or abs(x) >= 1e15):
        return str(x) if not math.isfinite(x) else f"{x:.3g}"
    if isinstance(x, int):
        s = f"{x:,}"
    else:
        if digits is None:
            digits = 1 if abs(x) >= 100 else 2 if abs(x) >= 1 else 4
        s = f"{x:,.{digits}f}"
        if "." in s:
            s = s.rstrip("0").rstrip(".")
    if lang == "es":
        s = s.replace(",", "\u0000").replace(".", ",").replace("\u0000", ".")
    return s


#: Longest text a sentence echoes back (a 4,000-character file name is cut, not repeated).
MAX_ECHO = 120


#: The placeholders that echo what the user typed (the others are cabe's own lists and numbers).
ECHOED = frozenset({"value", "path", "detail", "repo", "key", "first", "second"})


def _clip(text: str) -> str:
    return text if len(text) <= MAX_ECHO else text[: MAX_ECHO - 1] + "…"


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def fill(template: str, params: dict[str, Any], lang: str) -> str:
    def sub(m: re.Match[str]) -> str:
        k = m.group(1)
        if k not in params:
            return m.group(0)
        shown = fmt_number(params[k], lang)
        return _clip(shown) if k in ECHOED else shown

    return _PLACEHOLDER.sub(sub, template)


def t(key: str, lang: str = DEFAULT_LANG, **params: Any) -> str:
    """The sentence for ``key`` in ``lang``, placeholders filled. Unknown keys return the key."""
    return text(key, lang, params)


def text(key: str, lang: str, params: dict[str, Any]) -> str:
    template = catalog(lang).get(key) or catalog(DEFAULT_LANG).get(key) or key
    return fill(template, params, lang)


def error_message(err: Any, lang: str = DEFAULT_LANG) -> str:
    params = dict(err.params)
    field = err.field or ""
    params.setdefault("field", field.replace("_", "-") if field else "")
    key = "error." + err.code
    # a sentence without the "did you mean" part when there is nothing to suggest
    if params.get("suggestions") == "" and key + "_plain" in catalog(lang):
        key += "_plain"
    # a sentence per cause when the error carries one as a code (``why``), e.g. error.mode_unsupported.no_torch
    why = params.get("why")
    if isinstance(why, str) and f"{key}.{why}" in catalog(DEFAULT_LANG):
        key = f"{key}.{why}"
    return text(key, lang, params)


def placeholders(template: str) -> set[str]:
    return set(_PLACEHOLDER.findall(template))
