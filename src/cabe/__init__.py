"""cabe — ¿cabe en mi GPU? How much GPU memory training an LLM takes, part by part, and why.

    >>> import cabe
    >>> r = cabe.estimate(model="llama-3.1-8b", method="qlora", batch=4, seq=2048)
    >>> r.total_bytes, r.components["weights"]            # doctest: +SKIP
    >>> print(r.explain(lang="es"))                          # doctest: +SKIP

The analytic path imports no torch: an estimate takes microseconds.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from cabe.answer import Answer
from cabe.errors import (
    CabeError,
    ConfigError,
    HubError,
    InvalidValueError,
    MissingDependencyError,
    UnknownPresetError,
)
from cabe.report import Report, Step
from cabe.training import TrainingSetup
from cabe.units import GB, GiB, check_output

__version__ = "0.1.0"

__all__ = [
    "estimate",
    "fit",
    "infer",
    "lora",
    "trace",
    "Report",
    "Answer",
    "Step",
    "TrainingSetup",
    "GB",
    "GiB",
    "CabeError",
    "InvalidValueError",
    "UnknownPresetError",
    "ConfigError",
    "HubError",
    "MissingDependencyError",
    "__version__",
]


def _request(model: Any, options: dict[str, Any]) -> tuple[dict[str, Any], str, str]:
    """The request dict of a call (``model`` a name or path, or a config dict), and the ``lang`` and ``units`` its
    text is written in: checked here (``bad_choice``), never ignored."""
    body = dict(options)
    lang, units = (None if v is None or v == "" else v for v in (body.pop("lang", None), body.pop("units", None)))
    check_output("GB" if units is None else units, lang)
    if isinstance(model, dict):
        body["config"] = model
    elif model is not None:
        body["model"] = model
    return body, lang or "en", units or "GB"


def estimate(model: Any = None, **options: Any) -> Report:
    """Estimate the peak GPU memory of a training step; the Python face of ``cabe estimate``.

    Args:
        model: a preset name (``"llama-3.1-8b"``), a path to a config.json, a Hugging Face id, or a
            config dict. Leave it out and give ``params`` (billions) for the seed's simple mode. An
            architecture no family module reads is answered from a traced step (the ``[trace]`` extra;
            :mod:`cabe.via_trace`).
        **options: the request fields of :mod:`cabe.schema` (``docs/options.md``) in snake_case, as
            ``POST /api/estimate`` takes them: ``method``, ``precision``, ``optimizer``, ``batch``, ``seq``,
            ``checkpointing``, ``lora_rank``, ``gpus``, ``shard``, ``gpu`` ...; ``lang`` and ``units`` for ``str()``;
            ``explain=True`` adds each memory knob's effect against the request without it (``knobs`` in
            ``to_json()``, printed by ``explain()``: :mod:`cabe.knob_effects`; one more estimate per knob).

    Returns:
        A :class:`Report`: ``total_bytes`` (peak allocated, bytes), ``components`` (name -> bytes,
        summing to the total), ``explain(lang=...)``, ``to_json()`` (``cabe estimate --json`` without
        ``fits_on``); ``str(report)`` is the text ``cabe estimate`` prints.

    Raises:
        CabeError: for bad input, with a ``code``, the ``field`` and the sentence as ``str(error)``.
    """
    from cabe import api, gpus

    body, lang, units = _request(model, options)
    report = api.build(body, allow_files=True, trace="process")
    return report.viewed(lang=lang, units=units, fits_on=gpus.fits_on(report))


def fit(model: Any = None, **options: Any) -> Answer:
    """Make a training setup fit a card; the Python face of ``cabe fit`` and ``POST /api/fit``.

    Takes :func:`estimate`'s fields, ``gpu`` (required), ``solve`` (``"batch,seq,gpus,changes"`` or a list) and, for
    the time of the setup that fits, ``tokens``, ``mfu`` and ``price_per_gpu_hour``. Returns an :class:`Answer`:
    the JSON object ``cabe fit --json`` prints; ``str()`` is its text. Raises :class:`CabeError`.
    """
    from cabe import solver
    from cabe.cli.fit import format_plan

    body, lang, units = _request(model, options)
    out = solver.plan_json(body, allow_files=True)
    summary = f"model={body.get('model', 'config')!r}, gpu={out['gpu']['name']!r}, fits_now={out['now']['fits']}"
    return Answer(out, command="fit", render=format_plan, lang=lang, units=units, summary=summary)


def infer(model: Any = None, **options: Any) -> Answer:
    """Memory of serving a model; the Python face of ``cabe infer`` and ``POST /api/infer``.

    Takes the serving fields of :mod:`cabe.schema` (``weights``, ``kv_dtype``, ``context``, ``batch``, ``gpu``,
    ``engine``, ``tp`` ...). Returns an :class:`Answer` (``cabe infer --json``); ``str()`` is its text.
    Raises :class:`CabeError`.
    """
    from cabe import api
    from cabe.cli.infer import format_infer
    from cabe.inference import infer_json
    from cabe.request_check import check_values
    from cabe.units import fmt_bytes

    body, lang, units = _request(model, options)
    check_values(body, "api.infer")  # the serving core reads its numbers as given
    src = api.model_source(body, allow_files=True) if isinstance(body.get("model"), str) else None
    if src is not None and src.kind not in ("preset", "hub"):  # a local config.json, read as the CLI reads it
        body = {**{k: v for k, v in body.items() if k != "model"}, "config": dict(src.config)}
    out = infer_json(body)
    total = out.get("total_bytes")
    shown = fmt_bytes(total, "en", both=False) if isinstance(total, int) else "?"
    summary = f"model={out.get('model')!r}, total={shown!r}"
    return Answer(out, command="infer", render=format_infer, lang=lang, units=units, summary=summary)


def lora(model: Any = None, **options: Any) -> Answer:
    """LoRA adapter parameters per target module; the Python face of ``POST /api/lora`` (``lora_rank``,
    ``lora_targets``). Returns an :class:`Answer`; ``str()`` is the text ``cabe lora`` prints.
    Raises :class:`CabeError`."""
    import argparse

    from cabe import api
    from cabe.cli import lora as lora_command

    body, lang, units = _request(model, options)
    src, rank, rows = api.lora_rows(body, allow_files=True)
    out = api.lora_answer(src, rank, rows)
    adapter = lora_command.Adapter(src.spec, rank, rows)

    def render(data: dict[str, Any], lang: str, units: str) -> str:
        return lora_command.render(adapter, argparse.Namespace(json=False), lang, units)

    summary = f"model={out['model']!r}, rank={rank}, parameters={out['total_parameters']}"
    return Answer(out, command="lora", render=render, lang=lang, units=units, summary=summary)


def _trace(model: Any = None, **options: Any) -> Answer:
    """A training step run through PyTorch on fake CUDA tensors, beside the estimate; the Python face of
    ``cabe trace`` (needs the ``[trace]`` extra: :class:`MissingDependencyError` without it). Takes
    :func:`estimate`'s fields and ``steps``, ``mode``, ``timeline``, ``plot``, ``expandable_segments``,
    ``inventory``. Returns an :class:`Answer` (``cabe trace --json``); ``str()`` is its text."""
    import argparse

    from cabe import schema
    from cabe.cli import trace as trace_command
    from cabe.errors import InvalidValueError as Invalid
    from cabe.request_check import check_values

    body, lang, units = _request(model, options)
    if "config" in body:
        raise Invalid("not_string", "model", value="a config dict")  # the trace reads a name, an id or a path
    known = schema.names("trace")
    unknown = [k for k in body if k not in known]
    if unknown:
        raise Invalid("unknown_field", unknown[0], allowed=", ".join(known))
    check_values(body, "trace")  # Python values, where the command line has strings argparse and the core convert
    args = argparse.Namespace(json=False, lang=lang, units=units)
    for f in schema.fields_for("trace", output=False):
        setattr(args, f.dest, body.get(f.name, f.default if f.cli_default else None))
    out = trace_command.gather(args)

    def render(data: dict[str, Any], lang: str, units: str) -> str:
        return trace_command.render(data, args, lang, units)

    total = out.get("peak_bytes")
    summary = f"model={body.get('model')!r}, peak_bytes={total}"
    return Answer(out, command="trace", render=render, lang=lang, units=units, summary=summary)


class _TraceModule(types.ModuleType):
    """``cabe.trace``: the package of the trace (``cabe.trace.trace_step`` ...) and, called, the Python face of
    ``cabe trace`` (:func:`_trace`). The package and the function share the name, so the package is made callable
    rather than hidden by a function (or the function by the package once anything imports it)."""

    def __call__(self, model: Any = None, **options: Any) -> Answer:
        return _trace(model, **options)


class _Package(types.ModuleType):
    """The ``cabe`` package: when the import system binds the ``cabe.trace`` package here, it becomes callable."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "trace" and type(value) is types.ModuleType:
            value.__class__ = _TraceModule
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    """``cabe.trace`` before anything imported it: importing the package binds it (callable) through :class:`_Package`;
    it installs the fake-CUDA shim as ``import cabe.trace`` does, and loads no torch."""
    if name == "trace":
        import cabe.trace  # noqa: F401  (binds cabe.trace through _Package.__setattr__)

        return sys.modules["cabe.trace"]
    raise AttributeError(f"module 'cabe' has no attribute {name!r}")
