"""A stand-in, on fake tensors, for mamba-ssm's fused Mamba-2 training kernel.

transformers 5.24 calls ``mamba2_split_conv1d_scan_combined`` in a Mamba-2 layer's training forward and, when
``mamba-ssm`` is installed (as on the GPUs people train hybrids on), gets ``MambaSplitConv1dScanCombinedFn``
(state-spaces/mamba@e9594ce, mamba_ssm/ops/triton/ssd_combined.py:820-985). Its Triton and CUDA kernels cannot run
on fake tensors, and without the package transformers falls back to ``torch_forward``'s chunked scan, which saves
fp32 chunk × chunk tensors per head the kernel never makes. This function allocates, in the same order, the
tensors the kernel's Python code allocates, saves what it saves and returns gradients of the right shapes — the
values are never computed. cabe.ssm counts the same tensors analytically; the report says the figure is
modelled from the kernels' source (``mamba2_kernel_modelled``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Any

import torch
import torch.nn.functional as F

#: transformers modules whose Mamba-2 layers call the fused function by this module-level name
MODULES = ("transformers.models.granitemoehybrid.modeling_granitemoehybrid",)
NAME = "mamba2_split_conv1d_scan_combined"
#: the kernel name the trace's state notes each time the stand-in runs (its ``attention_kernels``)
KERNEL = "mamba2_fused_stand_in"


def _chunks(s: int, chunk: int) -> int:
    """Chunks of ``chunk`` tokens over a sequence of ``s`` (the last one padded)."""
    return -(-s // chunk)


class _FusedScan(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(
        ctx: Any,
        zxbcdt: torch.Tensor,
        conv_w: torch.Tensor,
        conv_b: torch.Tensor | None,
        dt_bias: torch.Tensor,
        A: torch.Tensor,
        D: torch.Tensor,
        norm_w: torch.Tensor,
        out_w: torch.Tensor,
        out_b: torch.Tensor | None,
        shape: tuple[int, int, int, int],
    ) -> torch.Tensor:
        chunk, headdim, ngroups, dstate = shape
        b, s, _ = zxbcdt.shape
        nheads = D.shape[0]
        dim, conv_dim = nheads * headdim, conv_w.shape[0]
        x, dev = zxbcdt.dtype, zxbcdt.device
        nchunks = _chunks(s, chunk)
        # ssd_combined.py:844 causal_conv1d_fwd -> xBC (b, s, conv_dim)
        xbc = torch.empty(b, s, conv_dim, dtype=x, device=dev)
        # :374 _chunk_cumsum_fwd -> dA_cumsum, dt (fp32, b × heads × chunks × chunk)
        da = torch.empty(b, nheads, nchunks, chunk, dtype=torch.float32, device=dev)
        dt = torch.empty(b, nheads, nchunks, chunk, dtype=torch.float32, device=dev)
        # :375 _chunk_state_fwd(states_in_fp32=True); :379 _state_passing_fwd (out in C's dtype, final in fp32)
        states32 = torch.empty(b, nchunks, nheads, headdim, dstate, dtype=torch.float32, device=dev)
        states = torch.empty(b, nchunks, nheads, headdim, dstate, dtype=x, device=dev)
        final = torch.empty(b, nheads, headdim, dstate, dtype=torch.float32, device=dev)
        del states32
        # :386 _bmm_chunk_fwd -> CB (fp32); :387 _chunk_scan_fwd -> y (b, s, heads, headdim)
        cb = torch.empty(b, nchunks, ngroups, chunk, chunk, dtype=torch.float32, device=dev)
        y = torch.empty(b, s, dim, dtype=x, device=dev)
        del cb
        # :872 _layer_norm_fwd (gated RMSNorm over groups): its output and rstd (fp32, one per group and token)
        normed = torch.empty(b, s, dim, dtype=x, device=dev)
        rstd = torch.empty(ngroups * b * s, dtype=torch.float32, device=dev)
        w, bias = out_w, out_b
        if torch.is_autocast_enabled("cuda"):  # :881-884
            dtype = torch.get_autocast_dtype("cuda")
            normed, w = normed.to(dtype), out_w.to(dtype)
            bias = out_b.to(dtype) if out_b is not None else None
        out = F.linear(normed, w, bias)
        del xbc, da, dt, states, final, normed
        ctx.save_for_backward(zxbcdt, conv_w, conv_b, y, A, D, dt_bias, norm_w, rstd, w, bias)  # :888
        ctx.shape = shape
        ctx.dtypes = (out_w.dtype, out_b.dtype if out_b is not None else None)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        zxbcdt, conv_w, conv_b, _y, A, D, dt_bias, norm_w, _rstd, w, bias = ctx.saved_tensors
        chunk, headdim, ngroups, dstate = ctx.shape
        b, s, _ = zxbcdt.shape
        nheads = D.shape[0]
        dim, conv_dim = nheads * headdim, conv_w.shape[0]
        x, dev = zxbcdt.dtype, zxbcdt.device
        nchunks = _chunks(s, chunk)
        f32 = torch.float32
        # :915 out_recompute, :919 xBC recomputed, :928 dzxbcdt, :930 dxBC
        out_recompute = torch.empty(b, s, dim, dtype=x, device=dev)
        xbc = torch.empty(b, s, conv_dim, dtype=x, device=dev)
        dzxbcdt = torch.empty_like(zxbcdt)
        dxbc = torch.empty(b, s, conv_dim, dtype=x, device=dev)
        dlin = F.linear(dout, w.t())  # :938
        dy = torch.empty(b, s, dim, dtype=x, device=dev)  # :957 _layer_norm_bwd's input gradient
        del dlin
        # _mamba_chunk_scan_combined_bwd (:397-495)
        dt_in = torch.empty(b, s, nheads, dtype=x, device=dev)  # :440 dt.clone()
        da = torch.empty(b, nheads, nchunks, chunk, dtype=f32, device=dev)
        dt = torch.empty(b, nheads, nchunks, chunk, dtype=f32, device=dev)
        cb = torch.empty(b, nchunks, ngroups, chunk, chunk, dtype=f32, device=dev)
        states32 = torch.empty(b, nchunks, nheads, headdim, dstate, dtype=f32, device=dev)
        passed32 = torch.empty(b, nchunks, nheads, headdim, dstate, dtype=f32, device=dev)
        del states32
        dstates32 = torch.empty(b, nchunks, nheads, headdim, dstate, dtype=f32, device=dev)  # :455
        dstates = torch.empty(b, nchunks, nheads, headdim, dstate, dtype=x, device=dev)  # :461 _state_passing_bwd
        states = torch.empty(b, nchunks, nheads, headdim, dstate, dtype=x, device=dev)
        del passed32, dstates32
        ddt = torch.empty(b, nheads, nchunks, chunk, dtype=f32, device=dev)  # :479 dx, ddt
        db = torch.empty(b, s, ngroups, dstate, dtype=f32, device=dev)  # :481
        dc = torch.empty(b, s, ngroups, dstate, dtype=f32, device=dev)  # :483
        dcb = torch.empty(b, nchunks, ngroups, chunk, chunk, dtype=f32, device=dev)  # :485
        del dt_in, da, dt, cb, dstates, states, ddt, db, dc, dcb
        need = ctx.needs_input_grad
        grads: list[Any] = [dzxbcdt if need[0] else None]
        # :970 causal_conv1d_bwd: the input gradient, then the weights'
        dconv_in = torch.empty(b, s, conv_dim, dtype=x, device=dev)
        for i, t in enumerate((conv_w, conv_b, dt_bias, A, D, norm_w), start=1):
            grads.append(torch.empty_like(t) if need[i] and t is not None else None)
        del dconv_in, out_recompute, xbc, dxbc, dy
        w_dtype, b_dtype = ctx.dtypes
        grads.append(torch.empty(w.shape, dtype=w_dtype, device=dev) if need[7] else None)  # :965 einsum
        grads.append(torch.empty(bias.shape, dtype=b_dtype, device=dev) if need[8] and bias is not None else None)
        return (*grads, None)


def fused_scan(
    zxbcdt: Any,
    conv1d_weight: Any,
    conv1d_bias: Any,
    dt_bias: Any,
    A: Any,
    D: Any,
    chunk_size: int,
    *args: Any,
    rmsnorm_weight: Any = None,
    outproj_weight: Any = None,
    outproj_bias: Any = None,
    headdim: int | None = None,
    ngroups: int = 1,
    **kwargs: Any,
) -> Any:
    """``mamba_split_conv1d_scan_combined`` as transformers calls it; None (the PyTorch path) when the call is not
    the one the stand-in models (no norm or out_proj weight, a 4-bit out_proj)."""
    if rmsnorm_weight is None or outproj_weight is None or not outproj_weight.is_floating_point() or headdim is None:
        return None
    from cabe.trace import state

    with contextlib.suppress(IndexError):  # (outside a trace: no state to note it in)
        state.current().note(KERNEL)
    dim = D.shape[0] * headdim
    dstate = (conv1d_weight.shape[0] - dim) // ngroups // 2
    return _FusedScan.apply(
        zxbcdt,
        conv1d_weight,
        conv1d_bias,
        dt_bias,
        A,
        D,
        rmsnorm_weight,
        outproj_weight,
        outproj_bias,
        (chunk_size, headdim, ngroups, dstate),
    )


#: set (to anything) to trace transformers' PyTorch fallback instead, as a machine without mamba-ssm runs it (an
#: environment variable, so that the trace worker's process sees it too)
FALLBACK_ENV = "CABE_TRACE_MAMBA2_FALLBACK"


def install(p: Any, family: str | None = None) -> None:
    """Route the fused call of ``family``'s Mamba-2 modeling module to the stand-in (``p``: the trace's patch set);
    without ``family``, of every known module that has it. A traced family whose module lacks the call refuses
    (``trace_unsupported_transformers``): transformers 4.57.6 calls mamba-ssm's ``mamba_split_conv1d_scan_combined``
    only when the package is installed (models/granitemoehybrid/modeling_granitemoehybrid.py:44-50, 374, 459), so
    its trace would run the PyTorch fallback in silence; ``CABE_TRACE_MAMBA2_FALLBACK=1`` asks for that fallback."""
    if os.environ.get(FALLBACK_ENV):
        return
    from cabe.trace import compat

    for name in MODULES:
        if family is not None:
            if name.rsplit(".", 2)[-2] == family:
                mod = compat.module(name.removeprefix("transformers."), family)
                compat.require(mod, NAME, family)
                p.set(mod, NAME, fused_scan)
            continue
        try:
            mod = sys.modules.get(name) or importlib.import_module(name)
        except ImportError:  # an older transformers without this model
            continue
        if hasattr(mod, NAME):
            p.set(mod, NAME, fused_scan)
