"""Mixture-of-experts blocks: routers (softmax top-k, DeepSeek's sigmoid groups, Granite's fp32 top-k, gpt-oss's),
routed experts as transformers 5 dispatches them (``grouped_mm``, or Llama 4's dense ``bmm`` over every expert),
shared experts, PEFT's LoRA on bare expert parameters (``ParamWrapper``), and the experts' backward moments.

Sources: transformers 5.24 integrations/moe.py ``grouped_mm_experts_forward``, models/llama4, models/deepseek_v3,
models/gpt_oss, models/qwen2_moe / qwen3_next; peft 0.21.2 tuners/lora/layer.py ``ParamWrapper``. Proved by
tests/trace/test_moe_dispatch_and_eager.py, test_moe_lora_wrapped.py, test_deepseek_trace.py, test_llama4_trace.py
(fake CUDA) and tests/core_torch/test_saved_tensors.py."""

from __future__ import annotations

from cabe.activations import adapters
from cabe.activations.state import LayerState
from cabe.architecture import ModelSpec
from cabe.units import round_alloc


def add_block(layer: LayerState) -> None:
    """An MoE block after its norm: gpt-oss's clamped SwiGLU experts, Llama 4's dense dispatch (neither follows
    ``live``: counted whole), or routed experts as grouped_mm runs them, with their router, LoRA-wrapped stacks and
    shared expert."""
    spec, f, a, rho = layer.facts.spec, layer.facts.f, layer.facts.a, layer.facts.rho
    base_trainable = layer.facts.base_trainable
    if spec.expert_gate == "swiglu_clamp" or spec.expert_dispatch == "dense":
        layer.live = True  # NOTE: gpt-oss's and Llama 4's MoE blocks do not follow ``live``: counted whole
    if spec.expert_gate == "swiglu_clamp":
        a_experts = layer.facts.dt_weight if base_trainable else layer.facts.dt_frozen
        router_in = 2 if layer.facts.autocast else rho  # under autocast F.linear saves its 16-bit cast of the input
        layer.constant += _moe_clamped_swiglu(layer.add, spec, f, a_experts, a, router_in, base_trainable)
    elif spec.expert_dispatch == "dense":
        _dense_experts(layer)
    else:
        # (a LoRA-wrapped router: a bare weight's ParamWrapper, or transformers 4's nn.Linear ``gate``)
        router_grad = base_trainable or any(lin.slot == "router" for lin, _ in layer.facts.wrapped.values())
        router_grad = router_grad or any(
            lin.slot == "router" and lin.name in layer.facts.targets for lin in layer.facts.group.linears
        )
        up_grad, down_grad = _stack_grads(layer)
        if spec.router == "sigmoid_groups":
            _sigmoid_group_router(layer, router_grad)
        # transformers' grouped_mm experts run in the experts' own dtype (see _moe)
        a_experts = layer.facts.dt_weight if base_trainable else layer.facts.dt_frozen
        # the router's input kept as it is: a trained base's (shared experts' linears save it too), or a
        # wrapped router's, unless DeepSeek's router saved its own fp32 cast instead (_sigmoid_group_router)
        keeps_x = base_trainable or (router_grad and not (spec.router == "sigmoid_groups" and rho != 4))
        # under autocast the router's F.linear saves its own 16-bit cast of x (autocast's lower-precision list)
        router_in = (2 if layer.facts.autocast else rho) if keeps_x else 0
        # the block's input requires grad (see ``live``), or a LoRA-wrapped router makes the routing weights do
        entry = layer.live = layer.live or router_grad
        _moe(layer.add_owned, spec, f, a_experts, router_in, down_grad, rho, up_grad, live=entry)
        if entry or up_grad or down_grad:  # (no expert backward runs in the bottom layer without them)
            layer.dispatch_workspace = dispatch_workspace(layer, a_experts)
        _wrapped_parameters(layer, a_experts, entry)
        layer.live = entry or up_grad or down_grad
        if layer.facts.group.slot_names("shared_up"):
            _shared_expert(layer)


def _stack_grads(layer: LayerState) -> tuple[bool, bool]:
    """Whether the first expert stack (gate_up, reading the gathered tokens) and the second (down, reading the
    gated product) get a gradient: trained, or LoRA-wrapped (``ParamWrapper``) one by one. Their grouped_mm keeps
    its input only then (see :func:`_moe`)."""
    if layer.facts.base_trainable:
        return True, True
    # transformers 5's two 3-D stacks (gate_up, down), or transformers 4's per-expert nn.Linear modules (gate and
    # up, or w1 and w3, then down: cabe.transformers_line.as_line), LoRA-adapted as modules: the last one is down
    stacks = [lin.name for lin in layer.facts.group.linears if lin.slot == "experts"]
    adapted = set(layer.facts.wrapped) | layer.facts.targets
    return any(n in adapted for n in stacks[:-1]), len(stacks) > 1 and stacks[-1] in adapted


def _wrapped_parameters(layer: LayerState, a_experts: int, live: bool = True) -> None:
    """PEFT's LoRA on bare parameters (``ParamWrapper``, peft/tuners/lora/layer.py 0.21.2). While the wrapped
    module runs, ``nn.utils.parametrize`` swaps the parameter for W' = W + s·ΔW: for an expert stack with one
    adapter ``_LoraFactorsProxy`` makes it with one ``baddbmm(W, lhs, rhs)`` (the factors cast to W's dtype),
    for a 2-D router ``_LoraParameterProxy`` adds the materialised delta. W' is a new tensor of the whole
    stack, and it requires grad: ``grouped_mm`` saves it (and, see :func:`_moe`, its input) for backward,
    where the gradient of W' — the stack's size again — exists before ``baddbmm``'s backward reduces it to
    the factors' gradients. Traced on a tiny DeepSeek-V3 (tests/trace/test_deepseek_trace.py)."""
    # in backward the stacks come in reverse order: down_proj's W' gradient first, while every W' is saved;
    # then gate_up's, once down_proj's grouped_mm has run and released its W' and down_proj's factors have
    # their gradients (autograd frees a node's saved tensors after it ran, torch/csrc/autograd/engine.cpp). The
    # layer's MLP moment counts every factor's gradient already (grads_mlp): the W' moments come before them.
    # ``live``: the experts' input requires grad; in the bottom layer of LoRA's path (``live`` false) grouped_mm
    # saves a stack's W' (for its input's gradient) only once an earlier wrapped stack made that input require it
    stacks = [(lin, m) for lin, m in layer.facts.wrapped.values() if lin.slot == "experts"]
    factors = [round_alloc(layer.facts.ad * layer.facts.wrapped_sizes[lin.name]) for lin, _ in stacks]
    released = made = 0
    for (lin, _), grads in zip(reversed(stacks), reversed(factors), strict=True):
        w = round_alloc(a_experts * lin.in_features * lin.out_features * lin.copies)
        layer.backward_constant = max(layer.backward_constant, w - released + made - sum(factors))
        released, made = released + w, made + grads
    x_live = live
    for lin, mult in layer.facts.wrapped.values():
        n = lin.in_features * lin.out_features * lin.copies
        if lin.slot == "experts":
            if x_live:
                layer.constant += round_alloc(a_experts * n)  # W', saved by grouped_mm
            x_live = True  # its output requires grad: the next stack's input does
            if layer.facts.ad != a_experts:  # lhs / rhs cast to W's dtype, saved by baddbmm
                r = layer.facts.r * mult * lin.copies
                layer.constant += round_alloc(a_experts * r * lin.in_features)
                layer.constant += round_alloc(a_experts * r * lin.out_features)
        else:  # the router's W' (fp32: F.linear(x.float(), weight.float())) and its delta
            layer.constant += 2 * round_alloc(4 * n)


def _sigmoid_group_router(layer: LayerState, router_grad: bool) -> None:
    """DeepSeek-V3's router (transformers 5.24 ``DeepseekV3TopkRouter.forward``), beyond what :func:`_moe`
    counts for every router: ``F.linear(x.float(), weight.float())`` (the weight is kept fp32,
    ``_keep_in_fp32_modules_strict``) saves an fp32 cast of a 16-bit input for the weight's gradient
    (under autocast, the linear's own 16-bit cast); the ``topk(2)`` of each group saves its indices (int64),
    and so do the group ``topk`` and the expert ``topk``; ``masked_fill`` saves the boolean mask; the
    renormalisation saves the sum and the weights (fp32). Checked against saved-tensor hooks
    (tests/core_torch/test_saved_tensors.py)."""
    h, e, k, rho = layer.facts.h, layer.facts.spec.num_experts, layer.facts.spec.experts_per_token, layer.facts.rho
    groups, kept = layer.facts.spec.expert_groups
    if router_grad and rho != 4:
        cast = 2 if layer.facts.autocast else 4
        layer.add("moe.router_input_cast", cast * h, f"{cast}·h")
    per = 16 * groups + 8 * kept + e + 8 * k + 4 + 4 * k
    layer.add("moe.group_routing", per, "16·G + 8·G_k + E + 12·k + 4")


def dense_experts_backward(layer: LayerState) -> int:
    """The MoE block's backward workspace per token under dense dispatch: the routed experts' own
    (:func:`_dense_experts`), or the shared expert's (a gated MLP's, see :func:`rms_norm_block`), which runs
    first (its nodes were made after the experts', autograd runs the later ones first) while the copied
    gradient of the routed output (E·h) waits."""
    shared = 3 * layer.facts.a * layer.facts.f + 2 * layer.facts.rho * layer.facts.h
    return max(layer.dense_experts_backward, layer.copy_before_shared + shared)


def _dense_experts(layer: LayerState) -> None:
    """Llama 4's MoE (``expert_dispatch == "dense"``; transformers 5.24 models/llama4/modeling_llama4.py,
    ``Llama4Router.forward``, ``Llama4TextMoe.forward``, ``Llama4TextExperts.forward``), per token:

    * the router (an ``nn.Linear``) and the shared expert's gate_proj and up_proj read the normed input x
      (saved once, or each its own 16-bit cast under autocast, when their weights train);
    * ``topk`` saves its int64 indices (8·k); ``sigmoid(scores.float())`` saves its fp32 output (4·E);
    * ``x.repeat(E, 1) * scores.transpose(0, 1).reshape(-1, 1)``: the multiply saves the repeated input (E·ρ·h)
      and the transposed scores' copy (E·a_r), both needed since the scores and x require grad;
    * ``bmm`` with ``gate_up_proj`` saves its input, the product (E·ρ·h, or autocast's 16-bit cast), when the
      experts train; ``gate_up`` (E·2f, kept whole by the activation's and the product's views of its halves),
      the activation's output (E·f) and, when ``down_proj`` trains, the product (E·f); ``bmm`` runs under
      autocast (it is on its lower-precision list), unlike transformers' grouped_mm;
    * the shared expert: a SwiGLU MLP of width f over the T tokens, no gate (:func:`_shared_expert`).

    Every token goes through every expert: E× what the k picked experts would save."""
    spec, h, f, rho = layer.facts.spec, layer.facts.h, layer.facts.f, layer.facts.rho
    e, k, bt = spec.num_experts, spec.experts_per_token, layer.facts.base_trainable
    g = layer.facts.group
    readers = g.slot_names("router") + g.slot_names("shared_up")
    adapters.linear_inputs(layer, "moe", [(n, h) for n in readers], rho * h, f"{rho}·h")
    adapters.lora_mid(layer, g.slot_names("shared_up"))
    ae = (
        layer.facts.a if layer.facts.autocast else (layer.facts.dt_weight if bt else layer.facts.dt_frozen)
    )  # the experts' bmm dtype
    layer.add("moe.topk_indices", 8 * k, "8·k")
    layer.add("moe.sigmoid_fp32", 4 * e, "4·E")
    layer.add("moe.scores_column", ae * e, f"{ae}·E")
    layer.add("moe.repeated_input", e * rho * h, f"E·{rho}·h")
    if bt:
        xe = 2 if layer.facts.autocast else rho
        layer.add("moe.expert_input", e * xe * h, f"E·{xe}·h")
    layer.add("moe.gate_up_output", e * 2 * ae * f, f"E·2·{ae}·f")
    layer.add("moe.act_output", e * ae * f, f"E·{ae}·f")
    if bt:
        layer.add("moe.product", e * ae * f, f"E·{ae}·f")
    _shared_expert(layer, inputs=False)
    # the routed experts' backward: sum(0)'s gradient is an expanded view, which the reshape back to (E·T, h)
    # copies (E·h); with it alive, bmm's backward makes the product's gradient (E·f), then MulBackward0 the
    # gradients of up and of the activation (2·E·f) beside it, once the saved product (when down_proj trains)
    # is released; later steps (SiluBackward0, the cat of the halves' gradients) release gate_up and the
    # activation's output as they make theirs. Per token: max(E·h + E·f, 3·E·f - the saved product)
    eh, ef = e * ae * h, e * ae * f
    layer.dense_experts_backward = max(eh + ef, 3 * ef - (ef if bt else 0))
    layer.copy_before_shared = eh


def _shared_expert(layer: LayerState, inputs: bool = True) -> None:
    """A shared expert beside the routed ones (Qwen2-MoE, transformers 5 Qwen2MoeSparseMoeBlock.forward):
    a SwiGLU MLP over every token, times sigmoid(shared_expert_gate(x)); the product saves the MLP's
    output and the sigmoid's (one value per token). DeepSeek-V3's (``DeepseekV3MoE.forward``) and Llama 4's
    have no gate. ``inputs``: whether to count what its input projections save (False: counted already)."""
    g, h, a, quantized = layer.facts.group, layer.facts.h, layer.facts.a, layer.facts.quantized
    up, down = g.slot_names("shared_up"), g.slot_names("shared_down")[0]
    gate = g.slot_names("shared_gate")
    # the width of one of gate and up: two linears of fs (gate_proj, up_proj), or one fused 2·fs (Granite's
    # shared_mlp.input_linear, chunked in two)
    fs = sum(lin.out_features for lin in g.linears if lin.slot == "shared_up") // 2
    if inputs:
        # a trained base saves x once, as the router's input; under autocast each linear saves its own 16-bit
        # cast of x (traced: Qwen3-Next's gate_proj, up_proj and shared_expert_gate, 3 × 2·h per token)
        if not layer.facts.base_trainable or layer.facts.amp or (layer.facts.quantized and layer.facts.autocast):
            adapters.linear_inputs(
                layer, "shared", [(n, h) for n in up + gate], layer.facts.rho * h, f"{layer.facts.rho}·h"
            )
        adapters.lora_mid(layer, up + gate)
    m = 4 if quantized else a  # Linear4bit returns its output in the input's dtype (fp32 here)
    layer.add("shared.gate_output", m * fs, f"{m}·{fs}")
    layer.add("shared.act_output", m * fs, f"{m}·{fs}")
    layer.add("shared.up_output", m * fs, f"{m}·{fs}")
    if layer.facts.base_trainable or (down in layer.facts.targets and not layer.facts.adapter_cast):
        layer.add("shared.product", a * fs, f"{a}·{fs}")
    if layer.facts.adapter_cast and down in layer.facts.targets:
        adapters.lora_input_copy(layer, "shared", down, fs, str(fs))
    adapters.lora_mid(layer, [down])
    if gate:  # (DeepSeek-V3's shared experts have no gate: their output is added as it is)
        layer.add("shared.output", m * h, f"{m}·h")  # saved by the multiply with the sigmoid gate
        layer.add("shared.gate_sigmoid", m, f"{m}")  # sigmoid's output, saved by sigmoid and the multiply
        if layer.dispatch_workspace:
            # the gate's branch runs backward before the routed experts (Qwen3NextSparseMoeBlock.forward, 5.24
            # models/qwen3_next/modeling_qwen3_next.py:864, builds it last): MulBackward0 makes the shared
            # output's gradient (m·h, which waits for the shared MLP's backward) and releases the shared output
            # it saved (m·h); shared_expert_gate's backward releases what it saved of its input (autocast's
            # 16-bit cast, PEFT's fp32 one for lora_A, lora_A's output) and leaves the input's gradient (ρ·h, cast
            # back to the residual's dtype) waiting to be summed
            own = (f"shared.{gate[0]}.", f"lora.{gate[0]}.")
            released = sum(t.bytes_per_token for t in layer.terms if t.name.startswith(own))
            layer.dispatch_workspace += layer.facts.rho * h - released


def _moe(
    add,
    spec: ModelSpec,
    f: int,
    a: int,
    router_in: int,
    experts_grad: bool,
    rho: int = 0,
    up_grad: bool | None = None,
    live: bool = True,
) -> None:
    """Routed experts as transformers 5 runs them by default (``grouped_mm``, integrations/moe.py 5.24:
    ``grouped_mm_experts_forward``). ``a`` is the experts' weight dtype, not autocast's: ``_grouped_mm`` casts
    the gathered tokens to ``weight.dtype`` and calls ``torch.nn.functional.grouped_mm``, which is not
    autocast-enabled (its comment cites pytorch#174763) — fp32 experts (fp32 weights under autocast, QLoRA's
    unquantized 3-D experts after prepare_model_for_kbit_training) compute and save in fp32.

    ``experts_grad``: the second stack (down_proj) gets a gradient, so its grouped_mm saves its input (the gated
    product); ``up_grad`` (default: the same): the first (gate_up_proj) does, so its grouped_mm saves the gathered
    tokens. ``GroupedMmBackward0`` keeps the input only for the weight's gradient (torchgen/packaged/autograd/
    derivatives.yaml:1223, torch 2.13: only ``mat2``'s formula reads ``self``, saved when ``mat2`` requires grad): a
    LoRA ``ParamWrapper`` on down_proj alone saves no gathered tokens (traced: tiny Qwen3-Next, LoRA on down_proj and
    out_proj, +4.1% with them, +0.1% without).

    ``live``: the block's input requires grad. Without it (the bottom layer of LoRA's path, ``LayerState.live``) the
    router's softmax and top-k save nothing, a wrapped gate_up makes everything after it require grad, and the
    routing ``mul`` keeps no expert output (the routing weights need no gradient); a wrapped down_proj alone keeps
    only its input (traced: Qwen3-30B-A3B, 4 layers, LoRA on down_proj without checkpointing: +4.8% before)."""
    up_grad = experts_grad if up_grad is None else up_grad
    h, e, k = spec.hidden_size, spec.num_experts, spec.experts_per_token
    if router_in:  # the router's weight gets a gradient (trained, or LoRA-wrapped): its input is kept
        add("moe.router_input", router_in * h, f"{router_in}·h")
    if spec.router == "topk_softmax_fp32" and live:
        # Granite's GraniteMoeHybridTopKRouter (transformers 5.24): top-k of the fp32 logits (int64 indices), a
        # softmax over the k in fp32 (saved), its cast to the input's dtype (the routing weights); grouped_mm's
        # dispatch saves the pairs' token index (``// k``), the sort permutation and its inverse (int64 each)
        add("moe.routing", 8 * k * 4 + 4 * k, "36·k")
        add("moe.routing_weights", rho * k, f"{rho}·k")  # gathered per pair, in the input's dtype (ρ)
    elif live:
        add("moe.router_softmax", 4 * e, "4·E")
        add("moe.routing", 8 * k * 3 + 4 * k, "28·k")
    if up_grad:  # the same for the experts' weights
        add("moe.expert_input", k * a * h, f"k·{a}·h")  # gathered tokens, kept for the expert weight grads
    if live or up_grad:
        add("moe.gate_up_output", k * 2 * a * f, f"k·2·{a}·f")
        add("moe.act_output", k * a * f, f"k·{a}·f")
    if experts_grad:
        add("moe.product", k * a * f, f"k·{a}·f")
    if live:
        add("moe.expert_output", k * a * h, f"k·{a}·h")


def _moe_clamped_swiglu(
    add, spec: ModelSpec, f: int, a: int, a_router: int, router_in: int, base_trainable: bool
) -> int:
    """gpt-oss's experts (``expert_gate == "swiglu_clamp"``, ``router == "topk_softmax"``) as transformers 5.24
    runs them by default (integrations/moe.py, ``grouped_mm_experts_forward`` with biases; models/gpt_oss/
    modeling_gpt_oss.py, ``GptOssTopKRouter.forward`` and ``GptOssExperts._apply_gate``). ``a`` is the experts'
    dtype (grouped_mm runs outside autocast, see :func:`_moe`), ``a_router`` the router's output dtype,
    ``router_in`` the bytes of the router's saved input (the residual's, or autocast's 16-bit cast).

    Router: ``F.linear`` with a bias saves its input when the weight trains; ``topk`` of the logits saves its
    int64 indices (8·k) and the softmax over the k values saves its output (a_router·k). Dispatch: ``sort``'s
    permutation (the routing weights' gather index), ``perm // k`` (the tokens' gather index), the sorted expert
    ids (the biases' gather index, saved only when the biases train) and the inverse permutation, int64 each
    (4·8·k or 3·8·k); the routing weights gathered per pair (a_router·k); the int32
    offsets over the experts (one small tensor per layer: returned as a per-layer constant).
    Experts per pair: the gathered tokens (for the weight gradient), the interleaved gate_up output (2f, kept by
    the clamps of its strided halves), the clamped gate, ``sigmoid(alpha·gate)``, their product, ``up + 1``
    (f each), the gated product (saved by down_proj's grouped_mm when it trains) and down_proj's output (h,
    saved by the multiplication with the routing weights)."""
    h, k = spec.hidden_size, spec.experts_per_token
    if base_trainable:
        add("moe.router_input", router_in * h, f"{router_in}·h")
    add("moe.topk_indices", 8 * k, "8·k")
    add("moe.topk_softmax", a_router * k, f"{a_router}·k")
    n_idx = 4 if base_trainable else 3  # the biases' gather saves its index only when the biases train
    add("moe.dispatch_indices", n_idx * 8 * k, f"{n_idx * 8}·k")
    add("moe.routing_weights", a_router * k, f"{a_router}·k")
    if base_trainable:
        add("moe.expert_input", k * a * h, f"k·{a}·h")
    add("moe.gate_up_output", k * 2 * a * f, f"k·2·{a}·f")
    add("moe.clamped_gate_sigmoid_glu_up", k * 4 * a * f, f"k·4·{a}·f")
    if base_trainable:
        add("moe.product", k * a * f, f"k·{a}·f")
    add("moe.expert_output", k * a * h, f"k·{a}·h")
    return round_alloc(4 * spec.num_experts)  # the int32 offsets (torch.cumsum of the histogram)


def dispatch_workspace(layer: LayerState, a_experts: int) -> int:
    """The routed experts' backward at its largest, before any MLP gradient exists, per token (transformers 5.24
    integrations/moe.py:524-536, ``grouped_mm_experts_forward``): ``weighted_out[inv_perm]`` then
    ``.view(T, k, h).sum(dim=1)``. Backward, ``SumBackward1`` expands the gradient (a view) and ``ViewBackward0``
    reshapes the expanded tensor, a copy (k·a_e·h); ``IndexBackward0`` is ``index_backward(grad.new_zeros(...),
    indices, grad)`` (tools/autograd/derivatives.yaml, torch 2.13): zeros and the out-of-place ``index_put`` beside
    them (k·a_e·h each) — three tensors of every token-expert pair in the experts' dtype, with the layer's incoming
    gradient (ρ·h) and every tensor the layer saved still alive (``MulBackward0`` with the routing weights that
    follows holds three as well, once the copy and the zeros are freed). A cast back to the residual's dtype
    (``final_hidden_states.to(hidden_states.dtype)``) adds the gradient in the experts' dtype. A tiny Qwen3-Next
    checkpointed, bf16, batch 8 × 512: the trace's peak is this moment (−6.2% without it)."""
    spec, h, rho = layer.facts.spec, layer.facts.h, layer.facts.rho
    k = spec.experts_per_token
    return rho * h + 3 * k * a_experts * h + (a_experts * h if a_experts != rho else 0)
