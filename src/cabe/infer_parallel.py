"""What ``cabe infer`` adds beside the single-GPU estimate: the GPU of a tensor- / pipeline-parallel replica
(:mod:`cabe.serving_parallel`), the speed bounds on a card (:mod:`cabe.speed`), the model's context limit with rope
scaling (:mod:`cabe.context_limit`), and the text of those figures and of ``--explain`` (words from the catalogs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe import serving_parallel, speed
from cabe.architecture import ModelSpec
from cabe.context_limit import context_limit
from cabe.i18n import fill, fmt_number, t
from cabe.units import fmt_bytes

#: the request fields read here (schema: ``gpus`` group, ``pp_partition``)
FIELDS = ("tp", "pp", "ep", "gpus", "pp_partition")


def extend(
    out: dict[str, Any], body: Mapping[str, Any], spec: ModelSpec, config: Mapping[str, Any], card: Any
) -> dict[str, Any]:
    """Add ``parallel`` (tp × pp × dp > 1), ``speed`` (with a card), ``context_limit`` and the steps they explain to
    ``out``, the answer of :func:`cabe.inference.infer_json` holding the estimate's keys."""
    lim = context_limit(config, out["context"], spec.max_positions)
    out["context_limit"] = lim
    notes = [n for n in out.get("notes", []) if n != "seq_beyond_max_positions"]
    out["notes"] = notes + (["context_beyond_limit"] if lim["beyond"] else [])
    weights = body.get("weights") or "auto"
    group_size = body.get("group_size") or 128
    lay = serving_parallel.layout(
        spec,
        tp=_int(body, "tp"),
        pp=_int(body, "pp"),
        gpus=body.get("gpus"),
        ep=_int(body, "ep"),
        partition=body.get("pp_partition"),
    )
    steps = list(out["steps"])
    if lay.gpus > 1 or lay.ep > 1:
        par = serving_parallel.per_gpu(spec, out, lay, weights=weights, group_size=group_size)
        if card is not None:
            util = body.get("gpu_memory_utilization")
            par["fit"] = serving_parallel.fit(par, card, 0.9 if util is None else util)
        out["parallel"] = par
        steps += par["steps"]
    if card is not None and card.memory_bandwidth_gbs and card.bf16_tflops_dense:
        d = speed.decode_bound(
            spec,
            card,
            lay,
            context=out["context"],
            batch=out["batch"],
            kv_dtype=out["kv_dtype"],
            weights=weights,
            group_size=group_size,
        )
        p = speed.prefill_bound(
            spec,
            card,
            lay,
            context=out.get("prompt_tokens", out["context"]),  # the prefill runs the prompt (generate: less new tokens)
            batch=out["batch"],
            weights_format=out["weights_format"],
        )
        out["speed"] = {"gpu": card.name, "decode": d, "prefill": p}
        steps += [d["step"], p["step"]]
    out["explain"] = steps
    return out


def _int(body: Mapping[str, Any], name: str) -> int:
    v = body.get(name)
    return 1 if v is None else v


def parallel_lines(out: Mapping[str, Any], lang: str, units: str) -> list[str]:
    """The text of the fullest GPU of a tensor- / pipeline-parallel replica and its fit (none on one GPU)."""

    def b(n: float) -> str:
        return fmt_bytes(round(n), lang, units)

    lines: list[str] = []
    par = out.get("parallel")
    if par:
        st = par["stages"][par["worst_stage"]]
        lines += [
            "",
            t(
                "infer.parallel.header",
                lang,
                tp=par["tp"],
                pp=par["pp"],
                dp=par["dp"],
                gpus=par["gpus"],
                stage=st["stage"],
                start=st["layers"][0],
                end=st["layers"][1] - 1,
                heads=par["kv_heads_per_rank"],
            ),
        ]
        for name, nbytes in st["components"].items():
            lines.append(f"  {t('infer.component.' + name, lang):<40} {b(nbytes):>26}")
        lines.append(f"  {t('infer.component.comm', lang):<40} {b(st['non_torch_bytes']):>26}")
        lines.append(f"  {'─' * 76}")
        lines.append(f"  {t('infer.parallel.total', lang):<40} {b(st['reserved_bytes'] + st['non_torch_bytes']):>26}")
        f = par.get("fit")
        if f:
            lines.append(
                t(
                    "infer.parallel.fit",
                    lang,
                    gpu=f["display"],
                    verdict=t("ui.fits" if f["fits"] else "ui.does_not_fit", lang),
                    need=fmt_bytes(f["needed_bytes"], lang, units, both=False),
                    have=fmt_bytes(f["memory_bytes"], lang, units, both=False),
                    util=f["utilization"],
                    seqs=f["sequences_per_replica"],
                    context=out["context"],
                    total=f["sequences_total"],
                    dp=par["dp"],
                )
            )
    return lines


def speed_lines(out: Mapping[str, Any], lang: str) -> list[str]:
    """The text of the speed bounds and of a context beyond the model's limit."""
    lines: list[str] = []
    sp = out.get("speed")
    if sp:
        d, p = sp["decode"], sp["prefill"]
        lines += [
            "",
            t(
                "infer.speed.decode",
                lang,
                tps=fmt_number(round(d["tokens_per_second"], 1), lang, 1),
                batch=out["batch"],
                per_seq=fmt_number(round(d["tokens_per_second_per_sequence"], 1), lang, 1),
                bw=d["bandwidth_gbs"],
            ),
            t(
                "infer.speed.prefill",
                lang,
                seconds=fmt_number(round(p["seconds"], 3), lang, 3),
                tokens=out["batch"] * out.get("prompt_tokens", out["context"]),
                tflops=p["tflops_peak"],
            ),
        ]
    lim = out.get("context_limit")
    if lim and lim["beyond"]:
        key = "infer.context_limit.scaled" if lim["factor"] else "infer.context_limit.plain"
        lines.append(
            t(
                key,
                lang,
                context=out["context"],
                limit=lim["limit"],
                rope=lim["rope_type"],
                factor=lim["factor"] or 0,
                original=lim["original"] or 0,
            )
        )
    return lines


def format_explain(out: Mapping[str, Any], lang: str) -> str:
    """``cabe infer --explain``: every figure, its formula with the numbers, and the result."""
    lines = ["", t("ui.explain", lang) + ":"]
    for i, st in enumerate(out.get("explain", out.get("steps", [])), 1):
        params = {k: v for k, v in st.get("params", {}).items() if not isinstance(v, (dict, list))}
        lines.append(f"{i:>2}. {t('step.' + st['key'], lang)}")
        result = "" if st.get("bytes") is None else f" = {fmt_number(st['bytes'], lang)} B"
        lines.append(f"    {fill(st['formula'], params, lang)}{result}")
    return "\n".join(lines)
