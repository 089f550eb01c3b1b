"""``cabe trace``: the training step run through PyTorch on fake CUDA tensors (needs ``cabe[trace]``),
with the analytic estimate of the same step beside it; ``cabe measure`` runs it for real on a GPU."""

from __future__ import annotations

import argparse
from typing import Any

from cabe import jsonio, schema
from cabe.cli import options
from cabe.errors import ConfigError, InvalidValueError, MissingDependencyError
from cabe.i18n import t
from cabe.via_trace import NOTE

COMMAND = "trace"


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.training(p, COMMAND)
    options.output(p, COMMAND)
    schema.add_arguments(p, COMMAND, groups=("trace",))


def inputs(args: argparse.Namespace, command: str) -> tuple[dict[str, Any], Any]:
    """The config dict and the :class:`~cabe.training.TrainingSetup` the flags describe."""
    from cabe import api

    body = options.request(args, command)
    src = api.model_source(body, allow_files=True)
    if src is None:
        raise InvalidValueError("missing_model", "model")
    setup = api.setup_from(body)
    if setup.objective == "grpo" and setup.use_vllm:  # vLLM's kernels do not run on fake tensors
        raise ConfigError("trace_grpo_vllm", "use_vllm", value=True)
    one_gpu(setup)
    return dict(src.config), setup


def one_gpu(setup: Any) -> None:
    """A several-GPU setup is traced as rank 0 of the real engine on a fake process group
    (:mod:`cabe.trace.distributed`); what that cannot run is refused here, naming the field, before torch loads."""
    if setup.distributed:
        from cabe.trace.distributed import refusal

        refusal(setup)


def gather(args: argparse.Namespace) -> dict[str, Any]:
    try:
        from cabe.trace import cli as trace_cli
    except ImportError as exc:
        raise MissingDependencyError("missing_extra", None, extra="trace", package=exc.name or "torch") from None
    config, setup = inputs(args, COMMAND)
    out = trace_cli.run(args, config, setup)
    # the analytic estimate of the same step, beside the trace: how far apart they are
    from cabe import families
    from cabe.analytic import estimate_model

    if config.get("model_type") not in families.supported_model_types():
        # no family module reads it: the trace alone, and a note that says so (cabe.via_trace.NOTE)
        out["analytic"] = "unknown_architecture"
        out["notes"] = [*out.get("notes", []), t("note." + NOTE, "en", model_type=config["model_type"])]
        return out
    est = estimate_model(families.from_config(config), setup)
    out["estimate_bytes"] = est.total_bytes
    out["estimate_relative_error"] = round((est.total_bytes - out["peak_bytes"]) / out["peak_bytes"], 5)
    dist = est.extra.get("distributed") or {}
    if out.get("host_bytes") or (dist.get("per_gpu") or {}).get("host_bytes"):
        # CPU offload: the host memory of rank 0's process beside the estimate's, per GPU and per node
        out["estimate_host_bytes"] = dist["per_gpu"]["host_bytes"]
        out["estimate_host_ram_bytes_per_node"] = dist["host_ram_bytes_per_node"]
    return out


def render(out: dict[str, Any], args: argparse.Namespace, lang: str, units: str) -> str:
    """Byte figures with both units, counts as counts, the inventory as text; JSON with --json."""
    from cabe.i18n import fmt_number
    from cabe.units import fmt_bytes

    if args.json:
        return jsonio.dumps({k: v for k, v in out.items() if k != "inventory_text"}, indent=2, default=str)
    lines = []
    for key, value in out.items():
        if key == "inventory_text" or (key == "host_bytes" and not value):  # (no host memory: nothing offloaded)
            continue
        if isinstance(value, int) and not isinstance(value, bool) and "_bytes" in key:
            lines.append(f"  {key:<32} {fmt_bytes(value, lang, units)}")
        elif isinstance(value, dict) and value and all(isinstance(v, int) for v in value.values()):
            lines.append(f"  {key}:")
            for k, v in value.items():
                shown = fmt_bytes(v, lang, units) if key in ("components", "phase_peaks") else fmt_number(v, lang)
                lines.append(f"    {k:<30} {shown}")
        elif key == "engine" and value:  # several GPUs: the engine that ran, as the trace names it
            lines.append(f"  {key}:")
            lines += [f"    {k:<30} {v}" for k, v in value.items()]
        elif isinstance(value, (str, int, float, bool)):
            lines.append(f"  {key:<32} {value}")
    notes = list(out.get("notes", []))
    if out.get("analytic") == "unknown_architecture":
        notes = notes[:-1]  # gather's English sentence of NOTE, said below in the asked language
    lines += ["· " + n for n in notes]  # what the trace did differently from what was asked (TraceResult.notes)
    if out.get("analytic") == "unknown_architecture":
        lines.append("· " + t("note." + NOTE, lang, model_type=(out.get("model") or {}).get("model_type", "")))
    if out.get("inventory_text"):
        lines += ["", out["inventory_text"]]
    return "\n".join(lines)
