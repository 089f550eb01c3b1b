"""The ``cabe`` command. Three layers: build the parser, gather the numbers (``cabe.api``),
render (``cabe.render``). Bad input: one sentence on stderr in the user's language, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from cabe.errors import CabeError, InvalidValueError
from cabe.i18n import detect_lang, fmt_number, t

EXIT_BAD_INPUT = 2


def _common_model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", "-m", help="preset name (cabe models), path to a config.json, or a Hugging Face id")
    g.add_argument("--params", help="parameter count in billions (no architecture: model states only)")
    g.add_argument(
        "--bytes-per-param",
        help="seed mode: bytes per parameter (16 mixed-precision Adam, 12 8-bit Adam, 8 SGD+momentum, or any number)",
    )
    g.add_argument("--activations-gb", help="seed mode: activation memory in GB, added as is")
    s = p.add_argument_group("training setup")
    s.add_argument("--method", help="full | lora | qlora | freeze | prompt-tuning (default full)")
    s.add_argument("--precision", help="fp32 | fp16-amp | bf16-amp | bf16 | fp16 (default bf16-amp)")
    s.add_argument(
        "--optimizer",
        help="adamw | adamw-8bit | paged-adamw | paged-adamw-8bit | sgd | sgd-momentum | adafactor | lion",
    )
    s.add_argument("--optimizer-impl", help="foreach | fused | for-loop (default: what PyTorch picks on CUDA, foreach)")
    s.add_argument("--batch", help="micro-batch size (sequences on the GPU at once; default 1)")
    s.add_argument("--seq", help="sequence length in tokens (default 512)")
    s.add_argument("--grad-accum", help="gradient-accumulation steps (effective batch = batch × steps)")
    s.add_argument("--checkpointing", action="store_true", default=None, help="gradient checkpointing of every layer")
    s.add_argument("--attention", help="eager | sdpa | flash (default sdpa)")
    s.add_argument("--lora-rank", help="LoRA rank r (default 8)")
    s.add_argument("--lora-alpha", help="LoRA alpha (default 16)")
    s.add_argument(
        "--lora-targets",
        help="comma list of module names as PEFT spells them, or all-linear (default: PEFT's default for the model, q_proj,v_proj for Llama)",
    )
    s.add_argument("--quant", help="QLoRA quant type: nf4 | fp4")
    s.add_argument(
        "--double-quant",
        dest="double_quant",
        action="store_true",
        default=None,
        help="QLoRA double quantization (default on)",
    )
    s.add_argument("--no-double-quant", dest="double_quant", action="store_false")
    s.add_argument("--compute-dtype", help="QLoRA compute dtype: bf16 | fp16 | fp32")
    s.add_argument("--trainable-layers", help="freeze: how many of the last layers train (default 1)")
    s.add_argument("--prompt-tokens", help="prompt tuning: number of virtual tokens (default 20)")
    d = p.add_argument_group("several GPUs")
    d.add_argument("--gpus", help="total number of GPUs (default 1); memory is reported per GPU")
    d.add_argument("--shard", help="none | ddp | zero1 | zero2 | zero3 | fsdp | fsdp-hybrid")
    d.add_argument("--offload", help="none | optimizer | parameters | both (CPU offload)")
    d.add_argument("--tp", help="tensor-parallel degree")
    d.add_argument("--pp", help="pipeline-parallel degree")
    d.add_argument("--ep", help="expert-parallel degree (MoE)")
    d.add_argument("--gpus-per-node", help="GPUs per node (default 8)")


def _output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--lang", help="es | en (default from the locale)")
    p.add_argument("--units", default="GB", help="GB (10^9 bytes) or GiB (2^30 bytes)")


_INT_FIELDS = (
    "batch",
    "seq",
    "grad_accum",
    "lora_rank",
    "trainable_layers",
    "prompt_tokens",
    "gpus",
    "tp",
    "pp",
    "ep",
    "gpus_per_node",
)
_FLOAT_FIELDS = ("params", "bytes_per_param", "activations_gb", "lora_alpha")


def request_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Turn parsed options into the request dict of :mod:`cabe.api` (numbers validated here)."""
    body: dict[str, Any] = {}
    for name in (
        "model",
        "method",
        "precision",
        "optimizer",
        "optimizer_impl",
        "attention",
        "lora_targets",
        "quant",
        "compute_dtype",
        "gpu",
        "shard",
        "offload",
    ):
        v = getattr(args, name, None)
        if v is not None:
            body[name] = v
    for name in ("checkpointing", "double_quant"):
        v = getattr(args, name, None)
        if v is not None:
            body[name] = v
    for name in _INT_FIELDS:
        v = getattr(args, name, None)
        if v is not None:
            body[name] = _to_int(name, v)
    for name in _FLOAT_FIELDS:
        v = getattr(args, name, None)
        if v is not None:
            body[name] = _to_float(name, v)
    return body


def _to_int(name: str, text: str) -> int:
    try:
        return int(str(text).replace("_", ""))
    except ValueError:
        raise InvalidValueError("not_integer", name, value=text) from None


def _to_float(name: str, text: str) -> float:
    try:
        return float(str(text).replace(",", "."))
    except ValueError:
        raise InvalidValueError("not_number", name, value=text) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cabe",
        description="¿Cabe en mi GPU? How much GPU memory training (or fine-tuning) an LLM takes, part by part.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    est = sub.add_parser("estimate", help="estimate the peak GPU memory of a training step")
    _common_model_options(est)
    est.add_argument("--gpu", help="a card from `cabe gpus`: does it fit?")
    est.add_argument("--fits", action="store_true", help="print a fits? table over the whole GPU catalog")
    est.add_argument("--explain", action="store_true", help="show each figure's formula and worked numbers")
    _output_options(est)

    m = sub.add_parser("models", help="list the model presets")
    _output_options(m)
    g = sub.add_parser("gpus", help="list the GPU catalog")
    _output_options(g)
    lo = sub.add_parser("lora", help="LoRA adapter parameters per target module for a model and rank")
    lo.add_argument("--model", "-m", required=False)
    lo.add_argument("--lora-rank", "--rank", dest="lora_rank", default="8")
    lo.add_argument(
        "--lora-targets",
        "--targets",
        dest="lora_targets",
        default=None,
        help="comma list or all-linear (default: PEFT's default for the model)",
    )
    _output_options(lo)

    tr = sub.add_parser("trace", help="run the training step through PyTorch on fake tensors (needs cabe[trace])")
    _common_model_options(tr)
    _output_options(tr)
    _add_trace_arguments(tr)

    me = sub.add_parser("measure", help="run the training step for real on a CUDA GPU (needs cabe[trace] and a GPU)")
    _common_model_options(me)
    _output_options(me)

    for name, module, help_text in (
        ("fit", "cabe.commands.fit", "make it fit: largest batch, longest sequence, fewest GPUs, what to change"),
        ("infer", "cabe.commands.infer", "inference / serving memory: weights, KV cache, concurrent sequences"),
        (
            "from-config",
            "cabe.commands.from_config",
            "estimate from your own training configs (TrainingArguments, PEFT, DeepSpeed, axolotl, torchtune ...)",
        ),
    ):
        try:
            mod = __import__(module, fromlist=["add_arguments"])
        except ImportError:
            continue
        sp = sub.add_parser(name, help=help_text)
        mod.add_arguments(sp)
        _output_options(sp)
        sp.set_defaults(_module=mod)

    sv = sub.add_parser("serve", help="start the web calculator and JSON API (needs cabe[web])")
    sv.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all interfaces)"
    )
    sv.add_argument("--port", default="8000", help="port (default 8000)")
    _output_options(sv)
    return parser


def _add_trace_arguments(p: argparse.ArgumentParser) -> None:
    from cabe.trace_options import add_arguments

    add_arguments(p)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    lang = detect_lang(getattr(args, "lang", None))
    if args.command is None:
        parser.print_help()
        return 0
    try:
        units = getattr(args, "units", "GB")
        if units not in ("GB", "GiB"):
            raise InvalidValueError("bad_choice", "units", value=units, allowed="GB, GiB")
        if getattr(args, "_module", None) is not None:
            return args._module.run(args, lang, units)
        return _COMMANDS[args.command](args, lang, units)
    except CabeError as err:
        from cabe.i18n import error_message

        if getattr(args, "json", False):
            print(json.dumps({"error": err.to_dict(lang)}, ensure_ascii=False, indent=2))
        print(f"cabe: {error_message(err, lang)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `cabe ... | head`: the reader went away; nothing to report
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug, not bad input: say so in one sentence, never a traceback
        from cabe.i18n import t as _t

        print(f"cabe: {_t('error.internal', lang, detail=f'{type(exc).__name__}: {exc}')}", file=sys.stderr)
        return 1


def _cmd_estimate(args: argparse.Namespace, lang: str, units: str) -> int:
    from cabe import api, gpus
    from cabe.render import fmt_bytes, format_report

    body = request_from_args(args)
    report = api.build(body, allow_files=True)
    if args.json:
        out = report.to_json()
        out["fits_on"] = gpus.fits_on(report)
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return 0
    print(format_report(report, lang=lang, units=units, explain=args.explain))
    if args.fits:
        print()
        bf16 = gpus.needs_bf16(report)
        for g in gpus.fits_table(report):
            verdict = t("ui.fits" if g["fits"] else "ui.does_not_fit", lang)
            if bf16 and not g["bf16"]:
                verdict += " — " + t("ui.no_bf16", lang)
            print(f"  {g['display']:<40} {fmt_bytes(g['memory_bytes'], lang, units, both=False):>12}  {verdict}")
    elif report.mode != "simple":
        fits_on = gpus.fits_on(report)
        print(
            t("ui.fits_on", lang, list=", ".join(fits_on[:8]) + (" …" if len(fits_on) > 8 else ""))
            if fits_on
            else t("ui.fits_on_none", lang)
        )
    return 0


def _cmd_models(args: argparse.Namespace, lang: str, units: str) -> int:
    from cabe import models

    rows = []
    for name in models.preset_names():
        src = models.preset(name)
        rows.append(
            {
                "name": name,
                "display": src.meta.get("display", name),
                "parameters": src.meta.get("parameters"),
                "hf_id": src.meta.get("hf_id"),
                "model_type": src.config.get("model_type"),
            }
        )
    if args.json:
        print(json.dumps(rows, ensure_ascii=False, indent=2))
        return 0
    print(t("ui.models_header", lang) + ":")
    for r in rows:
        print(f"  {r['name']:<18} {fmt_number(r['parameters'], lang):>20}  {r['hf_id'] or ''}")
    return 0


def _cmd_gpus(args: argparse.Namespace, lang: str, units: str) -> int:
    from cabe import gpus
    from cabe.render import fmt_bytes

    rows = [g.to_json() for g in gpus.all_gpus()]
    if args.json:
        print(json.dumps(rows, ensure_ascii=False, indent=2))
        return 0
    print(t("ui.gpus_header", lang) + ":")
    for g in rows:
        print(
            f"  {g['name']:<24} {fmt_bytes(g['memory_bytes'], lang, units, both=False):>12} "
            f"{fmt_bytes(g['usable_bytes'], lang, units, both=False):>12}  bf16 {t('ui.yes' if g['bf16'] else 'ui.no', lang)}"
        )
    return 0


def _cmd_lora(args: argparse.Namespace, lang: str, units: str) -> int:
    from cabe import models
    from cabe.method import lora_parameters
    from cabe.training import TrainingSetup, parse_targets

    if not args.model:
        raise InvalidValueError("empty_model", "model")
    spec = models.resolve(args.model).spec
    setup = TrainingSetup(
        lora_rank=_to_int("lora_rank", args.lora_rank),
        lora_targets=parse_targets(args.lora_targets) if args.lora_targets else (),
    )
    rows = lora_parameters(spec, setup.lora_rank, setup.lora_targets)
    total = sum(r.parameters for r in rows)
    if args.json:
        print(
            json.dumps(
                {
                    "rank": setup.lora_rank,
                    "targets": [r.__dict__ for r in rows],
                    "total": total,
                    "base_parameters": spec.parameter_count,
                },
                indent=2,
            )
        )
        return 0
    print(t("ui.lora_header", lang, r=setup.lora_rank) + ":")
    for r in rows:
        print(
            f"  {r.name:<16} {r.per_layer} × {spec.num_layers} × {setup.lora_rank}·({r.in_features} + {r.out_features})"
            f" = {fmt_number(r.parameters, lang)}"
        )
    print(
        t("ui.lora_total", lang, n=total, pct=round(100 * total / spec.parameter_count, 4), base=spec.parameter_count)
    )
    return 0


def _trace_inputs(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from cabe import api

    body = request_from_args(args)
    src = api.model_source(body, allow_files=True)
    if src is None:
        raise InvalidValueError("missing_model", "model")
    return dict(src.config), api.setup_from(body)


def _cmd_trace(args: argparse.Namespace, lang: str, units: str) -> int:
    try:
        from cabe.trace import cli as trace_cli
    except ImportError as exc:
        from cabe.errors import MissingDependencyError

        raise MissingDependencyError("missing_extra", None, extra="trace", package=exc.name or "torch") from None
    config, setup = _trace_inputs(args)
    out = trace_cli.run(args, config, setup)
    # the analytic estimate of the same step, beside the trace: how far apart they are
    from cabe.analytic import estimate_model
    from cabe.architecture import ModelSpec

    est = estimate_model(ModelSpec.from_config(config), setup)
    out["estimate_bytes"] = est.total_bytes
    out["estimate_relative_error"] = round((est.total_bytes - out["peak_bytes"]) / out["peak_bytes"], 5)
    _print_trace(out, args, lang, units)
    return 0


def _cmd_measure(args: argparse.Namespace, lang: str, units: str) -> int:
    try:
        from cabe.trace import measure
    except ImportError as exc:
        from cabe.errors import MissingDependencyError

        raise MissingDependencyError("missing_extra", None, extra="trace", package=exc.name or "torch") from None
    config, setup = _trace_inputs(args)
    out = measure.measure_step(config, setup)
    _print_trace(out, args, lang, units)
    return 0


def _print_trace(out: dict[str, Any], args: argparse.Namespace, lang: str, units: str) -> None:
    """Byte figures with both units, counts as counts, the inventory as text; JSON with --json."""
    from cabe.render import fmt_bytes

    if args.json:
        out = {k: v for k, v in out.items() if k != "inventory_text"}
        print(json.dumps(out, ensure_ascii=False, indent=2, default=str))
        return
    for key, value in out.items():
        if key == "inventory_text":
            continue
        if isinstance(value, int) and not isinstance(value, bool) and "_bytes" in key:
            print(f"  {key:<32} {fmt_bytes(value, lang, units)}")
        elif isinstance(value, dict) and value and all(isinstance(v, int) for v in value.values()):
            print(f"  {key}:")
            for k, v in value.items():
                shown = fmt_bytes(v, lang, units) if key in ("components", "phase_peaks") else fmt_number(v, lang)
                print(f"    {k:<30} {shown}")
        elif isinstance(value, (str, int, float, bool)):
            print(f"  {key:<32} {value}")
    if out.get("inventory_text"):
        print()
        print(out["inventory_text"])


def _cmd_serve(args: argparse.Namespace, lang: str, units: str) -> int:
    try:
        from cabe.web.app import serve
    except ImportError as exc:
        from cabe.errors import MissingDependencyError

        raise MissingDependencyError("missing_extra", None, extra="web", package=exc.name or "starlette") from None
    serve(host=args.host, port=_to_int("port", args.port))
    return 0


_COMMANDS = {
    "estimate": _cmd_estimate,
    "models": _cmd_models,
    "gpus": _cmd_gpus,
    "lora": _cmd_lora,
    "trace": _cmd_trace,
    "measure": _cmd_measure,
    "serve": _cmd_serve,
}


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
