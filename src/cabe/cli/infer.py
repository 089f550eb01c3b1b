"""``cabe infer``: memory of running (serving) a model — weights by format, KV cache, working memory —
and, for a card, the longest context, the most concurrent sequences, and a vLLM-style KV pool."""

from __future__ import annotations

import argparse
from typing import Any

from cabe import jsonio, schema
from cabe.cli import options

COMMAND = "infer"


def add_arguments(p: argparse.ArgumentParser) -> None:
    schema.add_arguments(p, COMMAND, groups=("model", "gpus", "serving"))
    options.flag(p, "--explain", key="explain", action="store_true")
    options.output(p, COMMAND)


def gather(args: argparse.Namespace) -> dict[str, Any]:
    from cabe import api
    from cabe.errors import InvalidValueError
    from cabe.inference import infer_json

    if not args.model:
        raise InvalidValueError("missing_model", "model")
    body = schema.values_from_args(args, COMMAND)
    trace = bool(body.pop("trace", False))  # the traced generate beside the estimate (cabe.trace.generate)
    # local config.json paths are allowed on the command line
    src = api.model_source(body, allow_files=True)
    if src is not None and src.kind not in ("preset", "hub"):
        body = {**body, "config": dict(src.config)}
        body.pop("model")
    out = infer_json(body)
    if trace and src is not None:
        try:
            from cabe.trace.generate import beside_estimate
        except ImportError as exc:
            from cabe.errors import MissingDependencyError

            raise MissingDependencyError("missing_extra", None, extra="trace", package=exc.name or "torch") from None
        beside_estimate(out, dict(src.config), images=int(body.get("images") or 0))
    return out


def render(out: dict[str, Any], args: argparse.Namespace, lang: str, units: str) -> str:
    if args.json:
        return jsonio.dumps(out, indent=2, default=str)
    if getattr(args, "explain", False):
        from cabe.infer_parallel import format_explain

        return format_infer(out, lang, units) + "\n" + format_explain(out, lang)
    return format_infer(out, lang, units)


def format_infer(out: dict, lang: str, units: str) -> str:
    from cabe.i18n import fmt_number, t
    from cabe.units import fmt_bytes

    def b(n: float) -> str:
        return fmt_bytes(round(n), lang, units)

    lines = [
        t(
            "infer.header",
            lang,
            model=out.get("model") or "",
            weights=out["weights_format"]
            + (t("infer.as_shipped", lang) if out.get("weights", {}).get("shipped") else ""),
            kv_dtype=out["kv_dtype"],
            batch=out["batch"],
            context=out["context"],
            mode=out["mode"],
        ),
        "",
    ]
    for name, nbytes in out["components"].items():
        share = f"{fmt_number(round(100 * nbytes / out['total_bytes'], 1), lang, 1)}%" if out["total_bytes"] else ""
        lines.append(f"  {t('infer.component.' + name, lang):<40} {b(nbytes):>26}  {share:>6}")
    lines.append(f"  {'─' * 76}")
    total_key = "infer.total_one_gpu" if out.get("parallel") else "infer.total"  # a tp × pp replica: per GPU below
    lines.append(f"  {t(total_key, lang):<40} {b(out['total_bytes']):>26}")
    if "trace_peak_bytes" in out:  # cabe infer --trace: transformers' generate on fake CUDA tensors
        err = out["estimate_relative_error"]
        lines.append(
            t(
                "infer.traced",
                lang,
                peak=b(out["trace_peak_bytes"]),
                reserved=b(out["trace_reserved_bytes"]),
                stage=out["trace"]["peak_stage"],
                error=f"{fmt_number(round(100 * err, 2) + 0.0, lang, 2)}%" if err is not None else "—",
            )
        )
    kv = out["kv"]
    lines.append("")
    lines.append(t("infer.kv_per_token", lang, formula=kv["formula"], bytes=round(kv["bytes_per_token"])))
    if kv.get("linear_attention_layers"):  # gated DeltaNet layers: a fixed state per sequence (cabe.linear_attention)
        lines.append(
            t(
                "infer.linear_state",
                lang,
                layers=kv["linear_attention_layers"],
                conv=b(kv["conv_state_bytes_per_sequence"]),
                recurrent=b(kv["recurrent_state_bytes_per_sequence"]),
                total=b(kv["linear_state_bytes"]),
            )
        )
    if kv["sliding_layers"]:
        lines.append(
            t(
                "infer.sliding",
                lang,
                sliding=kv["sliding_layers"],
                layers=kv["full_layers"] + kv["sliding_layers"],
                window=kv["sliding_window"],
            )
        )
    indexer = next((st for st in out.get("steps", ()) if st["key"] == "infer.indexer"), None)
    if indexer:  # DeepSeek-V3.2's lightning indexer at prefill (cabe.inference.indexer_moments)
        p = indexer["params"]
        lines.append(
            t("infer.indexer", lang, s=p["s"], t=p["t"], heads=p["heads"], topk=p["topk"], bytes=b(indexer["bytes"]))
        )
    if "fit" in out and "parallel" not in out:  # several GPUs: the per-GPU fit (cabe.infer_parallel) instead
        f = out["fit"]
        lines.append("")
        lines.append(
            t(
                "infer.fit",
                lang,
                gpu=f["display"],
                verdict=t("ui.fits" if f["fits"] else "ui.does_not_fit", lang),
                need=fmt_bytes(f["needed_bytes"], lang, units, both=False),
                have=fmt_bytes(f["memory_bytes"], lang, units, both=False),
            )
        )
        lines.append(t("infer.max_context", lang, batch=out["batch"], value=out["max_context"]))
        lines.append(t("infer.max_batch", lang, context=out["context"], value=out["max_batch"]))
        s = out["serving"]
        if out.get("engine", {}).get("engine", "hf") == "vllm":
            pass  # vLLM's own block below says it in full
        elif s["kv_pool_bytes"] > 0:
            lines.append(
                t(
                    "infer.serving",
                    lang,
                    util=s["gpu_memory_utilization"],
                    pool=fmt_bytes(s["kv_pool_bytes"], lang, units, both=False),
                    blocks=s["total_blocks"],
                    block=s["block_size"],
                    seqs=s["max_concurrent_sequences"],
                    context=s["context"],
                    max_context=s["max_context"],
                )
            )
        else:
            lines.append(t("infer.serving_none", lang, util=s["gpu_memory_utilization"]))
    from cabe.infer_parallel import parallel_lines, speed_lines

    lines += parallel_lines(out, lang, units)  # the fullest GPU of a tp × pp replica
    if out.get("engine", {}).get("engine", "hf") != "hf":
        lines.append("")
        lines.extend(engine_lines(out["engine"], lang, b))
    lines += speed_lines(out, lang)  # speed bounds, the context limit
    for note in out.get("notes", []):
        lines.append("· " + t("note." + note, lang))
    return "\n".join(lines)


def engine_lines(e: dict, lang: str, b: Any) -> list[str]:
    """``--engine vllm|sglang|llamacpp``: the engine's accounting (cabe.engines), in words."""
    from cabe.i18n import fmt_number, t

    name = e["engine"]
    if name == "llamacpp":
        return [
            t(
                "infer.engine.llamacpp",
                lang,
                weights=e["weights_format"],
                bpw=fmt_number(e["bits_per_weight"], lang, 2),
                ngl=e["n_gpu_layers"],
                model=b(e["model_buffer_bytes"]),
                kv=b(e["kv_buffer_bytes"] + e["recurrent_state_bytes"]),
                cells=e["kv_cells"],
                ctk=e["cache_type_k"],
                ctv=e["cache_type_v"],
                compute=b(e["compute_buffer_bytes"]),
                ubatch=e["n_ubatch"],
                need=b(e["needed_bytes"]),
            ),
            t(
                "infer.engine.llamacpp_fit",
                lang,
                max_context=e["max_context"],
                context=e["context"],
                seqs=e["max_concurrent_sequences"],
            ),
        ]
    if e["kv_pool_bytes"] <= 0:
        return [t("infer.engine.none", lang, engine=name)]
    lines = []
    if name == "vllm":
        lines.append(
            t(
                "infer.engine.vllm",
                lang,
                util=e["gpu_memory_utilization"],
                budget=b(e["budget_bytes"]),
                weights=b(e["weights_bytes"]),
                profile=b(e["activation_profile_bytes"]),
                tokens=e["max_num_batched_tokens"],
                non_torch=b(e["non_torch_bytes"]),
                pool=b(e["kv_pool_bytes"]),
            )
        )
        if "num_groups" in e:
            kinds = ", ".join(f"{k['layers']} {k['kind']}" for k in e["kv_cache_groups"])
            lines.append(
                t(
                    "infer.engine.vllm_groups",
                    lang,
                    groups=e["num_groups"],
                    size=e["group_size"],
                    kinds=kinds,
                    block=e["block_size"],
                    blocks=e["total_blocks"],
                    tokens=e["kv_cache_tokens"],
                )
            )
        concurrency = fmt_number(round(e["max_concurrency"], 2), lang, 2)
    else:
        auto = t("infer.engine.sglang_auto", lang) if e["mem_fraction_static_auto"] else ""
        lines.append(
            t(
                "infer.engine.sglang",
                lang,
                mfs=e["mem_fraction_static"],
                auto=auto,
                free=b(e["free_before_weights_bytes"]),
                weights=b(e["weights_bytes"]),
                pool=b(e["kv_pool_bytes"]),
                tokens=e["max_total_num_tokens"],
                cell=round(e["cell_bytes"]),
            )
        )
        if "swa_max_total_num_tokens" in e:
            lines.append(
                t(
                    "infer.engine.sglang_swa",
                    lang,
                    swa=e["swa_max_total_num_tokens"],
                    full=e["full_max_total_num_tokens"],
                )
            )
        concurrency = str(e["max_concurrent_sequences"])
    lines.append(
        t("infer.engine.concurrency", lang, context=e["context"], concurrency=concurrency, max_context=e["max_context"])
    )
    if e.get("tp", 1) > 1:
        lines.append(t("infer.engine.tp", lang, tp=e["tp"]))
    return lines
