"""Make it fit: the largest micro-batch, the longest sequence, the fewest GPUs, and what to change.

Every answer is a bisection over :func:`cabe.analytic.estimate_model` (peak memory is monotone in
micro-batch and sequence length — tests/test_estimate.py — and non-increasing in the number of
GPUs under ZeRO / FSDP — tests/parallel/test_sharding.py): an exponential search brackets the answer, then
binary search finds it, so a solve is a few dozen estimates (milliseconds), never a loop of
decrements. "Fits" always means ``cabe.gpus.fit(report, card)["fits"]``: reserved memory (peak +
allocator slack) plus the CUDA context within the card's memory.

Relative slowdowns of the candidate changes (time per optimizer step, ×, 1.0 = unchanged); they are
documented rules of thumb, not measurements of your run:

* gradient checkpointing ×1.33 — one more forward: (2 + 4 + 2)·N vs (2 + 4)·N FLOPs per token.
* 8-bit AdamW ×1.0 (bitsandbytes' blockwise kernels are as fast as fused AdamW); paged ×1.05.
* LoRA from full ×0.67 — no weight gradients of the base: 4·N vs 6·N FLOPs per token (changes what
  is trained); QLoRA ×0.87 (the LoRA figure × 1.3 for 4-bit dequantization, QLoRA paper / bnb).
* lower LoRA rank ×1.0.
* ZeRO-1 / ZeRO-2 ×1.0 (same communication volume as DDP, ZeRO paper §7), ZeRO-3 / FSDP ×1.15
  (1.5× DDP's communication volume).
* CPU offload of the optimizer ×1.5 (ZeRO-Offload: CPU Adam + PCIe transfers), of parameters ×2.5
  (ZeRO-Infinity, PCIe-bound).
* more GPUs ×1.0 per step per GPU (fewer tokens per GPU when the global batch is fixed; more
  GPU-hours through communication).
* halving the micro-batch or the sequence with twice the accumulation ×1.1 (smaller kernels).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from cabe import api, memo
from cabe import gpus as gpu_catalog
from cabe.analytic import estimate_model
from cabe.architecture import ModelSpec
from cabe.errors import CabeError, InvalidValueError
from cabe.gpus import Gpu
from cabe.report import Report
from cabe.training import MAX_BATCH, MAX_SEQ, TrainingSetup

SLOWDOWN: dict[str, float] = {
    "checkpointing": 1.33,
    "optimizer_8bit": 1.0,
    "optimizer_paged_8bit": 1.05,
    "lora": 0.67,
    "qlora": 0.87,
    "lower_rank": 1.0,
    "zero1": 1.0,
    "zero2": 1.0,
    "zero3": 1.15,
    "fsdp": 1.15,
    "offload_optimizer": 1.5,
    "offload_parameters": 2.5,
    "more_gpus": 1.0,
    "smaller_batch_accum": 1.1,
    "shorter_seq_accum": 1.1,
}

MAX_GPUS = 4096


def _fits(spec: ModelSpec, setup: TrainingSetup, card: Gpu) -> tuple[bool, Report | None]:
    try:
        r = estimate_model(spec, setup)
    except CabeError:
        return False, None
    return bool(gpu_catalog.fit(r, card)["fits"]), r


def _largest(ok: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The largest x in [lo, hi] with ok(x), for ok monotone (true then false); None if ok(lo) fails."""
    if not ok(lo):
        return None
    good, step = lo, 1
    bad = None
    while True:  # exponential bracket
        x = min(lo + step, hi)
        if ok(x):
            good = x
            if x == hi:
                return hi
            step *= 2
        else:
            bad = x
            break
    while bad - good > 1:  # binary search
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def _answer(
    kind: str, value: int | None, spec: ModelSpec, setup: TrainingSetup, card: Gpu, field: str, limit: int
) -> dict[str, Any]:
    out: dict[str, Any] = {"solve": kind, "value": value, "limit": limit, "capped": value == limit}
    if value is not None:
        r = estimate_model(spec, _shaped(setup, field, value))
        out["at_value"] = _fig(r, card)
        if value < limit:
            try:
                r2 = estimate_model(spec, _shaped(setup, field, value + 1))
                out["one_more"] = _fig(r2, card)
            except CabeError:
                pass
    return out


def _shaped(setup: TrainingSetup, field: str, value: int) -> TrainingSetup:
    """``setup.with_(batch=value)`` or ``setup.with_(seq=value)``, without validating the other fields again (they
    did not change: :func:`cabe.memo.reshaped`)."""
    if field == "batch":
        return memo.reshaped(setup, value, setup.seq)
    return memo.reshaped(setup, setup.batch, value)


def _fig(r: Report, card: Gpu) -> dict[str, Any]:
    f = gpu_catalog.fit(r, card)
    return {
        "total_bytes": r.total_bytes,
        "needed_bytes": f["needed_bytes"],
        "fits": f["fits"],
        "margin_bytes": f["margin_bytes"],
    }


def max_batch(spec: ModelSpec, setup: TrainingSetup, card: Gpu, limit: int = 1 << 16) -> dict[str, Any]:
    """The largest micro-batch that fits (None when even 1 does not)."""
    limit = min(limit, MAX_BATCH)
    v = _largest(lambda b: _fits(spec, _shaped(setup, "batch", b), card)[0], 1, limit)
    return _answer("batch", v, spec, setup, card, "batch", limit)


def max_seq(spec: ModelSpec, setup: TrainingSetup, card: Gpu, limit: int | None = None) -> dict[str, Any]:
    """The longest sequence that fits, up to the model's context length (``limit``)."""
    limit = min(limit or spec.max_positions or MAX_SEQ, MAX_SEQ)
    v = _largest(lambda s: _fits(spec, _shaped(setup, "seq", s), card)[0], 1, limit)
    return _answer("seq", v, spec, setup, card, "seq", limit)


def min_gpus(spec: ModelSpec, setup: TrainingSetup, card: Gpu, limit: int = MAX_GPUS) -> dict[str, Any]:
    """The fewest GPUs (a multiple of tp × pp) on which the setup fits.

    Without sharding more GPUs change nothing per GPU, so ``none``/``ddp`` are solved as ``fsdp``
    (said in ``shard``)."""
    unit0 = setup.tp * setup.pp * max(setup.ep, 1)
    if setup.gpus == unit0 and _fits(spec, setup, card)[0]:
        return {
            "solve": "gpus",
            "value": setup.gpus,
            "shard": setup.shard,
            "limit": limit,
            "capped": False,
            "at_value": _fig(estimate_model(spec, setup), card),
        }
    shard = setup.shard if setup.shard not in ("none", "ddp") else "fsdp"
    if shard.startswith("fsdp") and setup.offload == "optimizer":
        shard = "zero3"
    policy: dict[str, str] = {}
    if shard.startswith("fsdp") and setup.param_dtype == "none" and setup.autocast != "none":
        # FSDP2 under autocast with no MixedPrecisionPolicy gathers the stored (fp32) weights and autocast keeps its
        # 16-bit copy of every one that trains to forward's end, whole on every rank (cabe.parallel.fsdp, traced): no
        # count of GPUs shrinks that. Solved with the policy accelerate sets, param_dtype = autocast's (said in the
        # answer's ``param_dtype``)
        policy = {"param_dtype": setup.autocast}
    try:
        base = setup.with_(shard=shard, **policy)
    except CabeError:  # an optimizer that cannot be sharded (GaLore: optimizer.refusal): no count of GPUs fits
        return {"solve": "gpus", "value": None, "shard": shard, "limit": limit, "capped": True}
    unit = setup.tp * setup.pp * max(setup.ep, 1)

    def ok(k: int) -> bool:
        return _fits(spec, base.with_(gpus=k * unit), card)[0]

    k = _largest(lambda k: not ok(k), 1, limit // unit)  # the last k that does NOT fit
    if k is None:
        n = unit
    elif k >= limit // unit:
        n = None
    else:
        n = (k + 1) * unit
    out: dict[str, Any] = {"solve": "gpus", "value": n, "shard": shard, "limit": limit, "capped": n is None, **policy}
    if n is not None:
        out["at_value"] = _fig(estimate_model(spec, base.with_(gpus=n)), card)
        if n > unit:
            out["one_fewer"] = _fig(estimate_model(spec, base.with_(gpus=n - unit)), card)
    return out


def _candidates(spec: ModelSpec, s: TrainingSetup, card: Gpu) -> list[tuple[str, dict[str, Any]]]:
    """The single changes worth trying, in this order: training, sharding and offload, shape."""
    return _training_changes(s) + _sharding_changes(s) + _offload_changes(s) + _shape_changes(s)


Change = tuple[str, dict[str, Any]]


def _training_changes(s: TrainingSetup) -> list[Change]:
    """Checkpointing, an 8-bit optimizer, LoRA / QLoRA, a lower LoRA rank."""
    c: list[Change] = []
    if not s.checkpointing:
        c.append(("checkpointing", {"checkpointing": True}))
    if s.optimizer in ("adamw", "paged-adamw"):
        c.append(("optimizer_8bit", {"optimizer": "adamw-8bit"}))
        c.append(("optimizer_paged_8bit", {"optimizer": "paged-adamw-8bit"}))
    if s.method == "full":
        c.append(("lora", {"method": "lora", "precision": "bf16" if s.precision != "fp16" else "fp16"}))
    if s.method in ("full", "lora"):
        # QLoRA as its recipes run it (TRL, axolotl: 16-bit load, bf16=True). Without autocast,
        # prepare_model_for_kbit_training's fp32 residual gives fp32 queries, and fp32 grouped-query SDPA
        # runs CUDA's math kernel (s×s fp32 scores per layer): no one's QLoRA
        c.append(("qlora", {"method": "qlora", "precision": "bf16-mixed"}))
    if s.adapters and s.lora_rank > 1:
        c.append(("lower_rank", {"lora_rank": max(1, s.lora_rank // 2)}))
    return c


def _sharding_changes(s: TrainingSetup) -> list[Change]:
    """Several GPUs: each higher ZeRO stage, and FSDP from plain data parallelism."""
    c: list[Change] = []
    order = ["none", "ddp", "zero1", "zero2", "zero3"]
    if s.gpus > 1 and s.shard in order:
        for z in order[order.index(s.shard) + 1 :]:
            if z.startswith("zero"):
                c.append((z, {"shard": z}))
        if s.shard in ("none", "ddp") and s.offload == "none":
            c.append(("fsdp", {"shard": "fsdp"}))
    return c


def _offload_changes(s: TrainingSetup) -> list[Change]:
    """CPU offload of the optimizer state (ZeRO), then of the parameters too."""
    c: list[Change] = []
    if s.offload in ("none", "parameters") and not s.shard.startswith("fsdp"):
        shard = s.shard if s.shard.startswith("zero") else "zero2"
        c.append(
            ("offload_optimizer", {"shard": shard, "offload": "both" if s.offload == "parameters" else "optimizer"})
        )
    if s.offload != "both":
        c.append(
            ("offload_parameters", {"shard": "fsdp" if s.shard.startswith("fsdp") else "zero3", "offload": "both"})
        )
    return c


def _shape_changes(s: TrainingSetup) -> list[Change]:
    """Half the micro-batch or half the sequence, with twice the accumulation."""
    c: list[Change] = []
    if s.batch > 1:
        c.append(("smaller_batch_accum", {"batch": s.batch // 2, "grad_accum": s.grad_accum * 2}))
    if s.seq > 64:
        c.append(("shorter_seq_accum", {"seq": s.seq // 2, "grad_accum": s.grad_accum * 2}))
    return c


def make_it_fit(spec: ModelSpec, setup: TrainingSetup, card: Gpu) -> dict[str, Any]:
    """Single changes ranked by memory saved and by slowdown, each with its resulting figure, and a
    cumulative plan (cheapest changes first) that fits when one exists."""
    now_ok, now = _fits(spec, setup, card)
    if now is None:
        now = estimate_model(spec, setup)  # raises the user's error
    base = gpu_catalog.fit(now, card)["needed_bytes"]
    rows: list[dict[str, Any]] = []
    for code, change in _candidates(spec, setup, card):
        try:
            new = setup.with_(**change)
            r = estimate_model(spec, new)
        except CabeError:
            continue
        f = gpu_catalog.fit(r, card)
        rows.append(
            {
                "change": code,
                "set": change,
                "total_bytes": r.total_bytes,
                "needed_bytes": f["needed_bytes"],
                "saved_bytes": base - f["needed_bytes"],
                "fits": f["fits"],
                "slowdown": SLOWDOWN[code],
                "host_ram_bytes_per_node": (r.extra.get("distributed") or {}).get("host_ram_bytes_per_node", 0),
            }
        )
    more = min_gpus(spec, setup, card) if setup.gpus >= 1 else None
    if more and more["value"] and more["value"] != setup.gpus:
        rows.append(
            {
                "change": "more_gpus",
                "set": {"gpus": more["value"], "shard": more["shard"]},
                "total_bytes": more["at_value"]["total_bytes"],
                "needed_bytes": more["at_value"]["needed_bytes"],
                "saved_bytes": base - more["at_value"]["needed_bytes"],
                "fits": True,
                "slowdown": SLOWDOWN["more_gpus"],
                "host_ram_bytes_per_node": 0,
            }
        )
    rows = [r for r in rows if r["saved_bytes"] > 0]
    by_memory = sorted(rows, key=lambda r: -r["saved_bytes"])
    by_speed = sorted(rows, key=lambda r: (not r["fits"], r["slowdown"], -r["saved_bytes"]))
    # cumulative plan: cheapest changes first; each is re-derived from the setup reached so far and
    # kept only if it lowers the need
    plan: list[dict[str, Any]] = []
    cur, cur_need, fits = setup, base, now_ok
    for code in sorted({r["change"] for r in rows if r["change"] != "more_gpus"}, key=lambda c: SLOWDOWN[c]):
        if fits:
            break
        step = dict(_candidates(spec, cur, card)).get(code)
        if step is None:
            continue
        try:
            nxt = cur.with_(**step)
            f = gpu_catalog.fit(estimate_model(spec, nxt), card)
        except CabeError:
            continue
        if f["needed_bytes"] < cur_need:
            cur, cur_need, fits = nxt, f["needed_bytes"], f["fits"]
            plan.append({"change": code, "set": step, "needed_bytes": cur_need, "fits": fits})
    slowdown = 1.0
    for p in plan:
        slowdown *= SLOWDOWN[p["change"]]
    return {
        "solve": "changes",
        "fits_now": now_ok,
        "needed_bytes": base,
        "card_bytes": card.memory_bytes,
        "by_memory": by_memory,
        "by_speed": by_speed,
        "plan": {"steps": plan, "fits": fits, "slowdown": round(slowdown, 3), "setup": cur.to_dict() if plan else None},
    }


SOLVES = ("batch", "seq", "gpus", "changes")


def solve(spec: ModelSpec, setup: TrainingSetup, card: Gpu, what: tuple[str, ...] = SOLVES) -> dict[str, Any]:
    """Run the requested solves; each answer carries the figure at the answer (and one step past)."""
    for w in what:
        if w not in SOLVES:
            raise InvalidValueError("bad_choice", "solve", value=w, allowed=", ".join(SOLVES))
    t0 = time.perf_counter()
    now = estimate_model(spec, setup)
    out: dict[str, Any] = {"gpu": card.to_json(), "setup": setup.to_dict(), "now": _fig(now, card)}
    if "batch" in what:
        out["batch"] = max_batch(spec, setup, card)
    if "seq" in what:
        out["seq"] = max_seq(spec, setup, card)
    if "gpus" in what:
        out["gpus"] = min_gpus(spec, setup, card)
    if "changes" in what:
        out["changes"] = make_it_fit(spec, setup, card)
    out["elapsed_ms"] = round(1000 * (time.perf_counter() - t0), 2)
    return out


def plan_json(body: Mapping[str, Any], *, allow_files: bool = False) -> dict[str, Any]:
    """``POST /api/fit``: the request dict of :mod:`cabe.api` with ``gpu`` required and an optional
    ``solve`` (a list or comma string of batch, seq, gpus, changes). Raises CabeError."""
    if not isinstance(body, Mapping):
        raise InvalidValueError("body_not_object", None)
    body = dict(body)
    what = body.pop("solve", None) or SOLVES
    if isinstance(what, str):
        what = tuple(w.strip() for w in what.split(",") if w.strip())
    card_name = body.pop("gpu", None)
    if not card_name:
        raise InvalidValueError("missing_gpu", "gpu")
    unknown = [k for k in body if k not in api.REQUEST_FIELDS and k not in ("lang", "units")]
    if unknown:
        raise InvalidValueError("unknown_field", unknown[0], allowed=", ".join(api.REQUEST_FIELDS + ("solve",)))
    src = api.model_source(body, allow_files=allow_files)
    if src is None:
        raise InvalidValueError("missing_model", "model")
    setup = api.setup_from(body)
    card = gpu_catalog.gpu(str(card_name))
    return solve(src.spec, setup, card, tuple(what))
