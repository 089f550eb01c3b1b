"""State-space (Mamba-2) mixers: what one training step saves and holds. (What serving keeps per sequence:
:mod:`cabe.ssm`.)

Training, as a GPU with ``mamba-ssm`` installed runs it. transformers 5.24 (models/granitemoehybrid/
modeling_granitemoehybrid.py, ``GraniteMoeHybridMambaLayer.forward``) calls
``mamba_split_conv1d_scan_combined`` when ``self.training and cache is None`` and the package is importable
(integrations/hub_kernels.py ``use_kernel_func_from_hub_with_fallback``: hub kernel, then the package, then the
PyTorch path). Its autograd function (state-spaces/mamba@e9594ce, mamba_ssm/ops/triton/ssd_combined.py:820-985,
``MambaSplitConv1dScanCombinedFn``) is one node over conv1d, the chunked scan, the gated RMSNorm and ``out_proj``:

* forward (ssd_combined.py:842-899): ``causal_conv1d_fwd`` makes the convolved ``xBC`` (conv_dim per token, in
  in_proj's output dtype x); ``_mamba_chunk_scan_combined_fwd`` (:343-395) makes ``dA_cumsum`` and ``dt`` (fp32,
  heads per padded token), the chunk states in fp32 (``_chunk_state_fwd(states_in_fp32=True)``: heads × head_dim ×
  state per chunk), the passed states in x's dtype and the final state in fp32, ``CB`` (fp32, groups × chunk per
  padded token) and the scan's output y (d_inner, x); ``_layer_norm_fwd`` the gated norm's output (d_inner, x) and
  ``rstd`` (fp32, one per group per token); ``F.linear`` with ``out_proj``'s weight (cast to the autocast dtype
  under autocast) the block's output. It saves (:888) ``zxbcdt`` (in_proj's output), y, rstd and the weights — and
  under autocast the weight's 16-bit cast, when the weight is not 16-bit already.
* backward (:903-985): ``out_recompute`` (d_inner), ``xBC`` recomputed (conv_dim), ``dzxbcdt`` (in_proj width),
  ``dxBC`` (conv_dim), ``F.linear(dout, W.t())`` (d_inner) and the norm's input gradient (d_inner);
  ``_mamba_chunk_scan_combined_bwd`` (:397-495) clones dt, recomputes dA_cumsum, dt, CB and the states (fp32),
  makes dstates (fp32), then ``_state_passing_bwd``'s dstates and states in x's dtype, and ddt, dB, dC, dCB (fp32);
  ``causal_conv1d_bwd`` the convolution's input gradient (conv_dim).

This module counts those tensors; the trace runs a stand-in of the same function on fake tensors
(:mod:`cabe.trace.ssm`), so the figures are modelled from the kernels' source, not traced (note
``mamba2_kernel_modelled``). The PyTorch fallback (``torch_forward``'s chunked scan, what transformers runs without
mamba-ssm) saves far more: fp32 chunk tensors of chunk × chunk per head.

Proved by tests/families/test_granitemoehybrid.py and tests/trace/test_granite_trace.py (the stand-in's trace).
"""

from __future__ import annotations

from cabe.activations import adapters, norms
from cabe.activations.state import LayerState
from cabe.architecture import ModelSpec
from cabe.mixers import Mamba2
from cabe.units import round_alloc


def _padded(s: int, chunk: int) -> int:
    """Tokens of one sequence rounded up to whole chunks (the scan's chunk tensors)."""
    return -(-s // chunk) * chunk


def _per_token(total: int, tokens: int) -> int:
    return -(-total // tokens)


def chunk_tensors(m: Mamba2, s: int, x: int) -> dict[str, int]:
    """Bytes per token of the scan's chunk-level tensors for sequences of ``s`` tokens (x: in_proj's output
    dtype): dA_cumsum and dt (fp32, heads per padded token), CB (fp32, groups × chunk per padded token), one
    chunk-state tensor in fp32 and in x, the final state (fp32, one per sequence)."""
    pad, chunks = _padded(s, m.chunk), -(-s // m.chunk)
    state = m.heads * m.head_dim * m.state
    return {
        "dA_dt": _per_token(2 * 4 * m.heads * pad, s),
        "CB": _per_token(4 * m.groups * m.chunk * pad, s),
        "states32": _per_token(4 * state * chunks, s),
        "states_x": _per_token(x * state * chunks, s),
        "final32": _per_token(4 * state, s),
        "ddt": _per_token(4 * m.heads * pad, s),
    }


def mixer_terms(layer: LayerState) -> None:
    """The Mamba-2 mixer's saved tensors for one layer (an ``cabe.activations.state.LayerState``): the input norm, in_proj's
    input (with its LoRA), and what the fused function saves. out_proj runs inside the function: PEFT's adapter on
    it is never called, and it saves no input of its own."""
    spec, h, rho = layer.facts.spec, layer.facts.h, layer.facts.rho
    m = spec.mamba2
    assert m is not None
    bt = layer.facts.base_trainable
    norms.rms_norm(layer, "input_norm", h, "h", bt, spec.norm_weight_fp32)
    if rho == 4:
        layer.input_alias = 4 * h  # RMSNorm's .to(float32) of an fp32 input is the input itself (see _rms_attention)
    adapters.linear_inputs(layer, "ssm", [("in_proj", h)], rho * h, f"{rho}·h")
    adapters.lora_mid(layer, ["in_proj"])
    x = in_proj_dtype(layer)
    layer.add("ssm.zxbcdt", x * m.in_proj_width, f"{x}·(2·d_inner + 2·g·N + H)")
    layer.add("ssm.scan_output", x * m.d_inner, f"{x}·d_inner")
    layer.add("ssm.norm_rstd", 4 * m.groups, "4·g")
    # A = -exp(A_log.float()) (modeling_granitemoehybrid.py): the function saves A (fp32, heads); exp saves its
    # output when A_log trains
    layer.constant += round_alloc(4 * m.heads) * (2 if bt else 1)
    # NOTE: under autocast the function casts an fp32 out_proj weight to 16 bits and saves the copy (:881-888); that
    # is the one copy the estimate's weight copies already count for out_proj (as autocast's cast of any linear)


def in_proj_dtype(layer: LayerState) -> int:
    """Bytes of in_proj's output, the dtype every tensor of the fused function takes (x in the docstring)."""
    return 2 if layer.facts.autocast else layer.facts.a


def forward_workspace(spec: ModelSpec, s: int, x: int, a: int) -> int:
    """Bytes per token the fused forward holds beyond what it saves: the convolved xBC and the scan's chunk
    tensors throughout; then CB (until the scan returns) or the norm's output and out_proj's result (a)."""
    m = spec.mamba2
    assert m is not None
    c = chunk_tensors(m, s, x)
    held = x * m.conv_dim + c["dA_dt"] + c["states_x"] + c["final32"]
    at_state_pass = x * m.conv_dim + c["dA_dt"] + c["states32"] + c["states_x"] + c["final32"]
    at_scan = held + c["CB"]
    at_out_proj = held + x * m.d_inner + a * spec.hidden_size
    return max(at_state_pass, at_scan, at_out_proj)


def backward_workspace(spec: ModelSpec, s: int, x: int, a: int) -> int:
    """Bytes per token the fused backward holds beyond the saved tensors and the incoming gradient, at its
    largest (see the module docstring for the order; :mod:`cabe.trace.ssm` allocates the same)."""
    m = spec.mamba2
    assert m is not None
    c = chunk_tensors(m, s, x)
    base = x * m.d_inner + x * m.conv_dim + x * m.in_proj_width + x * m.conv_dim  # out_recompute, xBC, dzxbcdt, dxBC
    dy = x * m.d_inner  # the norm's input gradient, the scan's dout
    at_norm = base + a * m.d_inner + dy
    scan = base + dy + x * m.heads + c["dA_dt"] + c["CB"]  # + dt's clone
    at_state_pass = scan + 2 * c["states32"] + 2 * c["states_x"]
    at_db = scan + 2 * c["states_x"] + c["ddt"] + 2 * 4 * m.groups * m.state + c["CB"]  # ddt, dB, dC, dCB
    at_conv = base + dy + x * m.conv_dim
    return max(at_norm, at_state_pass, at_db, at_conv)
