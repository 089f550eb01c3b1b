"""Attention the way CUDA runs it, on fake tensors.

Three pieces:

* :func:`cuda_sdp_choice` ports ``select_sdp_backend`` from
  ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` (PyTorch main, read for this
  module): priority flash > memory-efficient > math; flash needs fp16/bf16, no
  ``attn_mask``, equal q/k/v head dims <= 256, ``is_causal`` only with equal q/k lengths,
  equal heads or ``enable_gqa`` with q-heads divisible by kv-heads; memory-efficient needs
  head dims divisible by ``minimum_gemm_alignment`` (8 for 16-bit, 4 for fp32 on sm80+),
  accepts masks but not grouped heads (its dense constraints instantiate
  ``check_batch_size_and_num_heads_dense<false>``): fp32 queries with fewer kv heads and
  ``enable_gqa`` therefore fall to the math kernel, which ``repeat_interleave``s k and v. The device is taken to be an sm90
  (H100/H200). The cuDNN backend, which recent PyTorch builds prefer on sm90/sm100 when the
  runtime cuDNN is newer than 9.15 (``check_prefer_cudnn_attention``), is not modelled: its
  saved tensors (output + fp32 softmax stats) have the same size as flash's.
  ``scaled_dot_product_attention`` asks the ``_fused_sdp_choice_stub`` DispatchStub, which
  a CPU build lacks for CUDA (and which is no dispatcher op a mode could answer), so the
  fake run would take the math path. :func:`routed_sdpa` replaces
  ``torch.nn.functional.scaled_dot_product_attention`` during a trace and reproduces the
  CUDA branch of ``scaled_dot_product_attention`` in
  ``aten/src/ATen/native/transformers/attention.cpp``: ``convert_boolean_attn_mask``,
  ``pad_last_dim<8>`` + original scale for flash, ``preprocess_mask`` (pad to 8 if the
  mask is unaligned, expand) for memory-efficient, the math kernel otherwise. Every fused
  kernel has a meta implementation.
* :func:`flash_attention_forward` is registered with transformers as ``cabe_fa2`` (a name without "flash": transformers would look for a hub kernel):
  ``flash_attention_2`` semantics (inputs in (b, s, h, d), no ``repeat_kv``, no mask,
  fp32 inputs cast to the autocast / compute dtype first) through
  ``aten._flash_attention_forward``, the same FlashAttention-2 code.
* :func:`intercept` adds what the CUDA kernels allocate internally, following
  ``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp``: ``mha_fwd`` returns a
  device ``rng_state`` (2 x uint64) and an ``_unused`` uint64 scalar, both saved for
  backward (the meta kernel puts them on ``meta``); ``mha_bwd`` allocates
  ``softmax_d`` (b, h, round128(s_q)) fp32, ``dq_accum`` (b, round128(s_q), h,
  round(d, 32|64)) fp32 and, for GQA, ``dk_expanded``/``dv_expanded`` (b, s_k, h_q, d)
  before summing them into dk/dv; all are freed when the kernel returns.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from cabe.trace import state
from cabe.trace.state import AttentionState

aten = torch.ops.aten

# at::SDPBackend values (aten/src/ATen/native/transformers/sdp_utils_cpp.h, enum class SDPBackend)
SDP_ERROR, SDP_MATH, SDP_FLASH, SDP_EFFICIENT, SDP_CUDNN, SDP_OVERRIDEABLE = -1, 0, 1, 2, 3, 4
SDP_NAMES = {SDP_MATH: "math", SDP_FLASH: "flash", SDP_EFFICIENT: "efficient", SDP_CUDNN: "cudnn"}

_HALF = (torch.float16, torch.bfloat16)


def _heads_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool) -> bool:
    # check_batch_size_and_num_heads_dense<supports_gqa=true> (sdp_utils_cpp.h)
    if not (q.size(0) == k.size(0) == v.size(0)):
        return False
    hq, hk, hv = q.size(-3), k.size(-3), v.size(-3)
    if enable_gqa:
        return hk == hv and hq % hk == 0
    return hq == hk == hv


def cuda_sdp_choice(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Any = None,
    enable_gqa: bool = False,
) -> int:
    """The SDPA backend PyTorch picks on an sm90 GPU (see module docstring)."""
    if not (q.dim() == k.dim() == v.dim() == 4):  # check_tensor_shapes
        return SDP_MATH
    if q.size(-2) == 0 or k.size(-2) == 0:  # check_nonzero_sequence_lengths_dense
        return SDP_MATH
    if _can_use_flash(q, k, v, attn_mask, is_causal, enable_gqa):
        return SDP_FLASH
    if _can_use_mem_efficient(q, k, v, attn_mask, enable_gqa):
        return SDP_EFFICIENT
    return SDP_MATH


def _can_use_flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any, is_causal: bool, enable_gqa: bool
) -> bool:
    """``can_use_flash_attention`` (sdp_utils.cpp)."""
    dq, dk, dv = q.size(-1), k.size(-1), v.size(-1)
    return bool(
        attn_mask is None
        and dq == dk == dv
        and dq <= 256
        and (not is_causal or q.size(-2) == k.size(-2))
        and q.dtype in _HALF
        and k.dtype == q.dtype
        and v.dtype == q.dtype
        and _heads_ok(q, k, v, enable_gqa)
        and (q.stride(-1) == 1 or dq == 1)
        and (k.stride(-1) == 1 or dq == 1)
        and (v.stride(-1) == 1 or dq == 1)
    )


def _can_use_mem_efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any, enable_gqa: bool) -> bool:
    """``can_use_mem_efficient_attention``; minimum_gemm_alignment on sm80+: 8 for 16-bit, 4 for fp32."""
    dq, dk, dv = q.size(-1), k.size(-1), v.size(-1)
    align = 8 if q.dtype in _HALF else 4
    return bool(
        dq == dk
        and dq % align == 0
        and dq > 0
        and dv % align == 0
        and dv > 0
        and q.dtype in (torch.float16, torch.bfloat16, torch.float32)
        # check_batch_size_and_num_heads_dense<false /*supports_grouped_query_attention=*/> in the
        # kernel's dense constraints: the CUDA memory-efficient kernel never takes grouped heads, whatever
        # enable_gqa says (measured: TinyLlama fp32 on an H200 ran the math kernel, 42.3 GB where this
        # port said 29.1 GB when it let GQA through; benchmarks/gpu/results/grid.csv)
        and _heads_ok(q, k, v, False)
        and q.stride(-1) == 1
        and k.stride(-1) == 1
        and v.stride(-1) == 1
        and (attn_mask is None or attn_mask.stride(-1) == 1)
    )


def _round(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _device_rng(state: AttentionState, tracker: Any, out: tuple, seed_i: int, off_i: int) -> tuple:
    # mha_fwd: rng_state = at::empty({2}, uint64, CUDA); _unused = at::empty({}, uint64, CUDA)
    res = list(out)
    if isinstance(res[seed_i], torch.Tensor) and res[seed_i].device.type == "meta" and state.device.type != "meta":
        res[seed_i] = torch.empty((2,), dtype=torch.uint64, device=state.device)
        res[off_i] = torch.empty((), dtype=torch.uint64, device=state.device)
    for i in (seed_i, off_i):
        if isinstance(res[i], torch.Tensor):
            tracker.record(res[i], "flash.rng_state")
    return tuple(res)


def _flash_bwd_scratch(tracker: Any, b: int, sq: int, sk: int, hq: int, hk: int, d: int, dtype: torch.dtype) -> None:
    """mha_bwd's internal buffers (flash_api.cpp), allocated after dq/dk/dv and freed on return."""
    d_rounded = _round(d, 32 if d <= 128 else 64)
    sq_r = _round(sq, 128)
    frees = [
        tracker.scratch(b * hq * sq_r * 4, "flash_bwd.softmax_d"),
        tracker.scratch(b * sq_r * hq * d_rounded * 4, "flash_bwd.dq_accum"),
    ]
    if hk != hq:
        esz = torch.empty((), dtype=dtype).element_size()
        frees.append(tracker.scratch(b * sk * hq * d * esz, "flash_bwd.dk_expanded"))
        frees.append(tracker.scratch(b * sk * hq * d * esz, "flash_bwd.dv_expanded"))
    for f in reversed(frees):
        f()


def routed_sdpa(
    state: AttentionState,
    original: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Any = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` as CUDA runs it (see module docstring)."""
    if torch.is_autocast_enabled(query.device.type if query.device.type != "meta" else "cuda"):
        # SDPA is on autocast's lower-precision list (autocast_mode.cpp): floating inputs are
        # cast before the backend is chosen; our replacement runs above the Autocast key.
        dt = torch.get_autocast_dtype("cuda")
        query, key, value = (t.to(dt) if t.is_floating_point() else t for t in (query, key, value))
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(dt)
    choice = cuda_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    state.note(SDP_NAMES.get(choice, str(choice)))
    if choice == SDP_MATH:
        return original(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # convert_boolean_attn_mask
        new_mask = torch.zeros_like(attn_mask, dtype=query.dtype)
        new_mask.masked_fill_(attn_mask.logical_not(), float("-inf"))
        attn_mask = new_mask
    if choice == SDP_FLASH:
        og = query.size(-1)

        def pad8(t: torch.Tensor) -> torch.Tensor:  # pad_last_dim<8, false>
            return t if t.size(-1) % 8 == 0 else torch.nn.functional.pad(t, (0, 8 - t.size(-1) % 8))

        og_scale = scale if scale is not None else 1.0 / (og**0.5)  # sdp::calculate_scale
        out = aten._scaled_dot_product_flash_attention(
            pad8(query), pad8(key), pad8(value), dropout_p, is_causal, False, scale=og_scale
        )[0]
        return out if out.size(-1) == og else out[..., :og]  # post_process_flash_output
    # memory-efficient
    compute_lse = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    if attn_mask is not None:  # preprocess_mask, mem_eff_alignment = 8
        aligned = all(attn_mask.stride(i) % 8 == 0 for i in range(attn_mask.dim() - 1)) and attn_mask.stride(-1) == 1
        if not aligned:
            last = attn_mask.size(-1)
            attn_mask = torch.nn.functional.pad(attn_mask, (0, 8 - last % 8))[..., :last]
        attn_mask = attn_mask.expand(query.size(0), query.size(1), query.size(2), key.size(2))
    return aten._scaled_dot_product_efficient_attention(
        query, key, value, attn_mask, compute_lse, dropout_p, is_causal, scale=scale
    )[0]


def intercept(state: AttentionState, tracker: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    if func is aten._local_scalar_dense.default:
        # A fake tensor has no value. Host reads happen in optimizers (Adafactor's RMS of the
        # parameter, GradScaler's found_inf) and step counters kept on the host. Device values
        # read as 0 (no inf found), host values as 1 (step counters: 1 - beta**step != 0).
        # No allocation depends on these values.
        t = args[0]
        if getattr(t, "constant", None) is not None:  # a fake tensor that keeps its value (cabe.trace.vision)
            return t.constant.item()
        v = 1 if t.device.type == "cpu" else 0
        if t.dtype == torch.bool:
            return bool(v)
        return float(v) if t.is_floating_point() else v
    if func is aten._grouped_mm.default and args[0].dtype != torch.bfloat16:
        # transformers' MoE experts call torch._grouped_mm on CUDA for any dtype; the meta
        # kernel only accepts bf16 (the CUDA op falls back to per-group matmuls). Same output.
        a, b = args[0], args[1]
        out_shape = func(a.to(torch.bfloat16), b.to(torch.bfloat16), *args[2:], **kwargs).shape
        out = torch.empty(out_shape, dtype=kwargs.get("out_dtype") or a.dtype, device=a.device)
        tracker.record(out, "_grouped_mm")
        return out
    if func is aten._scaled_dot_product_flash_attention.default:
        out = func(*args, **kwargs)
        tracker.record(out[0], "sdpa_flash")
        tracker.record(out[1], "sdpa_flash.lse")
        return _device_rng(state, tracker, out, 6, 7)
    if func is aten._flash_attention_forward.default:
        out = func(*args, **kwargs)
        tracker.record(out[0], "flash_attn")
        tracker.record(out[1], "flash_attn.lse")
        return _device_rng(state, tracker, out, 2, 3)
    if func is aten._scaled_dot_product_flash_attention_backward.default:
        out = func(*args, **kwargs)
        for o in out:
            tracker.record(o, "sdpa_flash_backward")
        q, k = args[1], args[2]  # (b, h, s, d)
        _flash_bwd_scratch(tracker, q.size(0), q.size(2), k.size(2), q.size(1), k.size(1), q.size(3), q.dtype)
        return out
    if func is aten._flash_attention_backward.default:
        out = func(*args, **kwargs)
        for o in out:
            tracker.record(o, "flash_attn_backward")
        q, k = args[1], args[2]  # (b, s, h, d)
        _flash_bwd_scratch(tracker, q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), q.dtype)
        return out
    if func is aten._scaled_dot_product_efficient_attention_backward.default:
        q, k, v = args[1], args[2], args[3]
        if q.size(1) != k.size(1):
            # The meta kernel sizes dk/dv with the query's heads (GQA). Allocate what it
            # returns as the expanded gradients, then the real kv-head-sized dk/dv.
            gq, gk_exp, gv_exp, gb = func(*args, **kwargs)
            tracker.record(gq, "sdpa_efficient_backward")
            tracker.record(gk_exp, "sdpa_efficient_backward.dk_expanded")
            tracker.record(gv_exp, "sdpa_efficient_backward.dv_expanded")
            gk = torch.empty_like(k)
            gv = torch.empty_like(v)
            tracker.record(gk, "sdpa_efficient_backward")
            tracker.record(gv, "sdpa_efficient_backward")
            del gk_exp, gv_exp
            return gq, gk, gv, gb
        return NotImplemented
    return NotImplemented


def flash_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' ``flash_attention_2`` memory behaviour via ``aten._flash_attention_forward``."""
    q = query.transpose(1, 2)
    k = key.transpose(1, 2)
    v = value.transpose(1, 2)
    # integrations/flash_attention.py (5.24): flash needs q and v of one head dim; a narrower v (multi-head latent
    # attention) is padded up to it and the output cropped back
    v_head_dim = v.size(-1)
    if v_head_dim != q.size(-1):
        v = torch.nn.functional.pad(v, [0, q.size(-1) - v_head_dim])
    if q.dtype == torch.float32:
        # modeling_flash_attention_utils: fp32 inputs are cast to the autocast dtype (or the
        # pre-quantization / weight dtype); we use the compute dtype the engine sets.
        if torch.is_autocast_enabled("cuda"):
            target = torch.get_autocast_dtype("cuda")
        else:
            target = getattr(module, "_cabe_flash_dtype", torch.bfloat16)
        q, k, v = q.to(target), k.to(target), v.to(target)
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    out = flash_kernel(q, k, v, float(dropout if module.training else 0.0), bool(causal), scaling)
    return (out if out.size(-1) == v_head_dim else out[..., :v_head_dim]), None


def flash_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, causal: bool, scale: float | None
) -> torch.Tensor:
    """FlashAttention-2's forward on (b, s, h, d) inputs, no mask (causal past one query), as
    ``aten._flash_attention_forward``: the kernel every ``flash`` path of the trace runs."""
    with contextlib.suppress(IndexError):
        state.current().note("flash_attention_2")
    return torch.ops.aten._flash_attention_forward(
        q, k, v, None, None, q.size(1), k.size(1), dropout, causal and q.size(1) > 1, False, scale=scale
    )[0]


_REGISTERED = False


def register_flash() -> str:
    """Register ``cabe_fa2`` (a name without "flash": transformers would look for a hub kernel) with transformers' attention and mask interfaces."""
    global _REGISTERED
    if not _REGISTERED:
        from cabe.trace import compat

        every = compat.EVERY_FAMILY
        interface = compat.require(compat.module("modeling_utils", every), "AttentionInterface", every)
        mu = compat.module("masking_utils", every)
        interface.register("cabe_fa2", flash_attention_forward)
        compat.require(mu, "ALL_MASK_ATTENTION_FUNCTIONS", every).register(
            "cabe_fa2", compat.require(mu, "flash_attention_mask", every)
        )
        _REGISTERED = True
    return "cabe_fa2"
