"""Make it fit: the largest micro-batch, the longest sequence, the fewest GPUs, and what to change.

Every answer is a bisection over :func:`cabe.analytic.estimate_model` (peak memory is monotone in
micro-batch and sequence length — tests/test_estimate.py — and non-increasing in the number of
GPUs under ZeRO / FSDP — tests/parallel/test_sharding.py): an exponential search brackets the answer, then
binary search finds it, so a solve is a few dozen estimates (milliseconds), never a loop of
decrements. "Fits" always means ``cabe.gpus.fit(report, card)["fits"]``: reserved memory (peak +
allocator slack) plus the CUDA context within the card's memory.

What each change costs is :mod:`cabe.plan_cost`'s time model: GPU-hours and wall-clock time for the same tokens,
relative to the current setup (a ratio of two setups, so a change is never charged against a baseline it does not
start from, and two changes never count one saving twice).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Mapping
from typing import Any

from cabe import api, memo, plan_cost, schema, search
from cabe import gpus as gpu_catalog
from cabe.analytic import estimate_model
from cabe.architecture import ModelSpec
from cabe.errors import CabeError, InvalidValueError
from cabe.gpus import Gpu
from cabe.objectives import grpo
from cabe.report import Report
from cabe.training import MAX_BATCH, MAX_SEQ, TrainingSetup, number

MAX_GPUS = 4096


def _fits(spec: ModelSpec, setup: TrainingSetup, card: Gpu) -> tuple[bool, Report | None]:
    try:
        r = estimate_model(spec, setup)
    except CabeError:
        return False, None
    return bool(gpu_catalog.fit(r, card)["fits"]), r


def _largest(ok: Callable[[int], bool], cap: int) -> int | None:
    """The largest x in 1..cap with ok(x), for ok monotone (true then false); None if ok(1) fails
    (:func:`cabe.search.largest`, the one search of the package)."""
    return search.largest(ok, cap) or None


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
    v = _largest(lambda b: _fits(spec, _shaped(setup, "batch", b), card)[0], limit)
    return _answer("batch", v, spec, setup, card, "batch", limit)


def max_seq(spec: ModelSpec, setup: TrainingSetup, card: Gpu, limit: int | None = None) -> dict[str, Any]:
    """The longest sequence that fits, up to the model's context length (``limit``)."""
    limit = min(limit or spec.max_positions or MAX_SEQ, MAX_SEQ)
    v = _largest(lambda s: _fits(spec, _shaped(setup, "seq", s), card)[0], limit)
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

    k = _largest(lambda k: not ok(k), limit // unit)  # the last k that does NOT fit
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


#: changes that exclude each other in one combination (one optimizer, one method, one placement of the states)
GROUPS: dict[str, str] = {
    "checkpointing": "checkpointing",
    "optimizer_8bit": "optimizer",
    "optimizer_paged_8bit": "optimizer",
    "lora": "method",
    "qlora": "method",
    "lower_rank": "rank",
    **dict.fromkeys(("zero1", "zero2", "zero3", "fsdp", "offload_optimizer", "offload_parameters"), "placement"),
    "more_gpus": "placement",
    "smaller_batch_accum": "batch",
    "shorter_seq_accum": "seq",
}
#: the most combinations whose memory is estimated before the search gives up (each is one estimate)
MAX_TRIED = 48


def _row(spec: ModelSpec, setup: TrainingSetup, card: Gpu, base: int, code: str, change: dict, r: Report) -> dict:
    f = gpu_catalog.fit(r, card)
    new = setup.with_(**change)
    x = plan_cost.factors(spec, setup, new)
    return {
        "change": code,
        "set": change,
        "total_bytes": r.total_bytes,
        "needed_bytes": f["needed_bytes"],
        "saved_bytes": base - f["needed_bytes"],
        "fits": f["fits"],
        "slowdown": x["time"],
        "gpu_hours_factor": x["gpu_hours"],
        "host_ram_bytes_per_node": (r.extra.get("distributed") or {}).get("host_ram_bytes_per_node", 0),
    }


def _apply(spec: ModelSpec, setup: TrainingSetup, card: Gpu, codes: tuple[str, ...], fixed: Mapping[str, dict]):
    """The setup the changes ``codes`` reach, each derived from the setup reached so far (LoRA's rank after LoRA),
    and the steps; None when one of them does not apply there."""
    cur, steps = setup, []
    for code in codes:
        step = fixed.get(code) or dict(_candidates(spec, cur, card)).get(code)
        if step is None:
            return None
        try:
            nxt = cur.with_(**step)
        except CabeError:
            return None
        steps.append((code, step, cur, nxt))
        cur = nxt
    return cur, steps


def _cheapest(
    spec: ModelSpec, setup: TrainingSetup, card: Gpu, rows: list[dict[str, Any]]
) -> tuple[TrainingSetup, list[tuple[str, dict, TrainingSetup, TrainingSetup]]] | None:
    """The combination of the single changes that save memory (at most one per :data:`GROUPS` group) that fits at the
    fewest GPU-hours, then the fewest steps, then the least wall-clock time; and of which no step can be left out
    (each one is needed to fit). Combinations are ranked by their cost, which needs no memory estimate, and
    estimated in that order until one fits. None: none fits (or none within :data:`MAX_TRIED` estimates)."""
    fixed = {r["change"]: r["set"] for r in rows if r["change"] == "more_gpus"}
    order = list(GROUPS)
    groups: dict[str, list[str]] = {}
    for r in rows:
        groups.setdefault(GROUPS[r["change"]], []).append(r["change"])
    ranked = []
    for pick in itertools.product(*[[None, *cs] for cs in groups.values()]):
        codes = tuple(sorted((c for c in pick if c), key=order.index))
        if not codes:
            continue
        reached = _apply(spec, setup, card, codes, fixed)
        if reached is None:
            continue
        try:
            x = plan_cost.factors(spec, setup, reached[0])
        except CabeError:
            continue
        ranked.append((x["gpu_hours"], len(codes), x["time"], codes, reached))
    ranked.sort(key=lambda c: c[:3])
    for _g, _n, _t, codes, reached in ranked[:MAX_TRIED]:
        if _fits(spec, reached[0], card)[0] and _needed(spec, setup, card, codes, fixed) == codes:
            return reached
    return _greedy(spec, setup, card, rows, fixed)


def _greedy(
    spec: ModelSpec, setup: TrainingSetup, card: Gpu, rows: list[dict[str, Any]], fixed: Mapping[str, dict]
) -> tuple[TrainingSetup, list[tuple[str, dict, TrainingSetup, TrainingSetup]]] | None:
    """Past :data:`MAX_TRIED`: the changes added cheapest first while each lowers the need (one per group) until it
    fits, then every step it fits without left out (:func:`_needed`)."""
    order = list(GROUPS)
    codes: tuple[str, ...] = ()
    need = None
    for r in sorted(rows, key=lambda r: (r["gpu_hours_factor"], -r["saved_bytes"])):
        # in place of the change of its group taken so far (the parameters' offload after the optimizer's)
        others = (c for c in codes if GROUPS[c] != GROUPS[r["change"]])
        trial = tuple(sorted((*others, r["change"]), key=order.index))
        got = _apply(spec, setup, card, trial, fixed)
        ok, rep = _fits(spec, got[0], card) if got else (False, None)
        if rep is None:
            continue
        trial_need = gpu_catalog.fit(rep, card)["needed_bytes"]
        if need is not None and trial_need >= need:
            continue
        codes, need = trial, trial_need
        if ok:
            return _apply(spec, setup, card, _needed(spec, setup, card, codes, fixed), fixed)
    return None


def _needed(
    spec: ModelSpec, setup: TrainingSetup, card: Gpu, codes: tuple[str, ...], fixed: Mapping[str, dict]
) -> tuple[str, ...]:
    """``codes`` without the steps the combination fits without (the costliest tried first)."""
    kept = list(codes)
    for left in sorted(codes, key=lambda c: -_step_cost(spec, setup, card, c, fixed)):
        fewer = tuple(c for c in kept if c != left)
        got = _apply(spec, setup, card, fewer, fixed) if fewer else None
        if got is not None and _fits(spec, got[0], card)[0]:
            kept = list(fewer)
    return tuple(kept)


def _step_cost(spec: ModelSpec, setup: TrainingSetup, card: Gpu, code: str, fixed: Mapping[str, dict]) -> float:
    got = _apply(spec, setup, card, (code,), fixed)
    return plan_cost.factors(spec, setup, got[0])["gpu_hours"] if got else 0.0


def make_it_fit(spec: ModelSpec, setup: TrainingSetup, card: Gpu) -> dict[str, Any]:
    """Single changes ranked by memory saved and by their cost in GPU-hours, each with its resulting figure and its
    time and GPU-hours for the same tokens relative to the current setup (:mod:`cabe.plan_cost`); and the cheapest
    combination that fits, every step of it needed (:func:`_cheapest`)."""
    now_ok, now = _fits(spec, setup, card)
    if now is None:
        now = estimate_model(spec, setup)  # raises the user's error
    base = gpu_catalog.fit(now, card)["needed_bytes"]
    rows: list[dict[str, Any]] = []
    for code, change in _candidates(spec, setup, card):
        try:
            r = estimate_model(spec, setup.with_(**change))
        except CabeError:
            continue
        rows.append(_row(spec, setup, card, base, code, change, r))
    more = min_gpus(spec, setup, card) if setup.gpus >= 1 else None
    if more and more["value"] and more["value"] != setup.gpus:
        change = {
            "gpus": more["value"],
            "shard": more["shard"],
            **({"param_dtype": more["param_dtype"]} if more.get("param_dtype") else {}),
        }
        with contextlib.suppress(CabeError):  # a count the setup cannot take (a layout it refuses): no row
            rows.append(_row(spec, setup, card, base, "more_gpus", change, estimate_model(spec, setup.with_(**change))))
    rows = [r for r in rows if r["saved_bytes"] > 0]  # a change that saves nothing is no answer
    by_memory = sorted(rows, key=lambda r: -r["saved_bytes"])
    by_speed = sorted(rows, key=lambda r: (not r["fits"], r["gpu_hours_factor"], r["slowdown"], -r["saved_bytes"]))
    found = None if now_ok else _cheapest(spec, setup, card, rows)
    plan: list[dict[str, Any]] = []
    reached = setup
    if found is not None:
        reached, steps = found
        for code, step, before, after in steps:
            f = gpu_catalog.fit(estimate_model(spec, after), card)
            x = plan_cost.factors(spec, before, after)  # relative to the setup before the step: they multiply
            plan.append(
                {
                    "change": code,
                    "set": step,
                    "needed_bytes": f["needed_bytes"],
                    "fits": f["fits"],
                    "slowdown": x["time"],
                    "gpu_hours_factor": x["gpu_hours"],
                }
            )
    total = plan_cost.factors(spec, setup, reached)
    return {
        "solve": "changes",
        "fits_now": now_ok,
        "needed_bytes": base,
        "card_bytes": card.memory_bytes,
        "by_memory": by_memory,
        "by_speed": by_speed,
        "plan": {
            "steps": plan,
            "fits": now_ok or found is not None,
            "slowdown": total["time"],
            "gpu_hours_factor": total["gpu_hours"],
            "setup": reached.to_dict() if plan else None,
        },
    }


SOLVES = ("batch", "seq", "gpus", "changes")


def solve(spec: ModelSpec, setup: TrainingSetup, card: Gpu, what: tuple[str, ...] = SOLVES) -> dict[str, Any]:
    """Run the requested solves; each answer carries the figure at the answer (and one step past)."""
    for w in what:
        if w not in SOLVES:
            raise InvalidValueError("bad_choice", "solve", value=w, allowed=", ".join(SOLVES))
    if setup.objective == "grpo":
        # GRPO's micro-batch holds completions in whole groups and its sequence is prompt_length +
        # max_completion_length (cabe.objectives.grpo): the batch and seq sweeps do not apply
        what = tuple(w for w in what if w not in ("batch", "seq"))
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


#: the fields of ``api.fit`` beside the training request of :mod:`cabe.api` (solve, mfu, tokens, price_per_gpu_hour)
FIT_FIELDS = tuple(n for n in schema.names("api.fit") if n not in api.REQUEST_FIELDS)


def plan_json(body: Mapping[str, Any], *, allow_files: bool = False) -> dict[str, Any]:
    """``cabe fit --json``, ``POST /api/fit`` and ``cabe.fit``: the request dict of :mod:`cabe.api` with ``gpu``
    required, an optional ``solve`` (a list or comma string of batch, seq, gpus, changes) and, for the time of the
    setup that fits, ``tokens``, ``mfu`` and ``price_per_gpu_hour`` (:func:`timed`). Raises CabeError."""
    if not isinstance(body, Mapping):
        raise InvalidValueError("body_not_object", None)
    body = dict(body)
    what = body.pop("solve", None) or SOLVES
    if isinstance(what, str):
        what = tuple(w.strip() for w in what.split(",") if w.strip())
    if not isinstance(what, (list, tuple)) or not all(isinstance(w, str) for w in what):
        raise InvalidValueError("bad_choice", "solve", value=what, allowed=", ".join(SOLVES))
    card_name = body.pop("gpu", None)
    if not card_name:
        raise InvalidValueError("missing_gpu", "gpu")
    if not isinstance(card_name, str):
        raise InvalidValueError("not_string", "gpu", value=card_name)
    timing = {k: body.pop(k) for k in ("tokens", "mfu", "price_per_gpu_hour") if k in body}
    timing = {k: _timing_value(k, v) for k, v in timing.items() if v is not None and v != ""}  # checked before solving
    unknown = [k for k in body if k not in api.REQUEST_FIELDS and k not in ("lang", "units")]
    if unknown:
        raise InvalidValueError("unknown_field", unknown[0], allowed=", ".join(api.REQUEST_FIELDS + FIT_FIELDS))
    src = api.model_source(body, allow_files=allow_files)
    if src is None:
        raise InvalidValueError("missing_model", "model")
    setup = api.setup_from(body)
    card = gpu_catalog.gpu(card_name)
    gpu_catalog.check_fp8(card, setup.fp8)  # a card without the recipe's fp8 GEMMs: a typed error
    with grpo.on_card(card):  # a colocated vLLM's pool is a share of the card
        out = solve(src.spec, setup, card, tuple(what))
        if timing:
            out["time"] = timed(src.spec, setup, card, out, **timing)
    return out


def _timing_value(name: str, value: Any) -> float:
    f = schema.field(name, "api.fit")
    hi = f.maximum if f.maximum is not None else 1e300
    return number(name, value, minimum=f.minimum or 0.0, maximum=hi, strict=f.exclusive_minimum)


def timed(
    spec: ModelSpec,
    setup: TrainingSetup,
    card: Gpu,
    out: Mapping[str, Any],
    *,
    tokens: float | None = None,
    mfu: float | None = None,
    price_per_gpu_hour: float | None = None,
) -> dict[str, Any]:
    """The time of a step and, with ``tokens``, the run's hours, GPU-hours and cost, of the setup that fits: the
    current one when it fits, else the cheapest combination (:func:`make_it_fit`); ``for`` says which (None: nothing
    fits, so no time). The numbers as :func:`plan_json` checked them."""
    t, price = tokens, price_per_gpu_hour
    u = schema.field("mfu").default if mfu is None else mfu
    if out["now"]["fits"]:
        which, target = "now", setup
    else:
        changes = out.get("changes") or make_it_fit(spec, setup, card)
        plan = changes["plan"]
        if not plan["fits"] or not plan["steps"]:
            return {"for": None, "tokens": t, "mfu": u, "price_per_gpu_hour": price}
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in plan["setup"].items()}
        which, target = "plan", TrainingSetup(**values)
    res = plan_cost.run_cost(spec, setup, target, card, tokens=t, mfu=u, price=price)
    return {"for": which, **res}
