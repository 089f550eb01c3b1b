"""Adapters: what LoRA, DoRA and LoRA dropout save and hold in one layer (PEFT 0.21, tuners/lora/layer.py
``Linear.forward``, tuners/lora/dora.py ``DoraLinearLayer.forward``, tuners/lora/bnb.py for 4-bit bases).

* :func:`linear_inputs` — what the linears reading one tensor save of it: the base's input when its weight trains,
  autocast's 16-bit casts, lora_A's fp32 copy (PEFT's ``_cast_input_dtype``), the dropped copy; and the bottom-layer
  rule's exception: an adapted module's own saved inputs are kept even where nothing else is (``adapter_owned``).
* :func:`lora_mid` — lora_A's output (saved by lora_B), then :func:`lora_variants`: dropout's mask, DoRA's two
  products, its norm's transient and its output arithmetic, the throwaway ``Parameter(W.T)`` on Conv1D layers.
* :func:`note_lora_input` — the forward transient of one adapted module (its input copies and output sums).

Proved by tests/trace/test_adapters.py, test_lora_saved.py, test_dora_conv1d.py, test_dora_halves.py,
test_kbit_prep_trace.py (the fake-CUDA trace) and tests/core_torch/test_saved_tensors.py (saved-tensor hooks)."""

from __future__ import annotations

from cabe import fp8
from cabe.activations import state
from cabe.activations.state import LayerState
from cabe.architecture import ModelSpec
from cabe.layers import Linear
from cabe.units import round_alloc

#: the groups of linears that read a block's input (the norm's output, or the residual): not the inner ones
#: (``mlp.down``, ``attn.q_b_proj``...), which read what the block made of it
BLOCK_INPUTS = ("attn", "mlp", "moe", "ssm")


def linear_inputs(
    layer: LayerState, group: str, names: list[tuple[str, int]], shared_bytes: int, shared_formula: str
) -> None:
    """Inputs saved by the linear layers ``names`` (name, in_features) that read one tensor."""
    before = layer.saved
    with layer.adapter_owned():
        _linear_inputs(layer, group, names, shared_bytes, shared_formula)
    if group in BLOCK_INPUTS:  # (LayerActivations.gathered_input_per_token)
        layer.gathered += layer.saved - before
        if group != "attn":
            layer.gathered_mlp += layer.saved - before


def te_saves_fp8(layer: LayerState, name: str) -> bool:
    """Transformer Engine's te.Linear ``name`` of a trained layer keeps its input as column-wise fp8 for backward,
    not the 16-bit input (cabe.fp8.te_input_bytes; modelled from source)."""
    if not (fp8.is_te(layer.facts.setup.fp8) and layer.facts.base_trainable):
        return False
    return any(lin.name == name and fp8.converted(layer.facts.spec, lin) for lin in layer.facts.group.linears)


def _te_inputs(layer: LayerState, group: str, names: list[tuple[str, int]], shared_bytes: int, formula: str) -> bool:
    """te.Linear's saved inputs (one fp8 copy per linear, 1 byte per element); the shared 16-bit input stays saved
    only for the linears that are not swapped. False when the recipe is not Transformer Engine's."""
    if not fp8.is_te(layer.facts.setup.fp8) or not layer.facts.base_trainable:
        return False
    spec, recipe = layer.facts.spec, layer.facts.setup.fp8
    for n, inf in names:
        if te_saves_fp8(layer, n):
            layer.add(f"{group}.{n}.input_fp8", fp8.te_input_bytes(recipe, inf), f"1·{state.sym(inf, spec)}")
    if any(not te_saves_fp8(layer, n) for n, _ in names):
        layer.add(f"{group}.input", shared_bytes, formula)
    return True


def _linear_inputs(
    layer: LayerState, group: str, names: list[tuple[str, int]], shared_bytes: int, shared_formula: str
) -> None:
    spec, targets, adapter_cast = layer.facts.spec, layer.facts.targets, layer.facts.adapter_cast
    if layer.facts.setup.fp8 != "none" and _te_inputs(layer, group, names, shared_bytes, shared_formula):
        return  # (the test first: no fp8 is the common case, on the estimate's hot path)
    four_bit = layer.facts.four_bit
    for n, inf in names:
        note_lora_input(layer, n, inf, shared_bytes // inf if inf else 0)
    trained = layer.facts.base_trainable and bool(names)  # the base layers' own inputs are saved
    if layer.facts.amp or (layer.facts.quantized and layer.facts.autocast):
        for n, inf in names:
            if layer.facts.base_trainable or n in targets:
                layer.add(f"{group}.{n}.input_cast", 2 * inf, f"2·{state.sym(inf, spec)}")
        return
    # lora_A saves the input itself (no cast, no dropout: nn.Dropout gives each adapter its own copy); under autocast
    # only when the adapters are in its dtype (adapter_native: autocast's cast is the input itself)
    native = layer.facts.adapter_native
    reads_input = not adapter_cast and (not layer.facts.autocast or native) and not layer.facts.dropout
    # (only 4-bit layers read their input directly: bnb_direct)
    direct = [n for n, inf in names if bnb_direct(layer, n, shared_bytes // inf if inf else 0)] if four_bit else []
    shared_needed = trained or (any(n in targets for n, _ in names) and reads_input)
    if shared_needed or (direct and not layer.facts.dropout):
        layer.add(f"{group}.input", shared_bytes, shared_formula)
    for n, inf in names:
        if n not in targets:
            continue
        if n in direct:
            if layer.facts.dropout:  # lora_A saves the dropped copy nn.Dropout made, in x's 16-bit dtype
                layer.add(f"{group}.{n}.lora_dropout_output", 2 * inf, f"2·{state.sym(inf, spec)}")
        elif adapter_cast:
            lora_input_copy(layer, group, n, inf, state.sym(inf, spec))
        elif layer.facts.autocast and not native:
            # a 16-bit residual under autocast: PEFT casts it to the fp32 adapter's dtype, autocast
            # casts that back for lora_A, which saves the cast
            layer.add(f"{group}.{n}.input_cast", 2 * inf, f"2·{state.sym(inf, spec)}")
        elif layer.facts.dropout:  # the dropped copy of the input, lora_A's own (nn.Dropout's output)
            nb = shared_bytes // layer.facts.h if shared_bytes else layer.facts.a
            layer.add(f"{group}.{n}.lora_dropout_output", nb * inf, f"{nb}·{state.sym(inf, spec)}")


def lora_input_copy(layer: LayerState, group: str, n: str, inf: int, sym: str) -> None:
    """What lora_A of adapted module ``n`` saves of its input without autocast when the adapters' dtype is not the
    input's (``adapter_cast``): PEFT's ``x = self._cast_input_dtype(x, lora_A.weight.dtype)`` (peft 0.22
    tuners/lora/layer.py:1203; bnb.py:563-566 for 4-bit layers) copies x in the adapters' dtype, then
    ``lora_A(dropout(x))`` saves that copy (or the dropped copy nn.Dropout makes of it, in the same dtype): ``ad``
    bytes per value. fp32 adapters on a 16-bit base (PEFT's autocast_adapter_dtype); bf16 adapters on QLoRA's fp32
    residual under TRL's preference trainers, which cast a quantized model's trained parameters to bf16 (trl 1.16.0
    dpo_trainer.py:720-729; cabe.precision._trl_bf16_adapters): qwen2.5-1.5b QLoRA DPO, bf16 without autocast,
    b8 × 128 (TRL's disable_dropout sets the LoRA dropout to p=0): +16.8% with 4 bytes, the trace's copies are bf16."""
    ad = layer.facts.ad
    layer.add(f"{group}.{n}.lora_input_copy", ad * inf, f"{ad}·{sym}")


def bnb_direct(layer: LayerState, n: str, x_bytes: int) -> bool:
    """Whether adapted module ``n`` is a 4-bit layer whose lora_A reads its 16-bit input as it is: under
    autocast PEFT's bitsandbytes ``Linear4bit.forward`` skips the fp32 input cast (peft 0.21.2
    tuners/lora/bnb.py:542-545, ``requires_conversion = not torch.is_autocast_enabled()``), and without
    k-bit preparation that input is already autocast's 16 bits: lora_A's matmul saves x itself (shared by
    the adapters that read it), where a 16-bit nn.Linear's adapter saves a cast of PEFT's fp32 copy."""
    if (
        not (layer.facts.four_bit and not layer.facts.quantized and layer.facts.autocast and x_bytes == 2)
        or n not in layer.facts.targets
    ):
        return False
    lin = layer.linear(n)
    return lin is not None and lin.quantized_by_bnb


def note_lora_input(layer: LayerState, n: str, inf: int, x_bytes: int) -> None:
    """The forward transient of adapted module ``n`` reading ``inf`` values of ``x_bytes`` each per token,
    counted when the module's saved tensors are (:func:`lora_variants`, :func:`_note_adapter_moment`).

    PEFT 0.21 ``lora.Linear.forward`` (tuners/lora/layer.py): ``result = self.base_layer(x)``, then
    ``x = self._cast_input_dtype(x, lora_A.weight.dtype)`` makes a copy in the adapters' dtype when x's
    differs, ``dropout(x)`` a dropped copy, and ``result = result + lora_B(lora_A(dropout(x))) * scaling``,
    cast back to the result's dtype. Under autocast lora_A saves its own 16-bit cast, so neither copy is saved:
    both live until lora_A has cast. Without autocast lora_A saves what it reads (counted in linear_inputs),
    and only the copy that dropout read is transient. Beside them: x itself (the call's argument, saved by
    nothing when lora_A reads a copy or a cast), the base layer's output, lora_B's output and its scaled copy
    (lora_B's dtype: 16 bits under autocast, the adapters' without), then the sum (the promoted dtype) beside
    the scaled copy. mistral-7b LoRA with dropout, bf16 weights under autocast, checkpointing: the recomputed
    down_proj's two fp32 copies, 8·f per token, set the peak (−5.8% without them); phi-3-mini LoRA with
    dropout, bf16 weights without autocast, s2048: gate_up_proj's fp32 lora_B output and its scaled copy,
    2·4·2f per token (−4.0% without them)."""
    if n not in layer.facts.targets:
        return
    direct = bnb_direct(layer, n, x_bytes)  # lora_A reads (and saves) x itself: no copy
    copy = layer.facts.ad * inf if x_bytes != layer.facts.ad and not direct else 0
    dropped = layer.facts.ad * inf if layer.facts.dropout else 0
    layer.input_copies[n] = copy + dropped  # locals of lora.Linear.forward
    lin = layer.linear(n)
    if lin is None or layer.facts.dora:  # DoRA's output arithmetic: _note_dora_result
        return
    o = lin.out_features
    quantized_out = layer.facts.quantized and lin.quantized_by_bnb  # Linear4bit returns the input's dtype
    res = 2 if layer.facts.autocast else (x_bytes if quantized_out else layer.facts.a)
    bo = 2 if layer.facts.autocast else layer.facts.ad
    total = max(res, bo)
    out = max(res + 2 * bo, res + bo + total) * o
    reads_copy = layer.facts.dropout or (not direct and (layer.facts.autocast or x_bytes != layer.facts.ad))
    x_alive = x_bytes * inf if reads_copy and not layer.facts.base_trainable else 0
    copies = copy + dropped if layer.facts.autocast else (copy if layer.facts.dropout else 0)
    layer.lora_pending[n] = copies + x_alive + out


def _note_adapter_moment(layer: LayerState, n: str) -> None:
    """Module ``n``'s forward transient (:func:`note_lora_input`) beside what the layer saved up to it,
    in bytes for the setup's tokens; the layer keeps the largest, less its whole saved set at the end."""
    t = layer.lora_pending.pop(n, 0)
    if t:
        layer.dora_result_moment = max(layer.dora_result_moment, layer.facts.tokens * (layer.saved + t))


def lora_mid(layer: LayerState, names: list[str]) -> None:
    if not layer.facts.targets:  # (no adapter in this layer: nothing below would add or join)
        return
    r = layer.facts.r
    with layer.adapter_owned():
        for n in names:
            if n in layer.facts.targets:
                # lora_A's output: autocast's 16 bits, else the adapters' dtype (fp32, or TRL's bf16 on QLoRA)
                per = (2 if layer.facts.autocast else layer.facts.ad) * r
                layer.add(f"lora.{n}.A_output", per, f"{per // r}·r")
        lora_variants(layer, names)
    layer.joins(names)


def lora_variants(layer: LayerState, names: list[str]) -> None:
    """What LoRA dropout and DoRA save for each adapted module of ``names`` (PEFT 0.21).

    Dropout (``nn.Dropout`` before lora_A, tuners/lora/layer.py:1101): CUDA's fused dropout saves a
    1-byte mask of lora_A's input; its output replaces what lora_A saved (see :func:`linear_inputs`).

    DoRA (tuners/lora/dora.py:132-165, ``DoraLinearLayer.forward``): the output is
    ``(m/‖W + sBA‖ - 1) · base_result + m/‖W + sBA‖ · lora_B(lora_A(x)) · s``, the norm detached
    (dora.py:152). The two products save ``base_result`` (the base layer's output; with dropout a new
    ``F.linear`` of the dropped input, dora.py:163) and lora_B's output, tokens × out each, and the
    out-sized ``m/‖·‖`` and ``m/‖·‖ - 1`` and the norm that the division saves (per layer).
    """
    for n in names:
        if n not in layer.facts.targets:
            continue
        lin = layer.linear(n)
        if lin is None:
            continue
        i, o = lin.in_features, lin.out_features
        if layer.facts.dropout:
            layer.add(f"lora.{n}.dropout_mask", i, f"1·{state.sym(i, layer.facts.spec)}")
        if not layer.facts.dora:
            _note_adapter_moment(layer, n)
            continue
        # base layer's output: autocast's 16 bits, else the layer's compute dtype; with dropout
        # F.linear(dropped x, W.to(x.dtype)) runs in lora_A's input dtype (the adapter's, without autocast)
        rb = 2 if layer.facts.autocast else (layer.facts.ad if layer.facts.dropout else layer.facts.a)
        if layer.facts.quantized and lin.quantized_by_bnb and not layer.facts.dropout:
            rb = 4  # Linear4bit's output, in its fp32 input's dtype (peft tuners/lora/bnb.py:533 clones it)
        if lin.bias and not layer.facts.dropout:
            # ``base_result = base_result - bias`` (dora.py:158): a new tensor in the promoted dtype of the
            # output and the bias (the frozen weights' dtype; prepare_model_for_kbit_training's fp32 for 4-bit
            # layers), which the product then saves (pythia-1.4b DoRA, fp32 weights under autocast: -9.2%)
            # 16-bit weights under the other half's autocast (fp16 weights, bf16 autocast: an fp32 residual): the
            # autocast output minus the bias of the other half type promotes to fp32 (starcoderbase-1b DoRA, fp16
            # weights under bf16 autocast, b1 × 4096: −12.4% with it 16-bit)
            halves = layer.facts.autocast and rb == 2 and layer.facts.dt_frozen == 2 and layer.facts.rho == 4
            rb = max(rb, 4 if (layer.facts.quantized and lin.quantized_by_bnb) or halves else layer.facts.dt_frozen)
        rl = 2 if layer.facts.autocast else layer.facts.ad  # lora_B's output
        layer.add(f"dora.{n}.base_result", rb * o, f"{rb}·{state.sym(o, layer.facts.spec)}")
        layer.add(f"dora.{n}.lora_result", rl * o, f"{rl}·{state.sym(o, layer.facts.spec)}")
        layer.constant += 3 * layer.facts.ad * o  # m/‖·‖, m/‖·‖ - 1, ‖·‖ (adapter dtype)
        layer.dora_norm_bytes = max(layer.dora_norm_bytes, _dora_norm_transient(layer, lin))
        _note_dora_result(layer, lin, rb, rl)
        if layer.facts.dropout:
            layer.constant += _dora_dropout_weight(layer, lin)
            _dora_stray_parameter(layer, n, lin)


def _dora_stray_parameter(layer: LayerState, n: str, lin: Linear) -> None:
    """DoRA with dropout on a Conv1D layer (PEFT sets ``fan_in_fan_out`` for them): ``F.linear(x,
    transpose(W, fan_in_fan_out))`` (peft 0.21 tuners/lora/dora.py:163), and ``transpose`` wraps ``W.T`` in a
    new ``torch.nn.Parameter`` (peft/utils/other.py:1315-1316), which requires grad, whenever ``W.to(x.dtype)``
    returned the frozen weight itself (the adapters' dtype is the weights'). So the matmul saves its input
    too (under autocast a 16-bit cast of the dropped input of its own; without it the dropped input lora_A
    already saves), and backward makes that throwaway parameter's gradient (in×out in the weights' dtype),
    which lives until the graph is freed after backward. gpt2-medium DoRA + dropout on c_proj, fp32 weights
    under fp16 autocast: -3.9% without the casts."""
    if not dora_stray_parameter(layer.facts.spec, layer.facts.four_bit, layer.facts.ad, layer.facts.dt_frozen, lin):
        return
    i = lin.in_features
    if layer.facts.autocast:
        layer.add(f"dora.{n}.linear_input_cast", 2 * i, f"2·{state.sym(i, layer.facts.spec)}")
    g = round_alloc(layer.facts.dt_frozen * i * lin.out_features)
    layer.stray_grads += g
    if layer.block == "mlp":
        layer.stray_grads_mlp += g


def _note_dora_result(layer: LayerState, lin: Linear, rb: int, rl: int) -> None:
    """The end of one DoRA module's forward (peft 0.21 tuners/lora/dora.py:135-165 ``DoraLinearLayer.forward``;
    variants.py ``DoraLinearVariant.forward``), when ``(m/‖·‖ − 1) · base_result + m/‖·‖ · lora_result ·
    scaling`` is computed: the first product (in the promoted dtype of the adapters' magnitude and the base
    result), the second and its scaled copy (magnitude and lora_B's output) are alive at once, then the sum
    beside two of them (none of them saved: the products save their inputs). Beside them: with dropout the
    base layer's own output (``result``, which the module adds to afterwards; without dropout it is the saved
    ``base_result``), and the function's locals, alive until it returns: the base weight cast to the input's
    dtype (``weight.to(x.dtype)``) and lora_B·lora_A cast likewise (``lora_weight.to(x.dtype)``), each i×o
    when a cast copies, and lora.Linear.forward's copies of the input (its cast to the adapters' dtype, the dropped
    copy: see :func:`note_lora_input`). Everything the layer saved up to this module is alive, what it saves later is not:
    the moment is kept in bytes, less the layer's whole saved set at the end. phi-3-mini DoRA + dropout,
    bf16 weights under bf16 autocast, checkpointing, s4096: the recomputed gate_up_proj's three fp32
    (tokens × 2f) products and two fp32 i×o casts set the peak (−4.2% without them)."""
    i, o = lin.in_features, lin.out_features
    r1, r2 = max(layer.facts.ad, rb), max(layer.facts.ad, rl)
    per_token = max(r1 + 2 * r2, r1 + r2 + max(r1, r2)) * o
    if layer.facts.dropout:
        per_token += (2 if layer.facts.autocast else layer.facts.a) * o  # the base layer's output, ``result``
    per_token += layer.input_copies.get(lin.name, 0)  # x cast to the adapters' dtype, and dropped
    x = 4 if layer.facts.quantized and lin.quantized_by_bnb else layer.facts.ad
    w = layer.facts.dt_frozen if not (layer.facts.quantized and lin.quantized_by_bnb) else 2
    e = 2 if layer.facts.autocast else layer.facts.ad
    const = round_alloc(i * o * x) * ((w != x) + (e != x))
    saved = layer.saved
    layer.dora_result_moment = max(layer.dora_result_moment, layer.facts.tokens * (saved + per_token) + const)


def _dora_norm_transient(layer: LayerState, lin: Linear) -> int:
    """What one DoRA module's weight norm holds at once, in every forward (peft 0.21 dora.py:86-101,
    132-145): ``eye(in)`` pushed through lora_A and lora_B (its graph saves the eye, in 16 bits under
    autocast, until forward returns), that in × out product cast to lora_A's input dtype x, the base
    weight cast to x's dtype, and ``W + s·BA`` being summed while ``s·BA`` lives: at the sum,
    i²·e + i·r·e + 3·i·o·x (+ i·o·x for the weight's cast). Before it, lora_B's call holds the fp32 eye,
    its cast and the product: i²·(x + e) + i·o·e under autocast."""
    i, o, r = lin.in_features, lin.out_features, layer.facts.r
    e = 2 if layer.facts.autocast else layer.facts.ad  # lora_A / lora_B's compute dtype
    # bnb layers skip PEFT's input cast under autocast: x is the residual's dtype (fp32 after k-bit preparation)
    x = (
        (layer.facts.rho if layer.facts.autocast else layer.facts.ad)
        if layer.facts.four_bit and lin.quantized_by_bnb
        else layer.facts.ad
    )
    w = layer.facts.dt_frozen if not (layer.facts.four_bit and lin.quantized_by_bnb) else 2
    at_sum = i * i * e + i * r * e + 3 * i * o * x + (i * o * x if w != x else 0)
    at_lora_b = i * i * (layer.facts.ad + (e if e != layer.facts.ad else 0)) + i * r * e + i * o * e
    return max(at_sum, at_lora_b)


def _dora_dropout_weight(layer: LayerState, lin: Linear) -> int:
    """With dropout, DoRA's ``F.linear(x, W.to(x.dtype))`` (dora.py:163) saves the weight it multiplies
    by when that is a new tensor: a copy in the adapter's dtype (no autocast), or autocast's 16-bit
    cast of it (not a leaf: cast anew, never cached) unless the weight was 16-bit all along."""
    n = lin.in_features * lin.out_features
    if layer.facts.autocast:
        return round_alloc(2 * n) if (layer.facts.ad, layer.facts.dt_frozen) != (2, 2) else 0
    return round_alloc(layer.facts.ad * n) if layer.facts.ad != layer.facts.dt_frozen else 0


def dora_stray_parameter(spec: ModelSpec, quantized: bool, adapter: int, frozen: int, lin: Linear) -> bool:
    """Whether DoRA with dropout on ``lin`` multiplies by a throwaway ``Parameter(W.T)`` that requires grad
    (see ``adapters._dora_stray_parameter``): a Conv1D layer whose weight is already in the adapters' dtype."""
    return spec.conv1d and adapter == frozen and not (quantized and lin.quantized_by_bnb)


def auto_cast_input(layer: LayerState) -> bool:
    """Under autocast, PEFT's Linear casts lora_A's 16-bit input to the adapters' fp32 and autocast casts that back:
    lora_A saves a new 16-bit copy. Not for bitsandbytes' layers (they skip the cast), nor for adapters in the
    autocast dtype (adapter_dtype model: both casts return the input itself)."""
    return layer.facts.autocast and not layer.facts.four_bit and not layer.facts.adapter_native
