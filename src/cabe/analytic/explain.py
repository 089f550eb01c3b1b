"""The explanation: the worked steps (:class:`cabe.report.Step`) a report carries for each figure — the
precision chosen, packing, the model, each kind of state, the activations per layer and under checkpointing. Codes and
numbers only; the words are the catalogs' (cabe/i18n). Proved by tests/test_python_api.py and tests/test_i18n.py."""

from __future__ import annotations

from typing import Any

from cabe import fp8, memo
from cabe.activations import (
    HeadActivations,
    LayerActivations,
)
from cabe.analytic.parts import _frozen_copies, _frozen_inputs, _temporaries_key
from cabe.analytic.runs import _Activations, _packed_mask
from cabe.analytic.states import _States
from cabe.architecture import ModelSpec
from cabe.precision import Dtypes
from cabe.report import Step
from cabe.training import TrainingSetup
from cabe.units import CUDA_WORKSPACES, GiB


def _packing_steps(spec: ModelSpec, given: TrainingSetup, shaped: TrainingSetup) -> list[Step]:
    """Which sequence length sets the peak: the row the attention spans (``seq``; batch × seq padding-free)."""
    if given.packing == "none":
        return []
    kernel = "sdpa_masked" if _packed_mask(spec, shaped) else shaped.attention
    return [
        Step(
            "setup.packing",
            "{rows} × {row} tokens, attention over {row} ({kernel})",
            None,
            {"packing": given.packing, "rows": shaped.batch, "row": shaped.seq, "kernel": kernel},
        )
    ]


def _precision_step(setup: TrainingSetup, source: str) -> Step:
    """Which dtype and autocast the estimate assumed, and where the dtype came from."""
    return Step(
        "setup.precision",
        "dtype {dtype} ({source}), autocast {autocast}",
        None,
        {"dtype": setup.dtype, "source": source, "autocast": setup.autocast, "precision": setup.precision},
    )


def _fp8_step(setup: TrainingSetup, act: _Activations) -> list[Step]:
    """fp8 training: torchao's largest cast moment of a layer (forward or backward, beyond what the layers saved:
    cabe.activations.compose ``_fp8_moments``), or Transformer Engine's saved fp8 inputs (the ``input_fp8`` terms)."""
    if setup.fp8 == "none":
        return []
    if fp8.is_torchao(setup.fp8):
        fwd = max((r.per_layer.fp8_forward_bytes for r in act.runs), default=0)
        bwd = max((r.per_layer.fp8_backward_bytes for r in act.runs), default=0)
        formula = f"max({fwd:,}, {bwd:,})"
        return [Step("fp8", formula, max(fwd, bwd), {"fp8": setup.fp8})]
    per_token = max(
        (sum(t.bytes_per_token for t in r.per_layer.terms if t.name.endswith(".input_fp8")) for r in act.runs),
        default=0,
    )
    formula = f"{per_token:,} × {act.tokens:,}"
    return [Step("fp8", formula, per_token * act.tokens, {"fp8": setup.fp8})]


def _explain_model(
    spec: ModelSpec,
    setup: TrainingSetup,
    dt: Dtypes,
    states: _States,
    act: _Activations,
    copies: tuple[int, int],
    head: HeadActivations,
    peak: Any,
    total: int,
) -> list[Step]:
    """The report's explanation, figure by figure: model states, then activations and the peak."""
    return (
        _explain_states(spec, setup, dt, states, copies)
        + _fp8_step(setup, act)
        + _explain_activations(spec, setup, dt, act, head, peak, total)
    )


# NOTE: long but flat (radon C or better): one Step literal per explained figure, read top to bottom.
def _explain_states(
    spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, states: _States, copies: tuple[int, int]
) -> list[Step]:
    """The model states' steps, one kind of state after the other: the parameter count, the weights, the gradients,
    the optimizer's state and step, the weight copies."""
    return [*_states_steps(spec, setup, dt, states), *_copies_steps(*copies)]


def _states_steps(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, states: _States) -> tuple[Step, ...]:
    """The steps of the parameter count, the weights, the gradients and the optimizer: independent of the batch and
    the sequence, so built once per states and request less its shape (cabe.memo; shared, never mutated)."""
    key = ("states_steps", memo.request_key(setup), id(dt))
    hit = states.memo.get(key)
    if hit is None:
        steps = (
            _parameters_step(spec),
            *_weight_steps(spec, states),
            _gradients_step(setup, dt, states),
            *_optimizer_steps(setup, states),
        )
        hit = states.memo[key] = (dt, steps)
    return hit[1]


def _parameters_step(spec: ModelSpec) -> Step:
    """The parameter count, term by term: embeddings, one term per run of like layers, norms, head, vision."""
    pos = " + {p}·{h}" if spec.position_embedding_count else ""
    # one "count × per layer" term per run of like layers (one term when the layers are alike)
    runs = spec.runs
    sfx = [""] if len(runs) == 1 else [f"_{i}" for i in range(len(runs))]
    layer_terms = " + ".join(f"{{layers{x}}} × {{per_layer{x}}}" for x in sfx)
    per_run = {f"layers{x}": run.count for x, run in zip(sfx, runs)}
    per_run.update({f"per_layer{x}": spec.layer_count(run) for x, run in zip(sfx, runs)})
    pos += " + {t}·{h}" if spec.token_type_count else ""
    lm_head = "" if spec.tie_word_embeddings or spec.head != "lm" else " + {v}·{h}"
    lm_head += " + {head}" if spec.classifier_count else ""
    lm_head += " + {vision}" if spec.vision_parameters else ""  # a vision tower and its projector (Gemma 3, Llama 4)
    return Step(
        "model.parameters",
        "{v}·{h}" + pos + " + " + layer_terms + " + {norm}" + lm_head + " = {n}",
        None,
        {
            "v": spec.vocab_size,
            "h": spec.hidden_size,
            "p": spec.max_positions,
            **per_run,
            "norm": spec.norm_param_count,
            "n": spec.parameter_count,
            # an encoder's token types and classifier head (BERT), only where the model has them
            **({"t": spec.token_types} if spec.token_type_count else {}),
            **({"head": spec.classifier_count} if spec.classifier_count else {}),
            **({"vision": spec.vision_parameters} if spec.vision_parameters else {}),
        },
    )


def _weight_steps(spec: ModelSpec, states: _States) -> list[Step]:
    """The 4-bit weights, the dense ones (with the frozen count) and the model's buffers."""
    tensors, weights, quant = states.tensors, states.weights, states.quant
    steps: list[Step] = []
    frozen = spec.parameter_count - sum(t.total for t in tensors if t.trainable and t.kind not in ("adapter", "prompt"))
    if quant:
        qn = sum(t.total for t in tensors if t.kind == "quantized")
        steps.append(
            Step(
                "weights.quantized",
                "{n} × {per} B = {bytes} B = {gib} GiB",
                quant,
                {"n": qn, "per": round(quant / qn, 4), "bytes": quant, "gib": quant / GiB},
            )
        )
    dense_n = sum(t.total for t in tensors if t.kind != "quantized")
    steps.append(
        Step(
            "weights.dense",
            "{n} × {per} B = {bytes} B = {gib} GiB",
            weights,
            {
                "n": dense_n,
                "per": round(weights / max(dense_n, 1), 3),
                "bytes": weights,
                "gib": weights / GiB,
                "frozen": frozen,
            },
        )
    )
    if spec.buffer_bytes:
        steps.append(
            Step(
                "weights.buffers",
                "{bytes} B = {gib} GiB",
                spec.buffer_bytes,
                {"bytes": spec.buffer_bytes, "gib": spec.buffer_bytes / GiB},
            )
        )
    return steps


def _gradients_step(setup: TrainingSetup, dt: Dtypes, states: _States) -> Step:
    grads, n_train = states.grads, states.n_train
    return Step(
        "gradients",
        "{n} × {per} B = {bytes} B = {gib} GiB",
        grads,
        {
            "n": n_train,
            "per": dt.grad if setup.method in ("full", "freeze") else dt.adapter,
            "bytes": grads,
            "gib": grads / GiB,
        },
    )


def _optimizer_steps(setup: TrainingSetup, states: _States) -> list[Step]:
    """The optimizer's state (on the device, paged), CUDA's workspaces and the step's temporaries."""
    opt, n_train = states.opt, states.n_train
    steps: list[Step] = []
    steps.append(
        Step(
            "optimizer." + setup.optimizer,
            "{n} × {per} B = {bytes} B = {gib} GiB",
            opt.state_bytes,
            {
                "n": n_train,
                "per": round(opt.state_bytes_per_param, 3),
                "bytes": opt.state_bytes,
                "gib": opt.state_bytes / GiB,
            },
        )
    )
    if opt.paged_bytes:
        steps.append(
            Step(
                "optimizer.paged",
                "{bytes} B = {gib} GiB",
                opt.paged_bytes,
                {"bytes": opt.paged_bytes, "gib": opt.paged_bytes / GiB},
            )
        )
    steps.append(
        Step(
            "cuda_workspaces",
            "2 × 32 MiB = {bytes} B = {gib} GiB",
            CUDA_WORKSPACES,
            {"bytes": CUDA_WORKSPACES, "gib": CUDA_WORKSPACES / GiB},
        )
    )
    if opt.temp_bytes:
        steps.append(
            Step(
                "optimizer_temporaries." + _temporaries_key(setup),
                "{bytes} B = {gib} GiB",
                opt.temp_bytes,
                {"bytes": opt.temp_bytes, "gib": opt.temp_bytes / GiB},
            )
        )
    return steps


def _copies_steps(copies: int, experts: int = 0) -> list[Step]:
    """The 16-bit weight copies a step makes, when it makes any (``experts``: of them, the routed experts')."""
    steps: list[Step] = []
    if copies:
        params: dict[str, Any] = {"n": copies // 2, "bytes": copies, "gib": copies / GiB}
        if experts:
            params["experts"] = experts
        steps.append(Step("weight_copies", "2 B × {n} = {bytes} B = {gib} GiB", copies, params))
    return steps


def _checkpointed_steps(spec: ModelSpec, dt: Dtypes, act: _Activations) -> list[Step]:
    """Checkpointing: the inputs the checkpointed layers keep (on the host when offloaded) and, under
    selective checkpointing, the full activations of the layers left out."""
    ckpt_layers = act.checkpointed_layers
    inputs = sum(n * r.saved_layer_bytes for r, n, ck in act.pieces() if ck)
    # (the residual's width: h, or DeepSeek-V4's hc_mult streams of it)
    params = {"layers": ckpt_layers, "tokens": act.tokens, "rho": dt.residual, "h": spec.residual_width}
    formula = "{layers} × {tokens} tokens × {rho}·{h} = {bytes} B = {gib} GiB"
    code = "activations.offloaded" if act.offload else "activations.checkpointed"
    steps = [Step(code, formula, 0 if act.offload else inputs, {**params, "bytes": inputs, "gib": inputs / GiB})]
    plain = [(r, n) for r, n, ck in act.pieces() if not ck]
    if plain:
        layers = sum(n for _, n in plain)
        kept = sum(n * r.plain_layer_bytes for r, n in plain)
        steps.append(
            Step(
                "activations.selective",
                "{layers} × {per_layer} B = {bytes} B = {gib} GiB",
                kept,
                {"layers": layers, "every": act.every, "per_layer": kept // layers, "bytes": kept, "gib": kept / GiB},
            )
        )
    return steps


def _frozen_steps(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, act: _Activations) -> list[Step]:
    """Checkpointing with layers below the gradient's path (freeze's frozen bottom): what they keep, as
    :func:`cabe.analytic.parts._frozen_inputs` and ``_frozen_copies`` count it (transformers'
    ``enable_input_require_grads`` puts them in autograd's graph: a checkpointed one keeps its input, one left out of
    selective checkpointing what it saves, with autocast's copies of its frozen weights). Without checkpointing they
    keep nothing: no input of theirs requires grad."""
    if not act.first:
        return []
    kept = _frozen_inputs(spec, setup, dt, act) + _frozen_copies(spec, setup, dt, act)
    ckpt = sum(1 for i in range(act.first) if act.checkpointed(i))
    per_input = 0 if act.offload else act.runs[0].saved_layer_bytes
    return [
        Step(
            "activations.frozen_inputs",
            "{checkpointed} × {per_input} B + {plain} B = {bytes} B = {gib} GiB",
            kept,
            {
                "layers": act.first,
                "checkpointed": ckpt,
                "per_input": per_input,
                "plain": kept - ckpt * per_input,
                "bytes": kept,
                "gib": kept / GiB,
            },
        )
    ]


_PER_LAYER_STEPS: dict[tuple[Any, ...], Step] = {}


def _per_layer_step(per_layer: LayerActivations, layers: int | None) -> Step:
    """The saved tensors of one layer, term by term (``layers``: how many such layers, when they differ). Keyed by
    the terms themselves (values: the same terms give the same step), so that a sweep over the batch builds it once."""
    key = (per_layer.terms, layers)
    hit = _PER_LAYER_STEPS.get(key)
    if hit is None:
        if len(_PER_LAYER_STEPS) > memo.MAX_ENTRIES:
            _PER_LAYER_STEPS.clear()
        hit = _PER_LAYER_STEPS[key] = _build_per_layer_step(per_layer, layers)
    return hit


def _build_per_layer_step(per_layer: LayerActivations, layers: int | None) -> Step:
    return Step(
        "activations.per_layer",
        "{terms} = {per_token} B/token",
        None,
        {
            "terms": " + ".join(t.formula for t in per_layer.terms),
            "per_token": per_layer.bytes_per_token,
            **({"layers": layers} if layers is not None else {}),
            "detail": [
                {"name": t.name, "formula": t.formula, "bytes_per_token": t.bytes_per_token} for t in per_layer.terms
            ],
        },
    )


# NOTE: long but flat (radon C or better): one Step literal per explained figure, read top to bottom.
def _explain_activations(
    spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, act: _Activations, head: HeadActivations, peak: Any, total: int
) -> list[Step]:
    tokens, grad_layers, saved = act.tokens, act.grad_layers, act.saved_bytes
    # one step per kind of layer in the gradient's path (one when the layers are alike)
    by_id: dict[int, tuple[LayerActivations, int]] = {}  # (runs of one kind share one LayerActivations)
    for r in act.runs:
        by_id[id(r.per_layer)] = (r.per_layer, by_id.get(id(r.per_layer), (r.per_layer, 0))[1] + r.count)
    kinds = dict(by_id.values())
    sfx = [""] if len(kinds) == 1 else [f"_{i}" for i in range(len(kinds))]
    steps = [_per_layer_step(per_layer, count if len(kinds) > 1 else None) for per_layer, count in kinds.items()]
    if setup.checkpointing:
        steps += _checkpointed_steps(spec, dt, act) + _frozen_steps(spec, setup, dt, act)
    else:
        terms = " + ".join(f"{{layers{x}}} × {{tokens}} tokens × {{per_token{x}}} B" for x in sfx)
        per_kind = {f"layers{x}": n for x, n in zip(sfx, kinds.values())}
        per_kind.update({f"per_token{x}": k.bytes_per_token for x, k in zip(sfx, kinds)})
        steps.append(
            Step(
                "activations.layers",
                terms + " = {bytes} B = {gib} GiB",
                saved,
                {
                    "layers": grad_layers,
                    "tokens": tokens,
                    **per_kind,
                    "bytes": saved,
                    "gib": saved / GiB,
                },
            )
        )
    steps.append(
        Step(
            "logits",
            "{tokens} tokens × {v} × ({a} + 4 + 4) B = {bytes} B = {gib} GiB",
            tokens * (head.logits + head.saved_logsoftmax + head.forward_peak_extra),
            {
                "tokens": tokens,
                "v": spec.vocab_size,
                "a": dt.compute,
                "bytes": tokens * (head.logits + head.saved_logsoftmax + head.forward_peak_extra),
                "gib": tokens * (head.logits + head.saved_logsoftmax + head.forward_peak_extra) / GiB,
            },
        )
    )
    steps.append(
        Step(
            "peak." + peak.phase,
            " + ".join("{" + k + "}" for k, v in peak.components.items() if v) + " = {total} B = {gib} GiB",
            total,
            {**{k: v for k, v in peak.components.items() if v}, "total": total, "gib": total / GiB},
        )
    )
    return steps
