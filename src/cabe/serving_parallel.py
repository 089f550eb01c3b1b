"""Several GPUs per serving replica: what ONE GPU holds when vLLM (and SGLang, which shares its layers) shards a model
with tensor parallelism (``tp``) and pipeline parallelism (``pp``), with ``dp`` replicas beside them.

Sources (vllm-project/vllm; SGLang's python/sglang/srt/layers are the same classes):

* weights, model_executor/layers/linear.py: ``QKVParallelLinear`` splits the query heads over the tp ranks and the
  KV heads too while there are at least tp of them; with fewer, each rank keeps ONE KV head (``num_kv_heads = 1``,
  ``num_kv_head_replicas = divide(tp_size, total_num_kv_heads)``); ``ColumnParallelLinear`` / ``MergedColumnParallel
  Linear`` (gate_up) split the output, ``RowParallelLinear`` (o_proj, down_proj) the input; ``ReplicatedLinear``
  (MoE routers, DeepSeek's ``q_a_proj`` / ``kv_a_proj_with_mqa``, V3.2's indexer) is whole on every rank; norms are
  whole. model_executor/layers/vocab_parallel_embedding.py: ``VocabParallelEmbedding`` and ``ParallelLMHead`` pad the
  vocabulary to a multiple of ``DEFAULT_VOCAB_PADDING_SIZE`` = 64 (``pad_vocab_size``) and give each rank
  ``divide(num_embeddings_padded, tp_size)`` rows (SGLang multiplies the padding by tp when 64 is not a multiple of
  it: ``padding_size *= self.tp_size``). model_executor/layers/fused_moe/layer.py: ``FusedMoE`` keeps every expert on
  every rank with ``intermediate_size_per_partition = intermediate_size // tp_size``, or, with
  ``--enable-expert-parallel``, ``num_experts // ep_size`` whole experts on each of ``ep_size = tp × dp`` ranks.
* pipeline stages, distributed/utils.py ``get_pp_indices``: ``num_hidden_layers // pp`` layers each, the remainder
  one more each on the stages before the last (``partitions[-i] += 1`` for i in 2..r+1), or the partition
  ``VLLM_PP_LAYER_PARTITION`` gives; the first stage holds the embedding, the last the final norm and lm_head
  (``PPMissingLayer`` elsewhere; a tied lm_head on the last stage is its own ``ParallelLMHead`` when pp > 1).
* the KV cache: each rank caches its KV heads of its stage's layers; multi-head latent attention (DeepSeek) caches
  one latent per token that every tp rank keeps whole (vLLM's MLA backends: ``num_kv_heads = 1``, not split).
* communication buffers, outside PyTorch's allocator (vLLM counts them as non-torch memory):
  distributed/device_communicators/custom_all_reduce.py ``CustomAllreduce`` (world sizes 2, 4, 6, 8 on one node with
  P2P): ``create_shared_buffer(meta_size() + max_size)`` for the signals and a scratch, ``create_shared_buffer
  (max_size)`` for the registered input, ``max_size = 8192 * 1024``, and ``rank_data = torch.empty(8 MiB)``;
  ``meta_size()`` is ``sizeof(vllm::Signal)`` (csrc/custom_all_reduce.cuh: three uint32 arrays of
  ``kMaxBlocks`` = 36 blocks, [36][8], [36][8] and [36], each aligned to 128 B: 1,152 + 1,152 + 256 = 2,560 B).
  NCCL (pynccl.py ``PyNcclCommunicator`` on the tp group, one on the pp group): per channel one buffer per protocol,
  src/init.cc ``DEFAULT_BUFFSIZE`` (Simple) = 1 << 22, ``DEFAULT_LL_BUFFSIZE`` = NCCL_LL_LINES_PER_THREAD 8 ×
  NCCL_LL_MAX_NTHREADS 512 × NCCL_STEPS 8 × sizeof(ncclLLFifoLine) 16 = 524,288, ``DEFAULT_LL128_BUFFSIZE`` =
  NCCL_LL128_ELEMS_PER_THREAD 120 × NCCL_LL128_MAX_NTHREADS 640 × NCCL_STEPS 8 × 8 = 4,915,200.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cabe import linear_attention, ssm
from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.kv_cache import kv_cache_bytes
from cabe.layers import Linear
from cabe.weights import GGUF_BPW, PLAIN, _check_format, _quantized_layer, shipped_format

VOCAB_PADDING = 64  # vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)  # CustomAllreduce._SUPPORTED_WORLD_SIZES
CUSTOM_AR_MAX_SIZE = 8192 * 1024  # CustomAllreduce.__init__(max_size=8192 * 1024)
CUSTOM_AR_RANK_DATA = 8 * 1024 * 1024  # torch.empty(8 * 1024 * 1024, dtype=torch.uint8): a torch tensor
CUSTOM_AR_SIGNAL = 2560  # sizeof(vllm::Signal), kMaxBlocks = 36
NCCL_SIMPLE = 1 << 22
NCCL_LL = 8 * 512 * 8 * 16
NCCL_LL128 = 120 * 640 * 8 * 8
#: collective channels NCCL opens on NVLink-connected Hopper nodes, as it logs them ("24 coll channels, ... 32 p2p
#: channels": NVIDIA/nccl issue 1781); NCCL sizes it from the topology, so this is the figure of that class of node
NCCL_COLL_CHANNELS = 24
#: p2p channels per peer for the pp group's send / recv ("2 p2p channels per peer": NVIDIA/nccl issue 1189), each
#: with a Simple buffer
NCCL_P2P_CHANNELS_PER_PEER = 2
#: the names of the matrices vLLM builds as ReplicatedLinear (whole on every tp rank)
REPLICATED = ("q_a_proj", "kv_a_proj_with_mqa", "wq_b", "wk", "weights_proj")
MiB = 1 << 20


@dataclass(frozen=True)
class Layout:
    """The parallel layout of one replica: tp × pp GPUs, dp replicas, experts over ``ep`` ranks (1: split by tp)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    partition: tuple[int, ...] = ()  # decoder layers per stage

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp


def pp_partition(layers: int, pp: int, given: Sequence[int] | None = None) -> tuple[int, ...]:
    """Decoder layers per pipeline stage, as vLLM's ``get_pp_indices`` splits them (see the module's docstring)."""
    if given:
        parts = tuple(given)
        if len(parts) != pp or sum(parts) != layers or min(parts) < 1:
            raise InvalidValueError(
                "pp_partition", "pp_partition", value=",".join(map(str, parts)), pp=pp, layers=layers
            )
        return parts
    base, rest = divmod(layers, pp)
    out = [base] * pp
    for i in range(2, rest + 2):
        out[-i] += 1
    return tuple(out)


def layout(spec: ModelSpec, *, tp: int = 1, pp: int = 1, gpus: int | None = None, ep: int = 1, partition: Any = None):
    """The validated layout; an impossible split is a typed error (what vLLM's ``verify_with_parallel_config`` and
    ``divide`` refuse)."""
    for name, v in (("tp", tp), ("pp", pp), ("ep", ep), ("gpus", 1 if gpus is None else gpus)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidValueError("not_integer", name, value=v)
        if not 1 <= v <= 1 << 20:
            raise InvalidValueError("out_of_range", name, value=v, minimum=1, maximum=1 << 20)
    n = tp * pp if gpus is None else gpus
    if n % (tp * pp):
        raise InvalidValueError("gpus_not_divisible", "gpus", value=n, tp=tp, pp=pp)
    dp = n // (tp * pp)
    if tp > 1 and spec.num_heads % tp:
        raise InvalidValueError("tp_not_divisor", "tp", value=tp, heads=spec.num_heads)
    kv = spec.num_kv_heads
    if tp > 1 and spec.latent_attention is None and (kv % tp if kv >= tp else tp % kv):
        raise InvalidValueError("tp_kv_heads", "tp", value=tp, kv_heads=kv)
    if pp > spec.num_layers:
        raise InvalidValueError("out_of_range", "pp", value=pp, minimum=1, maximum=spec.num_layers)
    if ep > 1 and not spec.num_experts:
        raise InvalidValueError("ep_without_experts", "ep", value=ep)
    if ep > 1 and (ep != tp * dp or spec.num_experts % ep):
        raise InvalidValueError("ep_serving", "ep", value=ep, tp=tp, dp=dp, experts=spec.num_experts)
    if partition is not None and partition != "":
        items = partition.split(",") if isinstance(partition, str) else partition
        try:
            if not isinstance(items, (list, tuple)) or any(isinstance(x, (bool, float)) for x in items):
                raise ValueError
            partition = [int(x) for x in items]
        except (TypeError, ValueError):
            raise InvalidValueError(
                "pp_partition", "pp_partition", value=str(partition)[:80], pp=pp, layers=spec.num_layers
            ) from None
    return Layout(tp, pp, dp, ep, pp_partition(spec.num_layers, pp, partition))


def kv_heads_per_rank(spec: ModelSpec, tp: int) -> int:
    """KV heads one rank caches: kv / tp, or one (replicated) when there are fewer KV heads than ranks."""
    return max(1, spec.num_kv_heads // tp)


def padded_vocab(spec: ModelSpec, tp: int) -> int:
    """Rows of the vocab-parallel embedding over all ranks (padded to 64, or 64 × tp when tp does not divide 64)."""
    pad = VOCAB_PADDING if VOCAB_PADDING % tp == 0 else VOCAB_PADDING * tp
    return -(-spec.vocab_size // pad) * pad


def _linear_share(lin: Linear, spec: ModelSpec, lay: Layout) -> float:
    """The share of one matrix a tp rank holds (module docstring)."""
    tp = lay.tp
    if tp == 1 and lay.ep == 1:
        return 1.0
    if lin.role == "router" or lin.name in REPLICATED or lin.slot in ("indexer", "hc", "vector"):
        return 1.0
    if lin.role == "expert" and lay.ep > 1:
        return 1 / lay.ep  # whole experts, num_experts // ep_size of them
    kvh = kv_heads_per_rank(spec, tp) / spec.num_kv_heads
    if lin.name in ("k_proj", "v_proj"):
        return kvh
    q, kv = spec.q_dim, spec.kv_dim
    if lin.slot == "qkv" and lin.out_features == q + 2 * kv and spec.latent_attention is None:  # a fused qkv
        return (q / tp + 2 * kv * kvh) / (q + 2 * kv)
    return 1 / tp


def _format(spec: ModelSpec, fmt: str) -> str:
    f = _check_format(fmt)
    return shipped_format(spec) if f == "auto" else f


def _other_bytes_per_param(f: str) -> float:
    """Bytes of a parameter the format leaves unquantized (embeddings, norms; cabe.weights)."""
    if f in PLAIN:
        return PLAIN[f]
    if f.startswith("gguf-"):
        return GGUF_BPW[f[5:]] / 8
    return 2.0


def _linear_bytes(lin: Linear, f: str, group_size: int) -> float:
    """Stored bytes of one matrix (bias included) in format ``f``, as :func:`cabe.weights.weights_bytes` counts."""
    other = _other_bytes_per_param(f)
    if f in PLAIN or f.startswith("gguf-"):
        return lin.parameter_count * other
    q, qn = _quantized_layer((lin,), f, group_size)
    return q + other * (lin.parameter_count - qn)


def weights_per_rank(spec: ModelSpec, lay: Layout, stage: int, fmt: str = "auto", group_size: int = 128) -> dict:
    """Weight bytes on one GPU of pipeline stage ``stage``: its layers' matrices at their tp share, the rest of the
    layer (norms) whole, the vocab-parallel embedding on the first stage, final norm and lm_head on the last."""
    f = _format(spec, fmt)
    other = _other_bytes_per_param(f)
    layers_on = lay.partition[stage]
    per_layer = 0.0
    whole_layer = 0.0
    linear_params = 0
    for run in spec.runs:
        run_b = sum(_linear_bytes(lin, f, group_size) * _linear_share(lin, spec, lay) for lin in run.linears)
        per_layer += run.count * run_b
        whole_layer += run.count * sum(_linear_bytes(lin, f, group_size) for lin in run.linears)
        linear_params += run.count * sum(lin.parameter_count for lin in run.linears)
    layer_share = layers_on / spec.num_layers  # NOTE: runs of unlike layers taken in proportion
    h = spec.hidden_size
    embed = spec.vocab_size * h
    lm_head = 0 if spec.tie_word_embeddings else spec.vocab_size * h
    rest = spec.parameter_count - linear_params - embed - lm_head  # norms, positions, a vision tower
    vocab_rows = padded_vocab(spec, lay.tp) // lay.tp
    first, last = stage == 0, stage == lay.pp - 1
    embed_b = vocab_rows * h * other if first else 0
    head_b = vocab_rows * h * other if last and (lm_head or lay.pp > 1 or not first) else 0
    return {
        "format": f,
        "layers": layers_on,
        "layer_bytes": round(per_layer * layer_share),
        "layer_bytes_whole": round(whole_layer * layer_share),
        "embedding_bytes": round(embed_b),
        "lm_head_bytes": round(head_b),
        "other_bytes": round(rest * other * (layer_share if lay.pp > 1 else 1.0)),
        "vocab_rows": vocab_rows,
        "total_bytes": round(
            per_layer * layer_share + embed_b + head_b + rest * other * (layer_share if lay.pp > 1 else 1.0)
        ),
    }


def expert_bytes_per_rank(spec: ModelSpec, lay: Layout, stage: int, fmt: str = "auto", group_size: int = 128) -> int:
    """The routed experts' bytes on one GPU of ``stage`` (part of :func:`weights_per_rank`'s layer bytes)."""
    f = _format(spec, fmt)
    per_layer = sum(
        run.count
        * sum(
            _linear_bytes(lin, f, group_size) * _linear_share(lin, spec, lay)
            for lin in run.linears
            if lin.role == "expert"
        )
        for run in spec.runs
    )
    return round(per_layer * lay.partition[stage] / spec.num_layers)


def kv_share(spec: ModelSpec, tp: int) -> float:
    """The share of an attention layer's cache one tp rank keeps: its KV heads, or all of a latent (MLA, DeepSeek-V4's
    compressed single-head cache)."""
    if tp == 1 or spec.latent_attention is not None or spec.compressed_attention is not None:
        return 1.0
    return kv_heads_per_rank(spec, tp) / spec.num_kv_heads


#: components of the single-GPU estimate each GPU of a replica holds whole
WHOLE_ON_EVERY_GPU = ("cuda_workspaces", "buffers")


def kv_per_rank(
    spec: ModelSpec, lay: Layout, stage: int, context: int, batch: int, kv_dtype: str, total: int | None = None
) -> dict:
    """KV cache bytes on one GPU of ``stage``: its layers' share of the cache at its KV heads; a linear-attention or
    Mamba-2 layer's fixed state split with its heads (vLLM's ``MambaMixer2`` and gated-DeltaNet layers shard heads).
    ``total``: the whole model's cache as the single-GPU estimate holds it at its peak (default: ``context`` tokens)."""
    share = lay.partition[stage] / spec.num_layers  # NOTE: unlike layer groups taken in proportion
    total = kv_cache_bytes(spec, context, batch, kv_dtype) if total is None else total
    linear = batch * linear_attention.state_bytes(spec)
    attn = total - linear
    state = batch * ssm.state_bytes_per_sequence(spec, 2)
    return {
        "kv_heads": kv_heads_per_rank(spec, lay.tp) if spec.latent_attention is None else 1,
        "head_share": kv_share(spec, lay.tp),
        "layer_share": share,
        "kv_bytes": round(attn * kv_share(spec, lay.tp) * share + linear * share / lay.tp),
        "ssm_state_bytes": round(state * share / lay.tp),
    }


def activations_per_rank(
    spec: ModelSpec, tokens: int, tp: int, act_bytes: int = 2, engine: str = "vllm", seq: int = 0
) -> int:
    """Working memory of the widest layer on one tp rank over ``tokens`` tokens, the structure of
    :func:`cabe.inference.forward_bytes` with every sharded width divided: the attention's q, k, v, output at the
    rank's heads, the MLP's gate, up and activation at f / tp, beside what stays whole on every rank.

    ``engine="vllm"``: the residual and the normed input (2h) and the all-reduce's output (h:
    ``CustomAllreduce.all_reduce`` and ``PyNcclCommunicator.all_reduce`` return ``torch.empty_like(input)``); vLLM's
    ``RMSNorm`` is one fused kernel (``fused_add_rms_norm``, in place). ``engine="hf"``: transformers' TP forward as
    :mod:`cabe.trace.serve_parallel` runs it (models/llama/modeling_llama.py 5.25): the residual, the normed input,
    the row-parallel output all-reduced and the residual's sum (4h) live through the MLP; ``LlamaRMSNorm.forward``
    upcasts to fp32 and multiplies (two fp32 copies, 4h in 16-bit units) beside three 16-bit h; the rotary cos and sin
    of the ``seq`` positions (one row each, broadcast over the batch)."""
    h = spec.hidden_size
    kvh = kv_heads_per_rank(spec, tp)
    attn = 2 * spec.q_dim // tp + 2 * kvh * spec.head_dim
    if spec.mamba2:
        m = spec.mamba2
        attn = max(attn, (m.in_proj_width + m.conv_dim + 2 * m.d_inner) // tp)
    mlp = 0
    for run in spec.runs:
        f = spec.ffn_size(run)
        k = (spec.experts_per_token or 1) if run.mlp == "moe" else 1
        mlp = max(mlp, 3 * f * k // tp + (h * k if run.mlp == "moe" and spec.num_experts else 0))
    if engine == "hf":
        norm = 3 * h  # + the fp32 upcast and its product (2 × 2h in 16-bit units) over the 4h below: 7h in all
        return tokens * act_bytes * (4 * h + max(attn, mlp, norm)) + 2 * seq * spec.head_dim * act_bytes
    reduce_out = h if tp > 1 else 0
    return tokens * act_bytes * (2 * h + reduce_out + max(attn, mlp))


def comm_buffers(lay: Layout, stage: int) -> dict[str, int]:
    """Communication buffers on one GPU (module docstring): NCCL's on the tp group, vLLM's custom all-reduce when the
    tp group is 2, 4, 6 or 8 GPUs, NCCL's p2p buffers towards each neighbouring pipeline stage."""
    out = {"nccl_tp": 0, "custom_all_reduce": 0, "custom_all_reduce_torch": 0, "nccl_pp": 0}
    if lay.tp > 1:
        out["nccl_tp"] = NCCL_COLL_CHANNELS * (NCCL_SIMPLE + NCCL_LL + NCCL_LL128)
        if lay.tp in CUSTOM_AR_WORLD_SIZES:
            out["custom_all_reduce"] = CUSTOM_AR_SIGNAL + 2 * CUSTOM_AR_MAX_SIZE
            out["custom_all_reduce_torch"] = CUSTOM_AR_RANK_DATA
    if lay.pp > 1:
        neighbours = (stage > 0) + (stage < lay.pp - 1)
        out["nccl_pp"] = neighbours * NCCL_P2P_CHANNELS_PER_PEER * NCCL_SIMPLE
    return out


def per_gpu(
    spec: ModelSpec,
    est: dict[str, Any],
    lay: Layout,
    *,
    weights: str = "auto",
    group_size: int = 128,
    slack: float = 0.05,
) -> dict[str, Any]:
    """Every pipeline stage's GPU under ``lay``, from the single-GPU estimate ``est``
    (:func:`cabe.inference.estimate_inference`): its weights, KV cache, working memory and logits, the allocator's
    reserve over them, and the communication buffers beside them; ``worst`` is the stage that needs the most."""
    context, batch, kv_dtype = est["context"], est["batch"], est["kv_dtype"]
    tokens = batch * est["prefill_chunk"]
    others = [st["bytes"] for st in est["steps"] if st["key"] in ("infer.vision", "infer.indexer")]
    rows = next(st["params"]["rows"] for st in est["steps"] if st["key"].startswith("infer.logits"))
    stages = []
    start = 0
    for s in range(lay.pp):
        w = weights_per_rank(spec, lay, s, weights, group_size)
        kv = kv_per_rank(spec, lay, s, context, batch, kv_dtype, est["components"]["kv_cache"])
        act = (
            est["components"]["activations"]
            if lay.tp == 1
            else max([activations_per_rank(spec, tokens, lay.tp)] + others)
        )
        last = s == lay.pp - 1
        # the last stage's lm_head: each rank's vocab slice of the logits, gathered whole (LogitsProcessor._gather_logits)
        logits = (est["components"]["logits"] + (rows * w["vocab_rows"] * 2 if lay.tp > 1 else 0)) if last else 0
        comps = {"weights": w["total_bytes"], "kv_cache": kv["kv_bytes"], "activations": act, "logits": logits}
        if kv["ssm_state_bytes"]:
            comps["ssm_state"] = kv["ssm_state_bytes"]
        # what every GPU holds whole: the cuBLAS workspace, the causal mask (cabe.generation)
        comps.update({k: v for k, v in est["components"].items() if k in WHOLE_ON_EVERY_GPU})
        comm = comm_buffers(lay, s)
        torch_bytes = sum(comps.values()) + comm["custom_all_reduce_torch"]
        non_torch = comm["nccl_tp"] + comm["custom_all_reduce"] + comm["nccl_pp"]
        stages.append(
            {
                "stage": s,
                "layers": [start, start + lay.partition[s]],
                "components": comps,
                "weights": w,
                "kv": kv,
                "comm": comm,
                "total_bytes": torch_bytes,
                "reserved_bytes": round(torch_bytes * (1 + slack)),
                "non_torch_bytes": non_torch,
            }
        )
        start += lay.partition[s]
    worst = max(stages, key=lambda st: st["reserved_bytes"] + st["non_torch_bytes"])
    return {
        "tp": lay.tp,
        "pp": lay.pp,
        "batch": batch,
        "dp": lay.dp,
        "ep": lay.ep,
        "gpus": lay.gpus,
        "partition": list(lay.partition),
        "kv_heads_per_rank": worst["kv"]["kv_heads"],
        "stages": stages,
        "worst_stage": worst["stage"],
        "per_gpu_bytes": worst["reserved_bytes"] + worst["non_torch_bytes"],
        "steps": steps(spec, lay, worst, est),
    }


def fit(par: dict[str, Any], card: Any, utilization: float = 0.9) -> dict[str, Any]:
    """Each stage's GPU on ``card``: needed = reserved + communication buffers + CUDA context. How many sequences
    the replica's KV pool holds is the serving engine's answer on its fullest GPU (``cabe.engines``, given this
    layout's share), filled in by :func:`cabe.inference.infer_json`."""
    out = []
    for st in par["stages"]:
        need = st["reserved_bytes"] + st["non_torch_bytes"] + card.cuda_context_bytes
        out.append({"stage": st["stage"], "needed_bytes": need, "fits": need <= card.memory_bytes})
    return {
        "gpu": card.name,
        "display": card.display,
        "memory_bytes": card.memory_bytes,
        "utilization": utilization,
        "stages": out,
        "needed_bytes": max(s["needed_bytes"] for s in out),
        "fits": all(s["fits"] for s in out),
    }


def steps(spec: ModelSpec, lay: Layout, st: dict[str, Any], est: dict[str, Any]) -> list[dict[str, Any]]:
    """The worked figures of one stage's GPU, as explanation steps (formula keys in the catalogs)."""
    w, kv, comm = st["weights"], st["kv"], st["comm"]
    out: list[dict[str, Any]] = [
        {
            "key": "infer.tp.layers",
            "formula": "{layers} / {total} layers on stage {stage} of {pp} (get_pp_indices: {partition})",
            "bytes": None,
            "params": {
                "layers": w["layers"],
                "total": spec.num_layers,
                "stage": st["stage"],
                "pp": lay.pp,
                "partition": ",".join(map(str, lay.partition)),
            },
        },
        {
            "key": "infer.tp.weights",
            "formula": "{layer} B (layers at their 1/{tp} share) + {embed} B + {head} B ({rows} vocab rows) + {other} B",
            "bytes": w["total_bytes"],
            "params": {
                "layer": w["layer_bytes"],
                "tp": lay.tp,
                "embed": w["embedding_bytes"],
                "head": w["lm_head_bytes"],
                "rows": w["vocab_rows"],
                "other": w["other_bytes"],
            },
        },
        {
            "key": "infer.tp.kv",
            "formula": "{whole} B × {heads}/{kv} KV heads × {layers}/{total} layers",
            "bytes": kv["kv_bytes"],
            "params": {
                "whole": est["components"]["kv_cache"],
                "heads": kv["kv_heads"],
                "kv": 1 if spec.latent_attention is not None else spec.num_kv_heads,
                "layers": w["layers"],
                "total": spec.num_layers,
            },
        },
        {
            "key": "infer.tp.activations",
            "formula": "{tokens} tokens × 2 B × (3 × {h} + max(attention, MLP) / {tp})",
            "bytes": st["components"]["activations"],
            "params": {"tokens": est["batch"] * est["prefill_chunk"], "h": spec.hidden_size, "tp": lay.tp},
        },
    ]
    if comm["nccl_tp"] or comm["nccl_pp"]:
        out.append(
            {
                "key": "infer.tp.nccl",
                "formula": "{channels} channels × ({simple} + {ll128} + {ll} B) + {p2p} B (pipeline p2p)",
                "bytes": comm["nccl_tp"] + comm["nccl_pp"],
                "params": {
                    "channels": NCCL_COLL_CHANNELS if comm["nccl_tp"] else 0,
                    "simple": NCCL_SIMPLE,
                    "ll128": NCCL_LL128,
                    "ll": NCCL_LL,
                    "p2p": comm["nccl_pp"],
                },
            }
        )
    if comm["custom_all_reduce"]:
        out.append(
            {
                "key": "infer.tp.custom_all_reduce",
                "formula": "2 × {max_size} B + {signal} B (IPC) + {rank_data} B (rank_data)",
                "bytes": comm["custom_all_reduce"] + comm["custom_all_reduce_torch"],
                "params": {
                    "max_size": CUSTOM_AR_MAX_SIZE,
                    "signal": CUSTOM_AR_SIGNAL,
                    "rank_data": CUSTOM_AR_RANK_DATA,
                },
            }
        )
    return out
