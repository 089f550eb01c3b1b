"""DeepSeek-V4's layer (``compressed_attention`` on the spec, hyper-connections): the tensors a training step saves.
(The cache a served sequence keeps: :mod:`cabe.compressed_attention`.)

**Training** (transformers 5.24, models/deepseek_v4/modeling_deepseek_v4.py). Per token of one layer, with a the
compute dtype's bytes, ρ the residual's, n = hc_mult, h, nh heads of d, q = nh·d, r_q the query rank, m =
(2 + n)·n, L = s + T the keys (the s tokens and the T = ⌊s / rate⌋ compressed entries of a CSA / HCA layer):

* each hyper-connection (``DeepseekV4HyperConnection.forward``, ``attn_hc`` and ``ffn_hc``): the streams' fp32
  flattening (``.float()``, 4·n·h: the input itself when ρ = 4) and its rsqrt (4), the normalised fp32 streams
  that ``F.linear`` saves (4·n·h; under autocast its 16-bit cast, 2·n·h), the mixes (4·m, 16-bit under autocast),
  the sigmoids of pre and post (4·n each), the softmax of comb (4·n²), each Sinkhorn division's numerator and
  denominator (``hc_sinkhorn_iters`` · 2 − 1 divisions: 4·n² + 4·n each), ``pre + eps`` (4·n) and the streams
  themselves (ρ·n·h), which ``pre * streams`` and the residual's ``matmul(comb.T, streams)`` save — the layer's
  input for ``attn_hc``; after each block ``post.to(dtype)`` (ρ·n), the block's output (a·h) and comb's cast
  (ρ·n²);
* the fp32-weighted RMSNorms (input, post-attention, q_a_norm, kv_norm, the compressors'): the fp32 input, the
  rsqrt and, when the weight trains, the normalised fp32 tensor; their output, cast to the input's dtype, is what
  the next linears save;
* the query: ``q_b_norm`` (unweighted, per head) saves the fp32 copy (4·q), the rsqrt (4·nh), its cast (a·nh) and
  q_b_proj's output (a·q); rotary saves its cos and sin (1 × s × rope each, per call: a constant per layer);
* eager attention with sinks: the query (a·q), ``repeat_kv``'s copies of the one key = value head for every query
  head (a·nh·L·d each, twice), the max's int64 indices (8·nh), the fp32 softmax with the sink column
  (4·nh·(L + 1)) and its cast for the value matmul (a·nh·L);
* the grouped output: ``o_a_proj``'s bmm saves the regrouped output (a·q), ``o_b_proj`` its input (a·g·r_o);
* a compressor: the fp32 softmax over its window (4·w, w = 2·d for CSA's two series, d for HCA), its cast (a·w)
  and the kv it weighs (a·w), and its kv_norm per entry; CSA's indexer keeps nothing (integer indices out, its
  graph is freed when it returns) but its scores are a forward transient: the compressed keys broadcast to every
  query (``at::matmul`` expands them: 4·d_I·T) beside the fp32 scores (4·H_I·T, twice) and what it saved;
* the MoE block: the router's logits and sqrt-softplus scores (a·E each), the top-k (or ``tid2eid``) indices
  (8·k), the weights' sum and gather (a·(1 + k)); the experts as grouped_mm runs them (the gathered tokens k·a·h,
  gate_up's output 2·k·a·f, both clamps' outputs and silu's, the product: 4·k·a·f, the down output k·a·h, the
  weights k·a, three int64 index vectors 24·k); the shared expert's gate and up outputs, their clamps, silu and
  product (6·a·f).

Proved by tests/trace/test_deepseek_v4_trace.py (fake CUDA), tests/families/test_deepseek_v4.py and
tests/trace/test_bottom_layer.py.
"""

from __future__ import annotations

from cabe.activations import adapters, moe, norms
from cabe.activations.state import LayerState
from cabe.architecture import ModelSpec
from cabe.compressed_attention import entries
from cabe.layers import LayerGroup
from cabe.mixers import CompressedAttention
from cabe.units import round_alloc

#: Sinkhorn iterations of DeepseekV4Config's default (``hc_sinkhorn_iters``)
SINKHORN_ITERS = 20


def add_block(layer: LayerState) -> int:
    """The V4 layer's saved tensors, added to ``layer`` (a ``cabe.activations.state.LayerState``). Returns the MLP block's
    backward workspace per token."""
    spec: ModelSpec = layer.facts.spec
    ca = spec.compressed_attention
    assert ca is not None
    h, rho, bt = layer.facts.h, layer.facts.rho, layer.facts.base_trainable
    # In the lowest layer of LoRA's gradient path (``layer.live`` false: its streams, built from the frozen
    # embeddings' output at modeling_deepseek_v4.py ``hidden_states.unsqueeze(2).expand(...)``, require no grad, and
    # the hyper-connections' fn / base / scale are frozen) autograd records nothing until an adapted projection's
    # output joins (``LayerState.joins``): only the adapters' own inputs are saved before that
    streams_live = layer.live
    _hyper_connection(layer, "attn_hc")
    if (
        rho == 4 and layer.live
    ):  # the fp32 streams' ``.float()`` is the layer's input itself: the checkpoint's saved input
        layer.input_alias = 4 * spec.hyper_connections * h
    norms.rms_norm(layer, "input_norm", h, "h", bt, True)
    _attention(layer, ca)
    _mix_back(layer, "attn", _out(layer), streams_live)
    layer.mlp_from = len(layer.terms)
    layer.block = "mlp"
    streams_live = layer.live
    _hyper_connection(layer, "ffn_hc")
    norms.rms_norm(layer, "post_attention_norm", h, "h", bt, True)
    experts_live = layer.live  # the routed experts read the normalised streams: their backward runs only then
    _moe(layer)
    # routed + shared: the routed experts' output is in their own dtype (grouped_mm runs outside autocast)
    _mix_back(layer, "mlp", max(_out(layer), layer.facts.dt_weight if bt else layer.facts.dt_frozen), streams_live)
    _moments(layer)
    # the block's first backward node, the mix back's (modeling_deepseek_v4.py:1197), with everything the layer saved
    # alive: the incoming gradient of the streams, matmul's gradient of the streams (cast back to their dtype under
    # autocast) and the two products' gradients before their sums (``post`` broadcast over h, the output over the n
    # streams): four tensors of the streams' shape (b, s, n, h). The trace of a tiny V4 (fp16 weights under bf16
    # autocast: fp32 streams, checkpointed) peaks here
    mix_back = 4 * rho * spec.hyper_connections * h
    # under checkpointing the layer is recomputed while its output's gradient, the n streams' (ρ·n·h), waits
    layer.output_grad = rho * spec.hyper_connections * h
    if bt and experts_live:
        # Backward runs the block in reverse: the mix back, the shared expert (built last, run first), then the routed
        # experts (transformers 5.24 integrations/moe.py ``grouped_mm_experts_forward``): the output's mul with the
        # routing weights, down's grouped_mm (its weight gradient), the clamped SwiGLU, gate_up's grouped_mm (the
        # last weight gradient). Each node releases what it saved once it ran (torch/csrc/autograd/engine.cpp), so by
        # the time every expert gradient exists all the block saved after the experts' input is gone; before any
        # exists, the dispatch's own first nodes run beside everything the layer saved (moe.dispatch_workspace)
        layer.experts_freed = sum(t.bytes_per_token for t in layer.terms[layer.experts_from :])
        layer.dispatch_workspace = max(moe.dispatch_workspace(layer, layer.facts.dt_weight), mix_back)
    # the MLP block's backward, beside the gradients of the streams in and out (2·ρ·n·h): the shared expert's (a gated
    # MLP's, 3·f) runs first, then the routed experts' in their dtype: ``weighted_out[inv_perm]``'s and the routing
    # weights' gradients (k·h each), then at ``_apply_gate`` the gradients of silu's and up's outputs, of their clamps
    # and of the chunked gate_up (4·k·f) (transformers 5.24 integrations/moe.py ``grouped_mm_experts_forward``)
    ae = layer.facts.dt_weight if bt else layer.facts.dt_frozen
    k = spec.experts_per_token
    experts = ae * k * max(2 * h, 4 * layer.facts.f) if experts_live else 0
    return max(max(3 * _out(layer) * layer.facts.f, experts) + 2 * rho * spec.hyper_connections * h, mix_back)


def _out(layer: LayerState) -> int:
    """Bytes of a projection's output: the compute dtype's, or under QLoRA the fp32 input's (bitsandbytes' Linear4bit
    casts its output back to its input's dtype: the residual's, fp32 after prepare_model_for_kbit_training)."""
    return layer.facts.rho if layer.facts.quantized else layer.facts.a


def _moments(layer: LayerState) -> None:
    """The layer's forward moments beyond what it has saved by then: the indexer's scoring (CSA) and the attention's
    softmax, each less what the layer saves only after it (``indexer_moment_per_token`` is their larger); its
    attention's backward moment beside what it saved before the softmax (``mixer_backward``)."""
    terms = layer.terms

    def after(i: int) -> int:
        return sum(t.bytes_per_token for t in terms[i:])

    indexer = layer.indexer_transient - after(layer.indexer_from) if layer.indexer_transient else 0
    layer.indexer_transient = max(indexer, layer.softmax_moment - after(layer.softmax_at), 0)
    layer.indexer_from = len(terms)
    attention_after = sum(t.bytes_per_token for t in terms[layer.softmax_at : layer.mlp_from])
    layer.mixer_backward = max(0, layer.softmax_backward - attention_after)


def _hyper_connection(layer: LayerState, name: str) -> None:
    """One ``DeepseekV4HyperConnection`` (see the module docstring)."""
    spec: ModelSpec = layer.facts.spec
    n, h, rho = spec.hyper_connections, layer.facts.h, layer.facts.rho
    iters = int(spec.config.get("hc_sinkhorn_iters", SINKHORN_ITERS))
    m = (2 + n) * n
    trains = layer.facts.base_trainable  # fn, base and scale are the layer's own fp32 parameters
    layer.add(f"{name}.streams", rho * n * h, f"{rho}·n·h")
    if rho != 4:
        layer.add(f"{name}.fp32_streams", 4 * n * h, "4·n·h")
    layer.add(f"{name}.rsqrt", 4, "4")
    mix = 2 if layer.facts.autocast else 4
    if trains:  # F.linear saves its input for fn's gradient (under autocast: its 16-bit cast), and
        # ``mixes * scale`` the mixes for scale's
        layer.add(f"{name}.normalized", mix * n * h, f"{mix}·n·h")
        layer.add(f"{name}.mixes", mix * m, f"{mix}·(2+n)·n")
    layer.add(f"{name}.pre_post_sigmoid", 2 * 4 * n, "8·n")
    layer.add(f"{name}.comb_softmax", 4 * n * n, "4·n²")
    divisions = 2 * iters - 1
    layer.add(f"{name}.sinkhorn", divisions * 4 * (n * n + n), f"{divisions}·4·(n² + n)")
    layer.add(f"{name}.pre", 4 * n, "4·n")


def head_saved(spec: ModelSpec, rho: int, autocast: bool, full: bool) -> int:
    """Per token, what ``hc_head`` (``DeepseekV4HyperHead.forward``) saves, and what the fp32-weighted final norm
    saves beyond a plain RMSNorm's (its normalised tensor is fp32, 4·h, not ρ·h): the streams' fp32 flattening (the
    streams themselves when ρ = 4) and rsqrt, the normalised streams for hc_fn's gradient and the mixes for
    hc_scale's (when they train), the sigmoid, ``pre`` and the streams (ρ·n·h), which ``pre * x`` saves."""
    n, h = spec.hyper_connections, spec.hidden_size
    out = rho * n * h + (4 * n * h if rho != 4 else 0) + 4 + 2 * 4 * n
    if full:
        out += (2 if autocast else 4) * (n * h + n)
        out += (4 - rho) * h  # the final norm's normalised tensor: fp32, not the residual's dtype
    return out


def _mix_back(layer: LayerState, block: str, out_bytes: int, streams_live: bool = True) -> None:
    """``post.to(dtype) * out.unsqueeze(-2) + matmul(comb.to(dtype).T, streams)`` after a block whose output has
    ``out_bytes`` per element: ``mul`` saves both, ``matmul`` comb's cast and the streams — under autocast its own
    16-bit casts of both (the fp32 streams' is a new 2·n·h). When the streams required no grad (``streams_live``
    false: the bottom layer of LoRA's path) and an adapter made the block's output require it, ``mul`` saves only
    ``post`` (for the output's gradient: MulBackward0 keeps an operand only for the other's) and ``matmul`` nothing."""
    n, rho, h = layer.facts.spec.hyper_connections, layer.facts.rho, layer.facts.h
    layer.add(f"{block}.hc_post", rho * n, f"{rho}·n")
    if not streams_live:
        return
    layer.add(f"{block}.hc_output", out_bytes * h, f"{out_bytes}·h")
    comb = 2 if layer.facts.autocast else rho
    layer.add(f"{block}.hc_comb", comb * n * n, f"{comb}·n²")
    if layer.facts.autocast and rho == 4:
        layer.add(f"{block}.hc_streams_cast", 2 * n * h, "2·n·h")


def _attention(layer: LayerState, ca: CompressedAttention) -> None:
    """``DeepseekV4Attention.forward``: the query and key projections, their norms, the compressor, eager attention
    with sinks, the grouped output projection."""
    h, a, rho, bt, nh = layer.facts.h, layer.facts.a, layer.facts.rho, layer.facts.base_trainable, layer.facts.nh
    d, rq, s, b = ca.head_dim, ca.q_lora_rank, layer.facts.s, layer.facts.batch
    q = nh * d
    group: LayerGroup = layer.facts.group
    compressed = ca.rate(group.attention)
    # (the compressor's kv_proj is a second module of that name: under autocast each casts its input)
    readers = ["q_a_proj", "kv_proj"] + (["kv_proj", "gate_proj"] if compressed else [])
    # The bottom layer of LoRA's path (``layer.live`` false on entry) has two paths: the query's, which requires grad
    # from an adapted q_a_proj or q_b_proj on, and the key = value's, from an adapted kv_proj (or the compressor's
    # kv_proj / gate_proj) on. Each op saves only for the inputs that require grad: q @ kᵀ the key for the query's
    # gradient (the query for the key's), probs @ v the value for the probabilities' (the probabilities for v's)
    entry = layer.live
    targets = layer.facts.targets
    q_live = entry or "q_a_proj" in targets or "q_b_proj" in targets
    kv_live = entry or "kv_proj" in targets or (bool(compressed) and "gate_proj" in targets)
    adapters.linear_inputs(layer, "attn", [(n_, h) for n_ in readers], rho * h, f"{rho}·h")
    adapters.lora_mid(layer, readers)
    lo = _out(layer)
    layer.live = entry or "q_a_proj" in targets
    norms.rms_norm(layer, "attn.q_a_norm", rq, "r_q", bt, True, in_bytes=lo)
    adapters.linear_inputs(layer, "attn.q_b_proj", [("q_b_proj", rq)], lo * rq, f"{lo}·r_q")
    adapters.lora_mid(layer, ["q_b_proj"])
    layer.live = q_live
    # q_b_norm: x * rsqrt(x.float().square().mean(-1) + eps).to(x.dtype), per head
    if lo != 4:
        layer.add("attn.q_b_norm.fp32_input", 4 * q, "4·q")
        layer.add("attn.q_b_norm.rsqrt_cast", lo * nh, f"{lo}·nh")
    layer.add("attn.q_b_norm.rsqrt", 4 * nh, "4·nh")
    layer.add("attn.q_b_output", lo * q, f"{lo}·q")
    layer.live = kv_live
    norms.rms_norm(layer, "attn.kv_norm", d, "d", bt, True, in_bytes=lo)
    rope_bytes = layer.facts.dt_weight if bt else layer.facts.dt_frozen  # cos / sin in the embeddings' dtype
    calls = 3  # rotary on q, on kv, and its inverse on the attention output: cos and sin each
    t = entries(ca, group.attention, s)
    if compressed:
        _compressor(layer, ca, group.attention, t)
    layer.live = q_live or kv_live
    if layer.live:  # (saved by rotary's multiplies only when q or kv requires grad)
        layer.constant += calls * 2 * round_alloc(s * ca.rope_dim * rope_bytes)
    length = s + t
    if kv_live:  # q @ kᵀ saves the query for the key's gradient
        layer.add("attn.query", a * q, f"{a}·q")
    # repeat_kv: the one key = value head expanded to every query head (a view: ``expand`` then ``reshape`` merges
    # the size-1 head dim with the stride-0 one), for the key and for the value. ``at::matmul`` folds the batch dims
    # for bmm (aten/src/ATen/native/LinearAlgebra.cpp, ``_matmul_impl``: ``expand(...).reshape(...)``): with one
    # sequence the stride-0 heads become bmm's stride-0 batch, no copy; with b > 1 they cannot merge with the batch
    # stride and reshape copies them (a·b·nh·L·d each), which bmm saves
    if layer.live and b > 1:
        layer.constant += 2 * round_alloc(a * b * nh * length * d)
    layer.add("attn.sink_max_indices", 8 * nh, "8·nh")
    layer.add("attn.softmax_with_sink", 4 * nh * (length + 1), "4·nh·(L+1)")
    layer.softmax_at = len(layer.terms)
    if a != 4 and kv_live:  # probs @ v saves the probabilities' cast for v's gradient
        layer.add("attn.probs", a * nh * length, f"{a}·nh·L")
    # forward, at ``combined_logits - max``: the fp32 scores with the sink column and their shifted copy, beside the
    # masked scores (``attn_weights + attention_mask``: the wider of the scores' and the mask's dtype, the mask being
    # the embeddings' output's), before the softmax exists; then the softmax replaces the first. The trace of tiny
    # V4 layers (fp32 weights under autocast, b = 1 × 4096; QLoRA 4 × 4096) holds these two fp32 tensors and the
    # masked scores beyond what the layer saved up to its softmax, and no probabilities' copy yet
    masked = max(a, rho) * nh * length
    layer.softmax_moment = 4 * nh * (length + 1) + masked
    # the masks alive then, per token: the model's causal mask (b, 1, s, s) in the embeddings' dtype
    # (DeepseekV4Model.forward's create_sliding_window_causal_mask, eager: a 4-D float mask), and in a compressed
    # layer the compressor's block bias (b, 1, s, T [+ 1]) and the mask extended by it (``torch.cat``, (b, 1, s, L))
    layer.softmax_moment += rho * s + ((lo * (t + 1) + rho * length) if compressed else 0)
    layer.softmax_backward = 2 * 4 * nh * (length + 1)
    layer.q = q
    if bt:
        layer.add("attn.o_a_input", a * q, f"{a}·q")
    g_out = ca.o_groups * ca.o_lora_rank
    adapters.linear_inputs(layer, "attn.o_b_proj", [("o_b_proj", g_out)], a * g_out, f"{a}·g·r_o")
    adapters.lora_mid(layer, ["o_b_proj"])


def _compressor(layer: LayerState, ca: CompressedAttention, kind: str, t: int) -> None:
    """A CSA / HCA compressor's saved tensors, and CSA's indexer's forward transient."""
    a, bt, b = _out(layer), layer.facts.base_trainable, layer.facts.batch
    d = ca.head_dim
    w = 2 * d if kind == "compressed_sparse" else d
    layer.add("compressor.softmax", 4 * w, "4·w")
    layer.add("compressor.softmax_cast", a * w, f"{a}·w")
    layer.add("compressor.kv", a * w, f"{a}·w")
    # kv_norm over each entry: fp32 input, rsqrt, normalised (b·T rows)
    rows = b * t
    if layer.live:  # (the bottom layer of LoRA's path: saved once the compressor's kv requires grad)
        layer.constant += round_alloc(4 * rows * d) + round_alloc(4 * rows)
        if bt:
            layer.constant += round_alloc(4 * rows * d)
        rope_bytes = layer.facts.dt_weight if bt else layer.facts.dt_frozen
        layer.constant += 2 * round_alloc(rows * ca.rope_dim * rope_bytes)
    if kind == "compressed_sparse":
        _indexer_transient(layer, ca, t)


def _indexer_transient(layer: LayerState, ca: CompressedAttention, t: int) -> None:
    """``DeepseekV4Indexer``: its compressor (as the attention's, at index_head_dim), then the scorer's
    ``matmul(q.float(), kv.transpose(-1, -2).float().unsqueeze(1))``, which broadcasts the compressed keys to every
    query (``at::matmul``'s ``expand(...).reshape(...)``: b·s copies of (d_I, T), fp32), relu's output and the scaled
    scores (fp32, H_I·T each), the weighted product before the sum. Everything it saved lives until it returns its
    indices (the graph is freed then), so its peak holds all of it."""
    a, s = layer.facts.a, layer.facts.s
    di, hi = ca.index_head_dim, ca.index_heads
    own = 4 * 2 * di + 2 * a * 2 * di + (8 * di + 4) // ca.csa_rate  # its compressor's softmax, cast, kv, norm
    q = 4 * hi * di + (a * hi * di if a != 4 else 0)  # q.float() for the matmul (and q itself)
    scores = 4 * hi * t
    broadcast = 4 * di * t if layer.facts.batch > 1 or s > 1 else 0
    topk = 8 * min(ca.index_topk, t)
    layer.indexer_transient = own + q + broadcast + 3 * scores + topk
    layer.indexer_from = len(layer.terms)


def _moe(layer: LayerState) -> None:
    """``DeepseekV4SparseMoeBlock``: the router (hash or top-k, sqrt-softplus scores), the routed experts as
    transformers 5's grouped_mm runs them (in the experts' own dtype: see ``cabe.activations.moe._moe``), the shared
    expert with its clamps (see the module docstring)."""
    spec: ModelSpec = layer.facts.spec
    h, f, rho, a, bt = layer.facts.h, layer.facts.f, layer.facts.rho, _out(layer), layer.facts.base_trainable
    e, k = spec.num_experts, spec.experts_per_token
    wb = layer.facts.dt_weight if bt else layer.facts.dt_frozen
    # the router's scores: F.linear(x, weight) in the weight's dtype, or autocast's 16 bits which softplus (on
    # autocast's fp32 list) casts to fp32
    ar = 4 if layer.facts.autocast else wb
    shared_up = layer.facts.group.slot_names("shared_up")
    adapters.linear_inputs(layer, "mlp", [(n_, h) for n_ in shared_up], rho * h, f"{rho}·h")
    adapters.lora_mid(layer, shared_up)
    if bt and (layer.facts.amp or not shared_up):  # the router's own cast of its input (or the input, no shared expert)
        layer.add("moe.router_input", (2 if layer.facts.amp else rho) * h, "2·h")
    layer.add("moe.router_scores", 2 * ar * e, f"2·{ar}·E")  # softplus's input, sqrt's output
    layer.add("moe.routing", 8 * k + ar * (1 + k), f"8·k + {ar}·(1 + k)")
    ae = wb  # grouped_mm runs in the experts' dtype
    layer.add("moe.dispatch_indices", 3 * 8 * k, "24·k")
    if bt:
        layer.add("moe.expert_input", k * ae * h, f"k·{ae}·h")
    layer.experts_from = len(layer.terms)
    layer.add("moe.gate_up_output", 2 * k * ae * f, f"2·k·{ae}·f")
    layer.add("moe.clamped_silu", 3 * k * ae * f, f"3·k·{ae}·f")
    if bt:
        layer.add("moe.product", k * ae * f, f"k·{ae}·f")
    layer.add("moe.routing_weights", k * ar, f"k·{ar}")
    layer.add("moe.expert_output", k * ae * h, f"k·{ae}·h")
    if layer.live:
        layer.constant += round_alloc(4 * e)  # the int32 offsets (cumsum of the histogram)
    if not shared_up:
        return
    layer.add("mlp.shared_gate_up", 2 * a * f, f"2·{a}·f")
    layer.add("mlp.shared_clamped_silu", 3 * a * f, f"3·{a}·f")
    down = layer.facts.group.slot_names("shared_down")
    adapters.linear_inputs(layer, "mlp.down", [(n_, f) for n_ in down], a * f, f"{a}·f")
    adapters.lora_mid(layer, down)
