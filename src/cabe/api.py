"""One request shape for every interface: a dict of snake_case fields -> a Report.

The CLI turns its options into this dict, the HTTP API takes it as JSON, the web page builds it
from its form. Fields (all optional, but a model or a parameter count is needed):

* ``params`` (billions), ``bytes_per_param``, ``activations_gb`` — the seed's simple mode;
  ``params`` without ``bytes_per_param`` is the lesson's mode (precision + optimizer).
* ``model`` (a preset name or Hugging Face id; a local path too when ``allow_files``) or
  ``config`` (a config.json object).
* every :class:`~cabe.training.TrainingSetup` field: ``method``, ``precision``, ``optimizer``,
  ``optimizer_impl``, ``batch``, ``seq``, ``grad_accum``, ``checkpointing``, ``attention``,
  ``lora_rank``, ``lora_alpha``, ``lora_targets``, ``quant``, ``double_quant``,
  ``compute_dtype``, ``trainable_layers``, ``prompt_tokens``.
* ``gpu``: a card name for the "fits?" answer.

The fields, their types, ranges and defaults are :mod:`cabe.schema`'s (``api.estimate``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cabe import gpus as gpu_catalog
from cabe import models, schema, via_trace
from cabe.analytic import estimate_lesson, estimate_model, estimate_simple
from cabe.errors import CabeError, InvalidValueError
from cabe.report import Report
from cabe.training import TrainingSetup

SETUP_FIELDS = tuple(f.name for f in schema.SETUP_FIELDS)
#: what ``build`` accepts (besides ``lang`` and ``units``), in the order error messages list them
REQUEST_FIELDS = schema.names("api.estimate")


def setup_from(body: Mapping[str, Any]) -> TrainingSetup:
    """The setup of a request: the given fields over the defaults (:func:`cabe.schema.resolve_defaults`).
    A field given that would not act here is refused first (:func:`check_applicable`)."""
    check_applicable(body)
    return TrainingSetup(**schema.resolve_defaults(body))


def model_source(body: Mapping[str, Any], *, allow_files: bool) -> models.ModelSource | None:
    config = body.get("config")
    model = body.get("model")
    if config is not None and config != "":
        return models.from_mapping(config)
    if model is None or model == "":
        return None
    if not isinstance(model, str):
        raise InvalidValueError("not_string", "model", value=model)
    if not allow_files:
        text = model.strip()
        if text.lower() not in models.preset_names():
            if text.startswith((".", "/", "~")) or text.endswith(".json") or "\\" in text:
                raise InvalidValueError("no_files_here", "model", value=model)
            if "/" in text:
                return models.hub_model(text)
            return models.preset(text)
    return models.resolve(model)


def build(body: Mapping[str, Any], *, allow_files: bool = False, trace: str | None = None) -> Report:
    """Validate a request and compute its report. Raises :class:`~cabe.errors.CabeError`.

    ``trace``: where to trace a model whose architecture no family module reads (:mod:`cabe.via_trace`:
    ``process`` here, ``worker`` in the trace worker); None refuses it (``unsupported_architecture``)."""
    if not isinstance(body, Mapping):
        raise InvalidValueError("body_not_object", None)
    unknown = [k for k in body if k not in REQUEST_FIELDS and k not in ("lang", "units")]
    if unknown:
        raise InvalidValueError("unknown_field", unknown[0], allowed=", ".join(REQUEST_FIELDS))
    setup = setup_from(body)
    src = model_source(body, allow_files=allow_files)
    params = body.get("params")
    if src is not None:
        if params not in (None, ""):
            raise InvalidValueError("model_and_params", "params")
        meta = {
            "source": src.kind,
            **{k: v for k, v in src.meta.items() if k in ("display", "hf_id", "gated", "family")},
        }
        if not src.known and trace is not None:
            report = via_trace.report(src.config, setup, name=src.name, meta=meta, where=trace)
            limit = (report.model or {}).get("max_positions")
            report = _with(report, notes=report.notes + beyond_limits(_Limit(limit or 0), setup.seq))
        else:
            spec = src.spec  # unsupported_architecture when no family module reads it and no trace is asked
            report = estimate_model(spec, setup, model_meta=meta)
            report = _with(report, notes=report.notes + beyond_limits(spec, setup.seq))
    elif params not in (None, ""):
        bpp = body.get("bytes_per_param")
        act = body.get("activations_gb") or 0.0
        if bpp not in (None, ""):
            report = estimate_simple(params, bpp, act)
        else:
            report = estimate_lesson(params, setup, act)
    else:
        raise InvalidValueError("missing_model", "model")
    card_name = body.get("gpu")
    if card_name:
        card = gpu_catalog.gpu(str(card_name))
        if report.mode == "architecture":
            report = _with(report, cuda_context_bytes=card.cuda_context_bytes)
        bf16 = src is not None and gpu_catalog.needs_bf16(report)
        fit = gpu_catalog.fit(report, card, precision="bf16" if bf16 else None)
        report = _with(report, gpu=fit)
    return report


def check_applicable(body: Mapping[str, Any]) -> None:
    """Every option acts or is refused: the first field given that would not act here
    (:func:`cabe.schema.inapplicable`) is a typed error naming it."""
    for name, code, params in schema.inapplicable(body):
        raise InvalidValueError(code, name, **{"value": body.get(name), **params})


def beyond_limits(spec: Any, seq: int) -> tuple[str, ...]:
    """Note codes for inputs past what the model was built for: a sequence longer than its
    ``max_position_embeddings`` (the memory is still computed; the model was not trained for it)."""
    limit = getattr(spec, "max_positions", 0) or 0
    return ("seq_beyond_max_positions",) if limit and seq > limit else ()


@dataclass(frozen=True)
class _Limit:
    """The one fact :func:`beyond_limits` reads, for a model without a spec (traced)."""

    max_positions: int


def _with(report: Report, **changes: Any) -> Report:
    from dataclasses import replace

    return replace(report, **changes)


def estimate_json(
    body: Mapping[str, Any], *, allow_files: bool = False, fits: bool = True, trace: str | None = None
) -> dict[str, Any]:
    """The JSON object of ``cabe estimate --json`` and ``POST /api/estimate`` (``trace``: see :func:`build`)."""
    report = build(body, allow_files=allow_files, trace=trace)
    out = report.to_json()
    if fits:
        out["fits_on"] = gpu_catalog.fits_on(report)
    return out


def error_json(err: CabeError, lang: str = "en") -> dict[str, Any]:
    return {"error": err.to_dict(lang)}
