"""One GRPO step with TRL's GRPOTrainer (trl 1.16.0), phase by phase, and its peak.

A step of ``GRPOTrainer`` (trainer/grpo_trainer.py) on one card, in the order it runs:

1. ``generation`` (``_generate_single_turn``, l.1763-1891): completions for the local generation batch, ``G`` =
   ``generation_batch_size`` / GPUs, else ``batch`` x ``steps_per_generation`` (grpo_config.py:1097-1112; the
   dataloader's batch is ``per_device_train_batch_size x steps_per_generation`` rows, each prompt repeated
   ``num_generations`` times, l.1258-1316). With HF ``generate`` (``use_vllm`` off) the policy runs
   ``generate`` on all G rows at once under ``torch.no_grad`` (l.1859-1869): :mod:`cabe.generation`'s moments, a
   prompt of ``prompt_length`` and ``max_completion_length`` new tokens (the worst case: no row stops early). A
   colocated vLLM (``vllm_mode="colocate"``) generates inside its own pool, ``vllm_gpu_memory_utilization`` x the
   card's memory (vLLM's ``requested_memory``, :mod:`cabe.engines.vllm`), made at start-up and resident beside the
   policy's states for the whole run, unless ``vllm_enable_sleep_mode``: TRL then puts the engine to sleep at
   level 2 (weights and KV cache released, generation/vllm_generation.py:365-366 and 750-752) after every
   generation and wakes it before the next (l.489-491, 704-705). ``vllm_mode="server"`` generates on another GPU.
   Generation comes at the start of an optimizer step (``_prepare_inputs``, l.1522-1551): the gradients of the step
   before are gone (``zero_grad``), the optimizer's state is there.
2. ``reference`` (l.2631-2741, under ``torch.no_grad``): the log-probs of every completion, ``batch`` rows at a time
   (``batch_size = per_device_train_batch_size``, l.2505), through the fused log-prob head
   (:mod:`cabe.objectives.fused_head`): the policy's "old" log-probs when the generation is reused across optimizer
   steps or vLLM's importance sampling is on (l.2641-2656), the reference model's when ``beta`` > 0. The reference
   is a second model in the policy's dtype for full fine-tuning (l.992-1003); with a PEFT model it is the base with
   the adapter disabled (``use_adapter(model, None)``, l.2722-2735), no second copy.
3. ``forward``, ``backward``, ``optimizer`` (``_compute_loss``, l.3020-3292): the SFT step of :mod:`cabe.analytic`
   on ``batch`` completions of ``prompt_length + max_completion_length`` tokens, its head the fused one.

Beside every phase: the policy's states, the reference model's weights, the rollout (the generation batch's ids,
masks, advantages and log-probs, buffered for the ``steps_per_generation`` micro-batches, l.1540-1547) and, colocated
without sleep mode, the vLLM engine's pool. The peak is the largest phase.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from cabe import generation
from cabe.architecture import ModelSpec
from cabe.engines import vllm
from cabe.errors import InvalidValueError
from cabe.kv_cache import per_layer_token_bytes
from cabe.objectives.fused_head import fused_head, scored_tokens
from cabe.precision import Dtypes, dtypes_for, resolve
from cabe.report import Report, Step
from cabe.schema import MAX_SEQ
from cabe.training import TrainingSetup
from cabe.units import round_alloc

#: the caching allocator's slack beside the peak (cabe.analytic.lesson.ALLOCATOR_SLACK_FRACTION; not imported:
#: cabe.analytic dispatches here)
ALLOCATOR_SLACK_FRACTION = 0.05

#: the card a request names (``gpu``): a colocated engine's pool is a share of its memory
_CARD: ContextVar[Any] = ContextVar("grpo_card", default=None)
#: the phases of a GRPO step, in the order they run
PHASES = ("generation", "reference", "forward", "backward", "optimizer")
#: what stays from one optimizer step to the next (the rest of the policy's peak is the step's own): the states and
#: cuBLAS's workspaces (one per handle: the forward's, the backward's), which ``generate`` and the no-grad passes
#: reuse (they run on the forward's stream and handle)
_STATES = ("weights", "master_weights", "optimizer", "cuda_workspaces")
#: trainer/utils.py / vllm_generation.py:359: TRL starts the colocated engine with max_num_batched_tokens=4096
VLLM_BATCHED_TOKENS = 4096
_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@contextlib.contextmanager
def on_card(card: Any) -> Iterator[None]:
    """Estimates inside see ``card`` (a :class:`cabe.gpus.Gpu`, or None): the colocated engine's pool."""
    token = _CARD.set(card)
    try:
        yield
    finally:
        _CARD.reset(token)


@dataclass(frozen=True)
class Shape:
    """The step's sizes: ``g`` completions generated at once per GPU, ``steps`` micro-batches per generation, ``p``
    prompt and ``c`` completion tokens, ``old`` whether the policy's old log-probs are computed, ``ref`` the
    reference (``none``, ``model``: a second model, ``adapter``: the base with the adapter disabled)."""

    g: int
    steps: int
    p: int
    c: int
    old: bool
    ref: str


def shape(setup: TrainingSetup) -> Shape:
    """The step's sizes, checked as GRPOConfig.__post_init__ checks them (grpo_config.py:1094-1136)."""
    dp = max(setup.gpus, 1)
    micro = setup.batch * dp  # the global batch of one micro-step
    if setup.generation_batch_size is not None and setup.steps_per_generation is not None:
        raise InvalidValueError("grpo_generation_both", "steps_per_generation", value=setup.steps_per_generation)
    if setup.generation_batch_size is not None:
        if setup.generation_batch_size % micro:
            raise InvalidValueError(
                "grpo_generation_batch", "generation_batch_size", value=setup.generation_batch_size, batch=micro
            )
        steps = setup.generation_batch_size // micro
    else:
        steps = setup.steps_per_generation or setup.grad_accum
    total = micro * steps
    if total % setup.num_generations:
        raise InvalidValueError(
            "grpo_generation_groups", "num_generations", value=setup.num_generations, generation_batch=total
        )
    # l.2641-2656: the old log-probs when generation and optimizer steps are misaligned (num_iterations is 1 here),
    # or always with vLLM's importance sampling correction (on by default, grpo_config.py:925)
    old = setup.grad_accum % steps != 0 or setup.use_vllm
    peft = setup.method in ("lora", "qlora", "prompt-tuning")
    ref = "none" if setup.beta == 0 else ("adapter" if peft else "model")
    return Shape(total // dp, steps, setup.resolved_prompt_length, setup.max_completion_length, old, ref)


def check(setup: TrainingSetup, card: Any) -> None:
    """What this model does not cover, refused in one sentence each."""
    if setup.shard in ("zero3", "fsdp", "fsdp-hybrid") or setup.tp > 1 or setup.pp > 1 or setup.cp > 1 or setup.ep > 1:
        # generation gathers sharded weights (ds3_gather_for_generation, summon_full_params): not modelled; TRL
        # refuses context parallelism itself (grpo_config.py:1064-1072)
        raise InvalidValueError("grpo_layout", "shard" if setup.shard != "none" else "tp", value=setup.shard)
    if setup.resolved_prompt_length < 1:  # a prompt of no token: nothing to generate from (0 is a preference default)
        raise InvalidValueError("out_of_range", "prompt_length", value=0, minimum=1, maximum=MAX_SEQ)
    if setup.use_vllm and setup.vllm_mode == "colocate" and card is None:
        raise InvalidValueError("grpo_colocate_needs_gpu", "vllm_mode", value="colocate")


def estimate(spec: ModelSpec, setup: TrainingSetup, sft: Any, model_meta: dict[str, Any] | None) -> Report:
    """The peak of one GRPO step: the largest of its phases (:data:`PHASES`)."""
    card = _CARD.get()
    check(setup, card)
    sh = shape(setup)
    policy: Report = sft(spec, setup.with_(seq=sh.p + sh.c), model_meta=model_meta)
    resolved = resolve(setup, spec.dtype)
    dt = dtypes_for(resolved)
    act = "fp32" if dt.compute == 4 else ("fp16" if resolved.autocast == "fp16" else "bf16")
    states = {k: policy.components[k] for k in _STATES if policy.components.get(k)}
    beside: dict[str, int] = {}
    if sh.ref == "model":  # a second model in the policy's dtype (model_init_kwargs.setdefault("dtype", ...))
        beside["reference_weights"] = reference_weights(spec, resolved)
    beside["rollout"] = rollout_bytes(sh, setup)
    engine = engine_figures(spec, setup, card, act, sh) if setup.use_vllm and setup.vllm_mode == "colocate" else None
    resident_engine = {"vllm_engine": engine["pool_bytes"]} if engine and not setup.vllm_enable_sleep_mode else {}
    phases: dict[str, dict[str, int]] = {}
    if engine is not None:
        phases["generation"] = {**states, **beside, "vllm_engine": engine["pool_bytes"]}
    elif setup.use_vllm:  # server mode: the completions come over HTTP
        phases["generation"] = {**states, **beside}
    else:
        phases["generation"] = {**states, **beside, **hf_generate(spec, sh, act)}
    if sh.old or sh.ref != "none":
        phases["reference"] = {**states, **beside, **resident_engine, **no_grad_pass(spec, resolved, sh, dt, act)}
    for phase in ("forward", "backward", "optimizer"):
        rest = policy.phase_peaks.get(phase, 0) - sum(states.values())
        phases[phase] = {**states, **beside, **resident_engine, "policy_step": rest}
    totals = {k: sum(v.values()) for k, v in phases.items()}
    best = max(totals.values())
    peak_name = next(k for k in PHASES if totals.get(k) == best)
    if peak_name in ("forward", "backward", "optimizer") and policy.peak_phase == peak_name:
        components = {**policy.components, **beside, **resident_engine}
    elif peak_name in ("forward", "backward", "optimizer"):  # (another phase of the policy step: its total only)
        components = {**states, **beside, **resident_engine, "policy_step": phases[peak_name]["policy_step"]}
    else:
        components = dict(phases[peak_name])
    total = sum(components.values())
    info = {
        "generation_batch": sh.g,
        "steps_per_generation": sh.steps,
        "num_generations": setup.num_generations,
        "prompts_per_generation": sh.g // setup.num_generations if sh.g % setup.num_generations == 0 else None,
        "prompt_length": sh.p,
        "max_completion_length": sh.c,
        "scored_tokens": scored_tokens(setup.with_(seq=sh.p + sh.c)),
        "reference": sh.ref,
        "old_log_probs": sh.old,
        "generator": "vllm-" + setup.vllm_mode if setup.use_vllm else "hf-generate",
        "phase_components": phases,
        **({"vllm": engine} if engine else {}),
    }
    # the head is TRL's fused log-prob kernel, whatever --loss would say of an SFT step
    notes = tuple(n for n in policy.notes if n != "loss_assumed_hf") + (
        ("grpo_vllm_modelled",) if setup.use_vllm else ()
    )
    loss: dict[str, Any] = {"loss": "trl-fused-head", "recipe": None, "assumed": [], "unmodelled": []}
    return Report(
        mode="architecture",
        total_bytes=total,
        components=components,
        parameters=policy.parameters,
        trainable_parameters=policy.trainable_parameters,
        peak_phase=peak_name,
        phase_peaks={k: totals[k] for k in PHASES if k in totals},
        steps=tuple(policy.steps) + tuple(_steps(phases, info)),
        setup={**policy.setup, "objective": "grpo"},
        model=policy.model,
        paged_bytes=policy.paged_bytes,
        cuda_context_bytes=policy.cuda_context_bytes,
        # (the SFT estimate's larger slack is 4 B per logit of the batch: this head makes no logits; the engine's pool
        # is vLLM's, made in one piece when it starts)
        allocator_slack_bytes=round((total - components.get("vllm_engine", 0)) * ALLOCATOR_SLACK_FRACTION),
        notes=notes,
        extra={**{k: v for k, v in policy.extra.items() if k == "peak_at"}, "loss": loss, "grpo": info},
    )


def reference_weights(spec: ModelSpec, setup: TrainingSetup) -> int:
    """A second model loaded like the policy (l.1001: ``model_init_kwargs.setdefault("dtype", self.model.dtype)``)."""
    return spec.parameter_count * _BYTES.get(setup.dtype, 2) + spec.buffer_bytes


def rollout_bytes(sh: Shape, setup: TrainingSetup) -> int:
    """The buffered generation batch (l.2859-2935, ``output``): prompt and completion ids and masks (int64), the
    advantages (fp32) and each ``[G, C]`` fp32 log-prob tensor kept: the old ones, the reference's, vLLM's sampling
    log-probs and importance-sampling ratios."""
    logps = int(sh.old) + int(sh.ref != "none") + (2 if setup.use_vllm else 0)
    return (
        2 * round_alloc(8 * sh.g * sh.p)
        + 2 * round_alloc(8 * sh.g * sh.c)
        + round_alloc(4 * sh.g)
        + logps * round_alloc(4 * sh.g * sh.c)
    )


def hf_generate(spec: ModelSpec, sh: Shape, act: str) -> dict[str, int]:
    """transformers' ``generate`` on the G rows (:func:`cabe.generation.peak`), the cache in the compute dtype."""
    _, comps = generation.peak(
        spec,
        prompt=sh.p,
        new_tokens=sh.c,
        batch=sh.g,
        chunk=sh.p,
        act_dtype=act,
        kv_per_token=per_layer_token_bytes(spec, act),
    )
    return {k: v for k, v in comps.items() if k != "cuda_workspaces"}  # (the forward's, resident)


def no_grad_pass(spec: ModelSpec, setup: TrainingSetup, sh: Shape, dt: Dtypes, act: str) -> dict[str, int]:
    """One no-grad forward of ``batch`` rows of ``p + c`` tokens through the fused head, beside the concatenated ids
    and mask of the whole generation batch (l.2501-2502) and the log-probs made so far. The policy's head asks for
    log-probs and entropy (grpo_trainer.py:1068-1073), a separate reference's for log-probs only (l.1075-1077)."""
    b, s = setup.batch, sh.p + sh.c
    rows = setup.with_(seq=s)
    outputs = 2 if sh.old or sh.ref == "adapter" else 1
    f = fused_head(spec, rows, dt, outputs, grad=False)
    head = f.hidden_states + f.kept + f.forward_transient
    # the top decoder layer at its MLP (cabe.generation's prefill moment, its cache apart: use_cache=False)
    layer = generation.moments(
        spec, prompt=s, new_tokens=1, batch=b, chunk=s, act_dtype=act, kv_per_token=per_layer_token_bytes(spec, act)
    )["prefill"]["activations"]
    return {
        "activations": max(layer, head) + 2 * round_alloc(8 * sh.g * s),
    }


def engine_figures(spec: ModelSpec, setup: TrainingSetup, card: Any, act: str, sh: Shape) -> dict[str, Any]:
    """The colocated engine: vLLM's pool on ``card`` (:func:`cabe.engines.vllm.serving`, with TRL's
    ``max_num_seqs = batch x steps_per_generation`` and ``max_num_batched_tokens = 4096``, vllm_generation.py and
    grpo_trainer.py:1121-1123) and the KV cache it leaves for the G completions."""
    util = setup.vllm_gpu_memory_utilization
    served = vllm.serving(
        spec,
        card,
        weights=act,
        kv_dtype=act,
        context=sh.p + sh.c,
        gpu_memory_utilization=util,
        max_num_batched_tokens=VLLM_BATCHED_TOKENS,
        max_num_seqs=setup.batch * sh.steps,
    )
    # the budget includes the process's CUDA context, counted once beside the report (Report.cuda_context_bytes)
    pool = round(util * card.memory_bytes) - card.cuda_context_bytes
    if pool <= 0 or not served.get("fits"):
        raise InvalidValueError("grpo_engine_too_small", "vllm_gpu_memory_utilization", value=util, gpu=card.name)
    return {
        "gpu": card.name,
        "gpu_memory_utilization": util,
        "pool_bytes": pool,
        "kv_pool_bytes": served["kv_pool_bytes"],
        "weights_bytes": served["weights_bytes"],
        "max_concurrent_sequences": served["max_concurrent_sequences"],
        "completions": sh.g,
        "sleep_mode": setup.vllm_enable_sleep_mode,
    }


def _steps(phases: dict[str, dict[str, int]], info: dict[str, Any]) -> list[Step]:
    """One explained line per phase: its total and what it holds."""
    out = [
        Step(
            key="grpo.shape",
            formula="G = {g} completions ({prompts} prompts × {k}), {steps} micro-batches per generation",
            params={
                "g": info["generation_batch"],
                "prompts": info["prompts_per_generation"],
                "k": info["num_generations"],
                "steps": info["steps_per_generation"],
            },
        )
    ]
    for name, comps in phases.items():
        out.append(
            Step(
                key="grpo.phase." + name,
                formula=" + ".join("{" + k + "}" for k, v in comps.items() if v) + " B",
                bytes=sum(comps.values()),
                params={k: v for k, v in comps.items() if v},
            )
        )
    return out
