"""The estimate of an architecture the analytic path does not know, answered from the trace.

When no family module reads a config's ``model_type`` (:attr:`cabe.models.ModelSource.known` is
false), ``cabe estimate``, ``cabe from-config``, :func:`cabe.estimate` and ``POST /api/estimate``
answer automatically from a traced step (:mod:`cabe.trace`: the model transformers builds from the
config, without ``trust_remote_code``, stepped on fake CUDA tensors) instead of refusing, and the
report says so (note ``analytic_unknown_architecture``). The choice is automatic rather than a flag:
a known architecture is answered analytically as before (under 0.3 s), and only a config that was
refused before now takes the seconds a trace takes.

Without the ``[trace]`` extra (torch, transformers; peft for adapters, bitsandbytes for 4-bit) the
refusal is a typed error that names the extra (``unknown_architecture_needs_trace``). Nothing here
imports torch: the packages are looked up with :func:`importlib.util.find_spec`, and the trace runs
in this process (the command line) or in the long-lived trace worker (:mod:`cabe.trace.worker`, the
HTTP server: torch stays out of the server and traces run one at a time).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from cabe import optimizer, schema
from cabe.errors import ConfigError, InvalidValueError, MissingDependencyError
from cabe.report import Report, Step
from cabe.training import TrainingSetup

#: The report's note: the analytic path does not know the architecture; the figures are the trace's.
NOTE = "analytic_unknown_architecture"
#: Training steps traced: the second is the steady state (the optimizer state exists from step 2 on).
STEPS = 2
#: Where the trace runs: ``process`` (here: the command line, Python) or ``worker`` (the long-lived
#: trace subprocess: the HTTP server).
WHERE = ("process", "worker")
#: Most decoder layers a config may ask the trace to build: eight times the deepest published LLM (Llama 3.1
#: 405B, 126 layers). The trace's time grows with the layers (each runs its ops on fake tensors), so a config
#: of 10^9 layers would hold the trace worker, and the server with it, for hours; no family module bounds it
#: here (models.MAX_PARAMETERS bounds the analytic path's configs).
MAX_LAYERS = 1024
#: The config keys that count layers in transformers' configs (Llama's, GPT-2's, and others').
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers")
#: Setup fields that make a several-GPU run; the trace runs one process on one GPU.
_ONE_GPU_FIELDS = ("gpus", "shard", "offload", "tp", "pp", "ep")
#: Setup fields the trace does not act on (the analytic path models them). None since packed and padding-free rows
#: are traced (cabe.trace.inputs.packed_positions: position_ids restarting per document; transformers' own mask
#: functions find the documents, masking_utils.py:862-870, whatever the architecture's module): the traced figure
#: is what that model's code does with such a batch.
_NOT_TRACED: tuple[str, ...] = ()


def missing_package(setup: TrainingSetup) -> str | None:
    """The first package of the ``[trace]`` extra this setup needs that cannot be imported, or None.

    The trace needs torch and transformers; PEFT for LoRA / QLoRA / prompt tuning (``trace.deps.needs_peft``);
    bitsandbytes for QLoRA and the bitsandbytes optimizers, galore-torch for GaLore (the optimizer registry's
    ``extras``)."""
    needed = ["torch", "transformers"]
    if setup.method in ("lora", "qlora", "prompt-tuning"):
        needed.append("peft")
    extras = optimizer.get(setup.optimizer).extras
    if setup.method == "qlora" or "bitsandbytes" in extras:
        needed.append("bitsandbytes")
    if "galore-torch" in extras:
        needed.append("galore_torch")
    for name in needed:
        if importlib.util.find_spec(name) is None:
            return name
    return None


def check(config: Mapping[str, Any], setup: TrainingSetup) -> None:
    """Refuse what the trace cannot answer before it starts: the extra missing (``model``), more than
    :data:`MAX_LAYERS` layers, a several-GPU setup (the trace is one GPU; ``unknown_architecture_one_gpu`` names
    the first such field), or a field the trace does not act on (``unknown_architecture_not_traced``)."""
    package = missing_package(setup)
    if package is not None:
        raise MissingDependencyError(
            "unknown_architecture_needs_trace",
            "model",
            model_type=str(config.get("model_type")),
            extra="trace",
            package=package,
        )
    layers = max(_layer_counts(config), default=0)
    if layers > MAX_LAYERS:
        raise ConfigError(
            "unknown_architecture_too_deep", "model", model_type=str(config.get("model_type")), limit=MAX_LAYERS
        )
    fields = [(name, "unknown_architecture_one_gpu") for name in _ONE_GPU_FIELDS]
    for name, code in fields + [(name, "unknown_architecture_not_traced") for name in _NOT_TRACED]:
        if getattr(setup, name) != schema.field(name).default:
            raise InvalidValueError(code, name, value=getattr(setup, name), model_type=str(config.get("model_type")))


def _layer_counts(config: Mapping[str, Any], depth: int = 0) -> list[int]:
    """Every layer count in the config, nested ones (``text_config``) included."""
    out = [v for k, v in config.items() if k in _LAYER_KEYS and isinstance(v, int) and not isinstance(v, bool)]
    if depth < 4:
        for v in config.values():
            if isinstance(v, Mapping):
                out += _layer_counts(v, depth + 1)
    return out


def report(
    config: Mapping[str, Any],
    setup: TrainingSetup,
    *,
    name: str = "",
    meta: Mapping[str, Any] | None = None,
    where: str = "process",
) -> Report:
    """The :class:`~cabe.report.Report` of ``setup`` on the model ``config`` describes, from a traced step.

    Raises :class:`~cabe.errors.CabeError`: the extra missing, a several-GPU setup, or what the trace
    refuses (an architecture transformers does not know, not a causal LM, bad LoRA targets...)."""
    from cabe.families import config_dtype
    from cabe.precision import resolve

    if where not in WHERE:
        raise ValueError(where)
    check(config, setup)
    setup = resolve(setup, config_dtype(config))
    traced = _trace(dict(config), setup, where)
    facts = dict(traced.get("model") or {})
    layers = facts.get("num_layers")
    if setup.method == "freeze" and isinstance(layers, int) and setup.trainable_layers > layers:
        # the analytic path refuses it too (analytic.estimate_model); the trace would train every layer
        raise InvalidValueError(
            "out_of_range", "trainable_layers", value=setup.trainable_layers, minimum=0, maximum=layers
        )
    return from_trace(traced, setup, name=name, meta=meta)


def _trace(config: dict[str, Any], setup: TrainingSetup, where: str) -> dict[str, Any]:
    """The trace's JSON object (``TraceResult.to_json`` with its note codes)."""
    if where == "worker":
        from cabe.trace.worker import request

        return request("trace", config, setup, STEPS)
    from cabe.trace import trace_step

    return trace_step(config, setup, steps=STEPS).to_json(note_codes=True)


def from_trace(
    traced: Mapping[str, Any], setup: TrainingSetup, *, name: str = "", meta: Mapping[str, Any] | None = None
) -> Report:
    """A report of the trace's figures: the peak and its components as the trace split them, the phase
    peaks, the allocator's slack as the trace's replay of the caching allocator found it (reserved minus
    allocated), the model's facts as transformers built it. ``setup`` is the resolved setup (``dtype``
    read from the config)."""
    from cabe.analytic import DEFAULT_CUDA_CONTEXT_BYTES

    facts = dict(traced.get("model") or {})
    peak = int(traced["peak_bytes"])
    tokens = setup.batch * setup.seq
    codes = [c for c in traced.get("note_codes", []) if isinstance(c, str)]
    return Report(
        mode="architecture",
        total_bytes=peak,
        components={k: int(v) for k, v in traced["components"].items()},
        parameters=int(facts.get("parameters") or traced.get("parameters") or 0),
        trainable_parameters=int(traced.get("trainable_parameters") or 0),
        peak_phase=str(traced["peak_phase"]),
        phase_peaks={k: int(v) for k, v in traced["phase_peaks"].items()},
        steps=(
            Step(
                key="via_trace",
                formula="trace: {steps} steps, {mode} tensors, {seconds} s",
                bytes=peak,
                params={"steps": STEPS, "mode": traced.get("mode"), "seconds": traced.get("seconds")},
            ),
        ),
        setup={
            **setup.to_dict(),
            "optimizer_given": setup.optimizer_given,
            "effective_batch": setup.effective_batch,
            "tokens": tokens,
        },
        model={"name": name, **facts, **(meta or {})},
        paged_bytes=int(traced.get("paged_bytes") or 0),
        cuda_context_bytes=DEFAULT_CUDA_CONTEXT_BYTES,
        allocator_slack_bytes=max(0, int(traced.get("reserved_bytes") or 0) - peak),
        notes=(NOTE, *codes),
        extra={
            "answered_by": "trace",
            "trace": {
                "mode": traced.get("mode"),
                "steps": STEPS,
                "seconds": traced.get("seconds"),
                "first_step_peak_bytes": traced.get("first_step_peak_bytes"),
                "reserved_bytes_expandable_segments": traced.get("reserved_bytes_expandable_segments"),
                "attention_kernels": traced.get("attention_kernels"),
            },
        },
    )
