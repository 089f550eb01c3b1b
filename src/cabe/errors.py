"""Typed errors for bad input.

Every error cabe raises for user input carries a machine-readable ``code``, the
``field`` it is about (a CLI option / JSON field name in snake_case, or ``None``),
and ``params`` used to fill the sentence from the language catalog. The core never
builds sentences itself: :func:`cabe.i18n.error_message` does, in the user's language.

Hierarchy::

    CabeError                      (base; exit code 2 on the CLI, HTTP 422 on the API)
    ├── InvalidValueError          a number out of range, NaN, a bad choice
    ├── UnknownPresetError         unknown model preset or GPU name
    ├── ConfigError                a config.json that is malformed or unsupported
    ├── HubError                   a Hugging Face id that cannot be fetched (gated, unknown, offline)
    ├── MissingDependencyError     an optional extra is not installed
    └── UnsupportedVersionError    an installed release the trace cannot run (outside the window, or without a
                                   private name one family's patch needs)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cabe.i18n import error_message, fmt_number, safe_str


class CabeError(ValueError):
    """Base class of all user-facing errors."""

    def __init__(self, code: str, field: str | None = None, **params: Any) -> None:
        self.code = code
        self.field = field
        self.params: Mapping[str, Any] = dict(params)
        # the sentence is written when asked for (``str``), in the catalog's words: never here, where a value too
        # large to print (10**5000) would raise while the error is being made
        super().__init__(code)

    def __str__(self) -> str:
        """The one-sentence message, in English (``to_dict(lang)`` or :func:`cabe.i18n.error_message` for another)."""
        try:
            return error_message(self, "en")
        except Exception:  # a value no catalog sentence can hold: the code and the field still say what is wrong
            return f"{self.code} ({self.field})" if self.field else self.code

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, field={self.field!r})"

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole (a worker process hands errors back)
        return (_rebuild, (type(self), self.code, self.field, dict(self.params)))

    def to_dict(self, lang: str = "en") -> dict[str, Any]:
        return {
            "code": self.code,
            "field": self.field,
            "params": {k: _jsonable(v) for k, v in self.params.items()},
            "message": error_message(self, lang),
        }


def _rebuild(cls: type[CabeError], code: str, field: str | None, params: dict[str, Any]) -> CabeError:
    return cls(code, field, **params)


def _jsonable(v: Any) -> Any:
    """A parameter as strict JSON holds it: a non-finite float or a 60-digit integer becomes text, so
    that the error answer itself can always be written."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 63:
        return fmt_number(v, "en")
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return safe_str(v)


class InvalidValueError(CabeError):
    """A value is out of range, not a number, or not one of the allowed choices."""


class UnknownPresetError(CabeError):
    """A model preset or GPU name that cabe does not know."""


class ConfigError(CabeError):
    """A config.json that is malformed or describes an unsupported architecture."""


def trace_failed(exc: Exception) -> ConfigError:
    """A trace's own failure (an architecture or op the simulation cannot run) as one typed sentence."""
    return ConfigError("trace_failed", None, why="exception", detail=f"{type(exc).__name__}: {str(exc)[:400]}")


class HubError(CabeError):
    """A Hugging Face model id whose config.json could not be fetched."""


class MissingDependencyError(CabeError):
    """An optional extra (``[trace]``, ``[web]``, ``[hub]``) is not installed."""


class UnsupportedVersionError(CabeError):
    """An installed release (transformers, PEFT, torch ...) the trace cannot run: outside the supported window
    (``trace_unsupported_version``), or without a private name one family's patch needs
    (``trace_unsupported_transformers``, that family only)."""
