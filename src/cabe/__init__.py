"""cabe — ¿cabe en mi GPU? How much GPU memory training an LLM takes, part by part, and why.

    >>> import cabe
    >>> r = cabe.estimate(model="llama-3.1-8b", method="qlora", batch=4, seq=2048)
    >>> r.total_bytes, r.components["weights"]            # doctest: +SKIP
    >>> print(r.explain(lang="es"))                          # doctest: +SKIP

The analytic path imports no torch: an estimate takes microseconds.
"""

from __future__ import annotations

from typing import Any

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
from cabe.units import GB, GiB

__version__ = "0.1.0"

__all__ = [
    "estimate",
    "Report",
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


def estimate(model: Any = None, **options: Any) -> Report:
    """Estimate the peak GPU memory of a training step; the Python face of ``cabe estimate``.

    Args:
        model: a preset name (``"llama-3.1-8b"``), a path to a config.json, a Hugging Face id, or a
            config dict. Leave it out and give ``params`` (billions) for the seed's simple mode. An
            architecture no family module reads is answered from a traced step (the ``[trace]`` extra;
            :mod:`cabe.via_trace`).
        **options: the CLI's options in snake_case: ``params``, ``bytes_per_param``,
            ``activations_gb``, ``method``, ``precision``, ``optimizer``, ``optimizer_impl``,
            ``batch``, ``seq``, ``grad_accum``, ``checkpointing``, ``attention``, ``lora_rank``,
            ``lora_alpha``, ``lora_targets``, ``quant``, ``double_quant``, ``compute_dtype``,
            ``trainable_layers``, ``prompt_tokens``, ``gpu``.

    Returns:
        A :class:`Report`: ``total_bytes`` (peak allocated, bytes), ``components`` (name -> bytes,
        summing to the total), ``explain(lang=...)``, ``to_json()``.

    Raises:
        CabeError: for bad input, with a ``code`` and a sentence in ``.to_dict(lang)``.
    """
    from cabe import api

    body = dict(options)
    if isinstance(model, dict):
        body["config"] = model
    elif model is not None:
        body["model"] = model
    return api.build(body, allow_files=True, trace="process")
