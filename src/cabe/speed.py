"""Speed beside memory for serving: two bounds no engine can beat on a card, from the card's spec sheet (the GPU
catalog, ``memory_bandwidth_gbs`` and ``bf16_tflops_dense``).

* **Decode, an upper bound on tokens/s.** One decode step of a batch reads every weight the step multiplies once
  and every sequence's cached keys and values once; it cannot take less than those bytes over the card's peak DRAM
  bandwidth. Under tensor parallelism each GPU reads its share at the same time (:mod:`cabe.serving_parallel`), so
  the step is bounded by the GPU that reads the most; pipeline stages run one after another for a token and on other
  micro-batches at the same time (at most pp of them, and no more than the batch's sequences), so a sequence's step
  is the sum of the stages' and a round of the pipeline lasts at least its busiest stage's reads. tokens/s ≤ batch /
  round. An MoE layer reads only the experts its tokens picked: the
  expected number of distinct experts among ``batch × k`` uniform picks, E·(1 − (1 − k/E)^batch) (k at batch 1).
  Reads this leaves out (activations, logits, the engine's own tensors) only lower the real figure.
* **Prefill, a lower bound on seconds.** A prompt's forward takes at least its FLOPs over the peak dense tensor
  FLOPs of every GPU of the replica: 2 × the active weights per token (cabe.flops.matmul_params) plus the attention's
  QKᵀ and A·V over the causal half of the keys (cabe.flops.attention_flops_forward_per_token × context / 2). The
  16-bit peak is the catalog's; weights in fp8 on a card with fp8 tensor cores run W8A8 GEMMs at twice it (H100 SXM
  1,979 vs 989.4, H20 296 vs 148, MI300X 2,614.9 vs 1,307.4, B200 4,500 vs 2,250 dense TFLOPS: the datasheets in
  the catalog's spec_source).

Pure arithmetic, no torch.
"""

from __future__ import annotations

from typing import Any

from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.flops import attention_flops_forward_per_token, matmul_params
from cabe.gpus import Gpu
from cabe.serving_parallel import Layout, expert_bytes_per_rank, kv_per_rank, weights_per_rank


def distinct_experts(experts: int, k: int, batch: int) -> float:
    """Expected distinct experts picked by ``batch`` tokens choosing ``k`` of ``experts`` uniformly."""
    if not experts:
        return 0.0
    return experts * (1 - (1 - k / experts) ** batch)


def decode_bound(
    spec: ModelSpec,
    card: Gpu,
    lay: Layout,
    *,
    context: int,
    batch: int,
    kv_dtype: str = "fp16",
    weights: str = "auto",
    group_size: int = 128,
) -> dict[str, Any]:
    """The decode upper bound (module docstring), per stage and for the replica."""
    if not card.memory_bandwidth_gbs:
        raise InvalidValueError("no_bandwidth", "gpu", value=card.name)
    bw = card.memory_bandwidth_gbs * 1e9
    picked = distinct_experts(spec.num_experts, spec.experts_per_token, batch)
    stages = []
    for s in range(lay.pp):
        w = weights_per_rank(spec, lay, s, weights, group_size)["total_bytes"]
        experts = expert_bytes_per_rank(spec, lay, s, weights, group_size)
        read_w = w - experts + (experts * picked / spec.num_experts if spec.num_experts else 0)
        kv = kv_per_rank(spec, lay, s, context, batch, kv_dtype)
        read = read_w + kv["kv_bytes"] + kv["ssm_state_bytes"]
        stages.append(
            {
                "stage": s,
                "weights_read_bytes": round(read_w),
                "kv_read_bytes": kv["kv_bytes"],
                "bytes": round(read),
                "seconds": read / bw,
            }
        )
    # the pipeline: m = min(batch, pp) micro-batches in flight (vLLM's pp virtual engines); a round gives every
    # sequence one token and lasts at least the busiest stage's reads (its weights once per micro-batch, the whole
    # batch's KV) and at least one micro-batch's pass through every stage
    m = min(batch, lay.pp)
    busiest = max((m * st["weights_read_bytes"] + st["kv_read_bytes"]) / bw for st in stages)
    one_pass = sum((st["weights_read_bytes"] + st["kv_read_bytes"] / m) / bw for st in stages)
    round_s = max(busiest, one_pass)
    latency = sum(st["seconds"] for st in stages)
    worst = max(stages, key=lambda st: st["seconds"])
    return {
        "bound": "upper",
        "bandwidth_gbs": card.memory_bandwidth_gbs,
        "experts_read": round(picked, 2) if spec.num_experts else None,
        "stages": stages,
        "step_seconds": latency,
        "tokens_per_second_per_sequence": 1 / latency,
        "micro_batches": m,
        "round_seconds": round_s,
        "tokens_per_second": batch / round_s,
        "tokens_per_second_total": batch / round_s * lay.dp,
        "step": {
            "key": "infer.speed.decode",
            "formula": "{batch} / ({read} B / {bw} GB/s) = {tps} tokens/s; {read} B = max({m} × {weights} + {kv}, one pass)",
            "bytes": None,
            "params": {
                "batch": batch,
                "read": round(round_s * bw),
                "m": m,
                "weights": worst["weights_read_bytes"],
                "kv": worst["kv_read_bytes"],
                "bw": card.memory_bandwidth_gbs,
                "tps": round(batch / round_s, 1),
            },
        },
    }


def peak_tflops(card: Gpu, weights_format: str) -> float:
    """The card's peak dense tensor TFLOPS for the GEMMs of this weight format (module docstring)."""
    if not card.bf16_tflops_dense:
        raise InvalidValueError("no_tflops", "gpu", value=card.name)
    return card.bf16_tflops_dense * (2 if weights_format == "fp8" and card.fp8 else 1)


def prefill_bound(spec: ModelSpec, card: Gpu, lay: Layout, *, context: int, batch: int, weights_format: str) -> dict:
    """The prefill lower bound (module docstring): ``batch`` prompts of ``context`` tokens on tp × pp GPUs."""
    _, active = matmul_params(spec)
    tokens = batch * context
    attention = attention_flops_forward_per_token(spec, context) * context / 2 * batch
    flops = 2 * active * tokens + attention
    tflops = peak_tflops(card, weights_format)
    gpus = lay.tp * lay.pp
    seconds = flops / (tflops * 1e12 * gpus)
    return {
        "bound": "lower",
        "flops": flops,
        "tflops_peak": tflops,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "step": {
            "key": "infer.speed.prefill",
            "formula": "(2 × {n} × {tokens} + {attn}) FLOPs / ({tflops} TFLOPS × {gpus}) = {seconds} s",
            "bytes": None,
            "params": {
                "n": active,
                "tokens": tokens,
                "attn": round(attention),
                "tflops": tflops,
                "gpus": gpus,
                "seconds": round(seconds, 4),
            },
        },
    }
