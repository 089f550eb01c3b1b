"""Estimate from the configs a run already has: the part of ``cabe from-config`` that is no command line's.

:func:`gather` reads the files (paths on the command line, :class:`~cabe.configs.ConfigText` from the page and
``POST /api/from-config``: the same readers and limits, :mod:`cabe.configs`), merges them under the overrides
and builds the report; :func:`answer_json` is ``cabe from-config --json``'s object (``cabe estimate --json``'s
plus ``from_config``), with ``sets``: what each file set, field by field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cabe import api, configs
from cabe import gpus as gpu_catalog
from cabe.i18n import t


def read(
    items: Sequence[Any], *, fmt: str | None = None, overrides: Mapping[str, Any] | None = None
) -> configs.Combined:
    """The files read and merged (a :class:`~cabe.errors.ConfigError` for a bad one)."""
    return configs.from_files(items, fmt=fmt, overrides=overrides)


def build(
    combined: configs.Combined, *, gpu: str | None, allow_files: bool, trace: str | None, explain: bool = False
) -> Any:
    """The report of the request the files make (the card is not in them: it is added here); ``explain``: with each
    memory knob against the request without it (:mod:`cabe.knob_effects`)."""
    body = dict(combined.request)
    if gpu:
        body["gpu"] = gpu
    if explain:
        body["explain"] = True
    return api.build(body, allow_files=allow_files, trace=trace)


def gather(
    items: Sequence[Any],
    *,
    fmt: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    gpu: str | None = None,
    allow_files: bool = True,
    trace: str | None = "process",
    explain: bool = False,
) -> tuple[configs.Combined, Any]:
    combined = read(items, fmt=fmt, overrides=overrides)
    return combined, build(combined, gpu=gpu, allow_files=allow_files, trace=trace, explain=explain)


def sets(combined: configs.Combined, lang: str = "en") -> list[dict[str, Any]]:
    """What each file set: its name, format (and the format's name in ``lang``) and ``{field: value}`` (the weights'
    dtype a file names is ``dtype``; the precision is the file's own word, before the files are merged)."""
    out = []
    for s in combined.sources:
        fields = {("dtype" if k == "_dtype" else k): v for k, v in s.fields.items() if k != "_engine"}
        out.append(
            {
                "file": s.path,
                "format": s.format,
                "format_name": t("from_config.format." + s.format, lang),
                "sets": {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()},
            }
        )
    return out


def from_config_json(combined: configs.Combined, lang: str = "en") -> dict[str, Any]:
    """The ``from_config`` object: the files, what was used and ignored, the request, and what each file set."""
    return {**combined.to_json(lang), "sets": sets(combined, lang)}


def answer_json(combined: configs.Combined, report: Any, lang: str = "en") -> dict[str, Any]:
    """``cabe from-config --json`` and ``POST /api/from-config``: the estimate's object plus ``from_config``."""
    out = report.to_json()
    out["fits_on"] = gpu_catalog.fits_on(report)
    out["from_config"] = from_config_json(combined, lang)
    return out
