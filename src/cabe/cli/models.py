"""``cabe models``: the model presets."""

from __future__ import annotations

import argparse
from typing import Any

from cabe import jsonio
from cabe.cli import options
from cabe.i18n import fmt_number, t


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.output(p)


def gather(args: argparse.Namespace) -> list[dict[str, Any]]:
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
                **kinds(src.spec),
            }
        )
    return rows


def kinds(spec: Any) -> dict[str, str]:
    """The attention and MLP kinds of a spec, as codes: ``mha`` / ``gqa`` / ``mqa`` (kv heads against query
    heads), ``+sliding<window>`` when some layers slide, ``+chunked<chunk>`` when some attend within chunks,
    ``+nope`` when some apply no rotary, ``+sinks`` with learned attention sinks, ``+gated`` with an output gate,
    ``+mamba2x<n>`` / ``+gated_deltanetx<n>`` for ``n`` layers that mix with a Mamba-2 SSM or a gated DeltaNet
    instead of attention; the MLP's kinds over its runs
    (``gated``, ``plain``, ``moe<E>x<k>`` with the experts' gate when it is not SwiGLU, ``(every-expert)`` when
    every token goes through every expert)."""
    nkv, nh = spec.num_kv_heads, spec.num_heads
    attn = "mla" if spec.latent_attention else ("mha" if nkv == nh else ("mqa" if nkv == 1 else "gqa"))
    if spec.sliding_window:
        attn += f"+sliding{spec.sliding_window}"
    chunk = next((g.window for g in spec.layer_groups if g.attention == "chunked"), None)
    if chunk:
        attn += f"+chunked{chunk}"
    if any(not g.rope for g in spec.layer_groups if g.mixer == "attention"):
        attn += "+nope"
    mamba = sum(g.count for g in spec.layer_groups if g.mixer == "mamba2")
    if mamba:  # Mamba-2 mixers in that many of the layers (cabe.ssm)
        attn += f"+mamba2x{mamba}"
    if spec.attention_sinks:
        attn += "+sinks"
    if spec.attention_output_gate:
        attn += "+gated"
    for mixer in dict.fromkeys(g.mixer for g in spec.layer_groups if g.mixer not in ("attention", "mamba2")):
        # linear-attention layers among the attention ones: ``+gated_deltanetx36`` (their kind and count)
        attn += f"+{mixer}x{sum(g.count for g in spec.layer_groups if g.mixer == mixer)}"
    if spec.latent_attention and spec.latent_attention.index_heads:  # DeepSeek-V3.2's lightning indexer, its top-k
        attn += f"+indexer{spec.latent_attention.index_topk}"
    attn += _compressed(spec)
    mlps: dict[str, None] = {}
    for run in spec.runs:
        if run.mlp == "moe":
            gate = "" if spec.expert_gate == "swiglu" else f"({spec.expert_gate})"
            gate += "(every-expert)" if spec.expert_dispatch == "dense" else ""
            shared = "+shared" if run.slot_names("shared_up") else ""
            routing = "hash-" if run.router == "hash" else ""  # DeepSeek-V4's hash-routed layers
            mlps.setdefault(f"{routing}moe{spec.num_experts}x{spec.experts_per_token}{gate}{shared}", None)
        else:
            mlps.setdefault(run.mlp, None)
    return {"attention": attn, "mlp": "+".join(mlps)}


def _compressed(spec: Any) -> str:
    """DeepSeek-V4's attention kinds: ``+sliding<window>`` (every layer attends over its window), then
    ``+csa<rate>x<layers>`` / ``+hca<rate>x<layers>`` (a compressor of one entry per ``rate`` tokens in that many
    layers) and ``+indexer<top-k>`` (CSA's lightning indexer); "" for other attentions."""
    ca = spec.compressed_attention
    if ca is None:
        return ""
    out = "" if spec.sliding_window else f"+sliding{ca.window}"
    for kind, code in (("compressed_sparse", "csa"), ("heavily_compressed", "hca")):
        n = sum(g.count for g in spec.layer_groups if g.attention == kind)
        out += f"+{code}{ca.rate(kind)}x{n}" if n else ""
    if any(g.attention == "compressed_sparse" for g in spec.layer_groups):
        out += f"+indexer{ca.index_topk}"
    return out


def render(rows: list[dict[str, Any]], args: argparse.Namespace, lang: str, units: str) -> str:
    if args.json:
        return jsonio.dumps(rows, indent=2)
    lines = [t("ui.models_header", lang) + ":"]
    w = max([18] + [len(r["name"]) for r in rows])
    lines += [
        f"  {r['name']:<{w}} {fmt_number(r['parameters'], lang):>20}  {r['attention']:<20} {r['mlp']:<24} {r['hf_id'] or ''}"
        for r in rows
    ]
    return "\n".join(lines)
