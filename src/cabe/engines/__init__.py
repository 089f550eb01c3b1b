"""Serving engines as they account memory: how many tokens and sequences of a length fit on a card.

* ``hf``: transformers' ``generate`` (:mod:`cabe.inference`: the batch and context that fit);
* ``vllm``: :mod:`cabe.engines.vllm` (``gpu_memory_utilization``, the profile run, KV cache groups and blocks);
* ``sglang``: :mod:`cabe.engines.sglang` (``mem_fraction_static``, the token pool);
* ``llamacpp``: :mod:`cabe.engines.llamacpp` (GGUF tensor types, KV types, the compute buffer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe.architecture import ModelSpec
from cabe.engines import llamacpp, sglang, vllm
from cabe.engines.share import Share
from cabe.errors import InvalidValueError
from cabe.gpus import Gpu

ENGINES = ("hf", "vllm", "sglang", "llamacpp")

#: the request fields this package reads (declared in cabe.schema), and the engine each knob belongs to
FIELDS = (
    "engine",
    "max_num_batched_tokens",
    "max_num_seqs",
    "block_size",
    "mem_fraction_static",
    "n_batch",
    "n_ubatch",
    "cache_type_k",
    "cache_type_v",
    "n_gpu_layers",
)
KNOBS: dict[str, tuple[str, ...]] = {
    "vllm": ("max_num_batched_tokens", "max_num_seqs", "block_size"),
    "sglang": ("mem_fraction_static",),
    "llamacpp": ("n_batch", "n_ubatch", "cache_type_k", "cache_type_v", "n_gpu_layers"),
}


def engine_of(body: Mapping[str, Any]) -> str:
    """The request's engine (``hf`` when not given); a knob of another engine is refused, never dropped."""
    engine = body.get("engine") or "hf"
    if engine not in ENGINES:
        raise InvalidValueError("bad_choice", "engine", value=engine, allowed=", ".join(ENGINES))
    for owner, names in KNOBS.items():
        for name in names:
            if body.get(name) is not None and owner != engine:
                raise InvalidValueError("not_for_engine", name, engines=owner, engine=engine)
    if engine != "hf" and not body.get("gpu"):
        raise InvalidValueError("engine_needs_gpu", "engine", engine=engine)
    return str(engine)


def run(
    engine: str,
    spec: ModelSpec,
    card: Gpu,
    body: Mapping[str, Any],
    *,
    context: int,
    tp: int = 1,
    share: Share | None = None,
) -> dict[str, Any]:
    """The engine's accounting on ``card`` for sequences of ``context`` tokens (``engine`` not ``hf``); ``share``:
    one GPU of a tensor- / pipeline-parallel replica (:mod:`cabe.engines.share`)."""

    def given(*names: str) -> dict[str, Any]:
        return {n: body[n] for n in names if body.get(n) is not None}

    if engine == "vllm":
        kw = given("weights", "kv_dtype", "group_size", "gpu_memory_utilization", *KNOBS["vllm"])
        return vllm.serving(spec, card, context=context, tp=tp, share=share, **kw)
    if engine == "sglang":
        return sglang.serving(
            spec,
            card,
            context=context,
            tp=tp,
            share=share,
            **given("weights", "kv_dtype", "group_size", *KNOBS["sglang"]),
        )
    kw = given("weights", *KNOBS["llamacpp"])
    kw.setdefault("weights", "gguf-q4_k_m")
    return llamacpp.serving(spec, card, context=context, **kw)
