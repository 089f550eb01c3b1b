"""Time beside memory: FLOPs of a training step and the time and GPU-hours of a run.

Standard counting (Kaplan et al. 2020; Narayanan et al. 2021; PaLM appendix B), per token:

* forward: 2·N multiply-adds of the weight matrices (N = parameters that multiply activations:
  all but the embedding lookup; for MoE the *active* ones: shared + k/E of the experts — all E where the
  implementation runs every token through every expert, Llama 4's) plus
  attention 2·2·L·s_eff·d_attn (QKᵀ and A·V; s_eff = the attended length, capped by a sliding
  window or an attention chunk; d_attn = heads × head_dim);
* full fine-tuning: backward = 2 × forward (activation gradients + weight gradients): 6·N per
  token + 12·L·s·d_attn for attention, the familiar "6ND";
* LoRA / QLoRA: the frozen base needs activation gradients (2·N) but no weight gradients, so
  4·N per token (+ 6 × the adapters', negligible); attention still 3 × forward (it has no weights);
* freeze: weight gradients only for the trained layers;
* gradient checkpointing recomputes the forward: + 2·N + the forward attention (8·N in all).

The result is hardware FLOPs (recomputation included). Time = FLOPs per GPU /
(``bf16_tflops_dense`` × utilisation); the default utilisation 0.4 is a typical MFU of a well-tuned
run — state yours. Data-parallel GPUs each do their own micro-batches; TP and PP split each one.
"""

from __future__ import annotations

from typing import Any

from cabe import ssm
from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.gpus import Gpu
from cabe.kv_cache import attended
from cabe.training import TrainingSetup, number

DEFAULT_MFU = 0.4


def matmul_params(spec: ModelSpec) -> tuple[int, int]:
    """(all weights that multiply activations, the active ones per token for MoE), summed over the
    layer groups."""
    total = active = 0
    for run in spec.runs:
        dense = sum(lin.weight_count for lin in run.linears if lin.role != "expert")
        experts = sum(lin.weight_count for lin in run.linears if lin.role == "expert")
        total += run.count * (dense + experts)
        # NOTE: Llama 4's dense dispatch (expert_dispatch == "dense") multiplies every token by every expert (the
        # ones not picked scaled by zero): all E are computed, not k
        picked = spec.num_experts if spec.expert_dispatch == "dense" else spec.experts_per_token
        active += run.count * (dense + (experts * picked // spec.num_experts if spec.num_experts else experts))
    head = spec.vocab_size * spec.hidden_size  # lm_head (or the tied embedding used as one)
    return total + head, active + head


def attention_flops_forward_per_token(spec: ModelSpec, seq: int) -> float:
    """2·2·s_eff·d_attn per layer and token (QKᵀ and A·V over the attended length, average s/2 under
    a causal mask is NOT assumed: kernels like FlashAttention skip masked blocks, but MFU
    conventions (PaLM) count the full s; cabe follows the convention), summed over the layer groups."""
    la = spec.latent_attention
    # multi-head latent attention: QKᵀ over heads × (nope + rope), A·V over heads × v_head_dim
    width = spec.num_heads * (la.qk_head_dim + la.v_head_dim) if la else 2 * spec.q_dim
    # a Mamba-2 layer attends nothing: its chunked scan instead (cabe.ssm.scan_flops_forward_per_token)
    attention = 2 * width * sum(g.count * attended(g, seq) for g in spec.layer_groups if g.mixer == "attention")
    return attention + ssm.scan_flops_forward_per_token(spec)


def step_flops(spec: ModelSpec, setup: TrainingSetup) -> dict[str, Any]:
    """FLOPs of one optimizer step for the whole model (all micro-batches of one data-parallel rank)."""
    _, n = matmul_params(spec)
    tokens = setup.batch * setup.seq * setup.grad_accum
    attn_f = attention_flops_forward_per_token(spec, setup.seq)
    fwd = 2 * n + attn_f
    if setup.method == "full":
        bwd = 4 * n + 2 * attn_f
        formula = "6·N + 12·L·s·d"
    elif setup.method == "freeze":
        frac = min(setup.trainable_layers, spec.num_layers) / spec.num_layers
        bwd = (2 * n + 2 * attn_f) * frac + 2 * n * frac  # gradients only reach the trained top layers
        formula = "2·N + (4·N + 8·L·s·d)·k/L"
    else:
        bwd = 2 * n + 2 * attn_f
        formula = "4·N + 12·L·s·d"
    recompute = fwd if setup.checkpointing else 0
    per_token = fwd + bwd + recompute
    model_per_token = fwd + bwd
    return {
        "active_params": n,
        "tokens_per_rank_step": tokens,
        "forward_per_token": fwd,
        "backward_per_token": bwd,
        "recompute_per_token": recompute,
        "per_token": per_token,
        "formula": formula,
        "hardware_flops": per_token * tokens,
        "model_flops": model_per_token * tokens,
    }


def run_time(
    spec: ModelSpec, setup: TrainingSetup, card: Gpu, *, tokens: float | None = None, mfu: float = DEFAULT_MFU
) -> dict[str, Any]:
    """Seconds per optimizer step on ``card`` at utilisation ``mfu``; with ``tokens``, the run's
    wall-clock hours and GPU-hours (tokens / (tokens per step × data-parallel GPUs) steps)."""
    u = number("mfu", mfu, minimum=0.0, maximum=1.0, strict=True)
    if not card.bf16_tflops_dense:
        raise InvalidValueError("no_tflops", "gpu", value=card.name)
    f = step_flops(spec, setup)
    mp = setup.tp * setup.pp
    dp = max(setup.gpus // mp, 1)
    per_gpu = f["hardware_flops"] / mp
    step_s = per_gpu / (card.bf16_tflops_dense * 1e12 * u)
    out: dict[str, Any] = {
        **f,
        "mfu": u,
        "gpu": card.name,
        "gpus": setup.gpus,
        "dp": dp,
        "tflops_peak": card.bf16_tflops_dense,
        "flops_per_step": per_gpu,
        "step_seconds": step_s,
        "tokens_per_step": f["tokens_per_rank_step"] * dp,
        "tokens": None,
        "run_hours": None,
        "gpu_hours": None,
    }
    if tokens is not None:
        t = number("tokens", tokens, minimum=0.0, maximum=1e16, strict=True)
        steps = t / (f["tokens_per_rank_step"] * dp)
        hours = steps * step_s / 3600
        out.update({"tokens": t, "steps": steps, "run_hours": hours, "gpu_hours": hours * setup.gpus})
    return out
