"""``cabe infer``: memory of running (serving) a model — weights by format, KV cache, working memory —
and, for a card, the longest context, the most concurrent sequences, and a vLLM-style KV pool."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    from cabe.inference import FORMATS
    from cabe.kv_cache import KV_DTYPES

    p.add_argument("--model", "-m", help="preset name (cabe models), path to a config.json, or a Hugging Face id")
    p.add_argument("--weights", default="fp16", help=" | ".join(FORMATS))
    p.add_argument("--group-size", default=None, help="GPTQ/AWQ group size (default 128)")
    p.add_argument("--kv-dtype", default="fp16", help=" | ".join(KV_DTYPES))
    p.add_argument("--context", default=None, help="tokens per sequence (prompt + generated; default 4096)")
    p.add_argument("--batch", default=None, help="sequences at once (default 1)")
    p.add_argument(
        "--mode", default="generate", help="generate (logits of the last token) | prefill (of every position)"
    )
    p.add_argument(
        "--prefill-chunk", default=None, help="prefill in chunks of this many tokens (default: whole prompt)"
    )
    p.add_argument("--gpu", help="a card from `cabe gpus`: fits? longest context, most sequences, serving pool")
    p.add_argument(
        "--gpu-memory-utilization", default=None, help="vLLM's fraction of the card it may use (default 0.9)"
    )


def run(args: argparse.Namespace, lang: str, units: str) -> int:
    from cabe import api
    from cabe.cli import _to_float, _to_int
    from cabe.errors import InvalidValueError
    from cabe.inference import infer_json

    if not args.model:
        raise InvalidValueError("missing_model", "model")
    body: dict = {"model": args.model, "weights": args.weights, "kv_dtype": args.kv_dtype, "mode": args.mode}
    for name in ("context", "batch", "prefill_chunk", "group_size"):
        v = getattr(args, name)
        if v is not None:
            body[name] = _to_int(name, v)
    if args.gpu:
        body["gpu"] = args.gpu
    if args.gpu_memory_utilization is not None:
        body["gpu_memory_utilization"] = _to_float("gpu_memory_utilization", args.gpu_memory_utilization)
    # local config.json paths are allowed on the command line
    src = api.model_source(body, allow_files=True)
    if src is not None and src.kind not in ("preset", "hub"):
        body = {**body, "config": dict(src.config)}
        body.pop("model")
    out = infer_json(body)
    if args.json:
        print(json.dumps(out, ensure_ascii=False, indent=2, default=str))
        return 0
    print(format_infer(out, lang, units))
    return 0


def format_infer(out: dict, lang: str, units: str) -> str:
    from cabe.i18n import fmt_number, t
    from cabe.render import fmt_bytes

    def b(n: float) -> str:
        return fmt_bytes(round(n), lang, units)

    lines = [
        t(
            "infer.header",
            lang,
            model=out.get("model") or "",
            weights=out["weights_format"],
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
    lines.append(f"  {t('infer.total', lang):<40} {b(out['total_bytes']):>26}")
    kv = out["kv"]
    lines.append("")
    lines.append(t("infer.kv_per_token", lang, formula=kv["formula"], bytes=round(kv["bytes_per_token"])))
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
    if "fit" in out:
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
        if s["kv_pool_bytes"] > 0:
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
    return "\n".join(lines)
