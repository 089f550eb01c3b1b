"""The CUDA kernels of gated DeltaNet layers, as the trace runs them on fake CUDA tensors.

transformers 5.24 calls ``chunk_gated_delta_rule`` and ``causal_conv1d_fn`` through
``use_kernel_func_from_hub_with_fallback`` (integrations/hub_kernels.py): flash-linear-attention (``fla``) and
``causal_conv1d`` when they are installed — what users training on GPUs run —, else a PyTorch fallback
(``torch_chunk_gated_delta_rule``: fp32 chunked tensors, a 64 × 64 decay matrix per chunk, the recurrent state
saved once per chunk). Neither package runs on a CPU, so the trace replaces the two functions with autograd
functions that allocate, save and free what the kernels' Python wrappers do, tensor by tensor (the Triton / CUDA
kernels themselves only write into those tensors):

* fla-org/flash-linear-attention @ bc3b101 ``fla/ops/gated_delta_rule/chunk.py``: ``ChunkGatedDeltaRuleFunction``
  (forward :258-335, ``save_for_backward`` :310: the l2-normalised q and k with their fp32 rstd, v, the chunk-local
  cumsum of g in fp32, beta and the solved ``A`` (B, T, HV, 64) in k's dtype); ``chunk_gated_delta_rule_fwd``
  :33-123 (``w``, ``u``, ``h`` (B, NT, HV, V, K), ``v_new``, ``o``); ``chunk_gated_delta_rule_bwd`` :126-251
  (recomputes w, u, h, v_new; dv, dh, dq, dk, dw, dg, then ``prepare_wy_repr_bwd``'s dk, dv, db, dg);
  ``fla/utils/_decorators.py`` :97 ``input_guard`` (contiguous copies of strided inputs);
  ``fla/modules/l2norm.py`` :151-168 (``l2norm_fwd``: y like x, fp32 rstd per row);
  ``fla/ops/common/chunk_o.py`` :700-760 (``chunk_bwd_dqkwg``: dq, dk over HV heads summed to H, dg of NK
  K-blocks, NK = ceil(K / 128) on Hopper's shared memory); ``fla/ops/common/chunk_delta_h.py`` :687-780;
  ``fla/ops/gated_delta_rule/wy_fast.py`` :255-350.
* Dao-AILab/causal-conv1d ``causal_conv1d/causal_conv1d_interface.py`` (``CausalConv1dFn``): saves x (made
  contiguous) and the weight, returns the activated output in one kernel; backward makes dx and dweight.

:func:`patch` installs them for one trace (``CABE_TRACE_GDN_FALLBACK=1`` keeps transformers' PyTorch fallback, to
compare the two).
"""

from __future__ import annotations

import os
from typing import Any

#: fla's chunk size (``chunk_gated_delta_rule(chunk_size=64)``)
CHUNK = 64
#: ``chunk_bwd_dqkwg``'s K tile on Hopper (``check_shared_mem('hopper')``: CONST_TILING = 128)
K_TILE = 128


def _gdn_function() -> Any:
    import torch

    class ChunkGatedDeltaRule(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, g: Any, beta: Any, l2: bool, final: bool) -> Any:
            q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))  # input_guard
            b, t, hk, dk = k.shape
            hv, dv = v.shape[-2:]
            nt = -(-t // CHUNK)
            q_rstd = k_rstd = None
            if l2:  # l2norm_fwd: y like x, an fp32 rstd per row
                q, q_rstd = torch.empty_like(q), q.new_empty(b * t * hk, dtype=torch.float32)
                k, k_rstd = torch.empty_like(k), k.new_empty(b * t * hk, dtype=torch.float32)
            g = torch.empty_like(g, dtype=torch.float32)  # chunk_local_cumsum(output_dtype=float)
            a = torch.zeros(b, t, hv, CHUNK, dtype=k.dtype, device=k.device)
            w, u = k.new_empty(b, t, hv, dk), torch.empty_like(v)  # recompute_w_u_fwd
            h, v_new = k.new_empty(b, nt, hv, dv, dk), torch.empty_like(u)  # chunk_gated_delta_rule_fwd_h
            state = k.new_zeros(b, hv, dv, dk, dtype=torch.float32) if final else None
            o = torch.empty_like(v)  # chunk_fwd_o
            del w, u, h, v_new
            ctx.save_for_backward(q, q_rstd, k, k_rstd, v, g, beta, a)
            ctx.l2 = l2
            ctx.mark_non_differentiable(*(x for x in (state,) if x is not None))
            return o, state

        @staticmethod
        def backward(ctx: Any, do: Any, dht: Any) -> Any:
            q, _q_rstd, k, _k_rstd, v, g, beta, _a = ctx.saved_tensors
            do = do.contiguous()
            b, t, hk, dk = k.shape
            hv, dv_ = v.shape[-2:]
            nt = -(-t // CHUNK)
            w, u = k.new_empty(b, t, hv, dk), torch.empty_like(v)  # recompute_w_u_fwd
            h, v_new = k.new_empty(b, nt, hv, dv_, dk), torch.empty_like(u)  # chunk_gated_delta_rule_fwd_h
            dv = torch.empty_like(do)  # chunk_bwd_dv_local
            dh, dv2 = q.new_empty(b, nt, hv, dv_, dk), torch.empty_like(dv)  # chunk_gated_delta_rule_bwd_dhu
            dv = dv2
            nk = -(-dk // K_TILE)
            dq, dkk = q.new_empty(b, t, hv, dk), k.new_empty(b, t, hv, dk)  # chunk_bwd_dqkwg
            dg = torch.empty(nk, *g.shape, dtype=torch.float32, device=g.device)
            dw = torch.empty_like(w)
            if hk != hv:
                dq = dq.view(b, t, hk, hv // hk, dk).sum(3)
                dkk = dkk.view(b, t, hk, hv // hk, dk).sum(3)
            dg = dg.sum(0)
            dk2, dv3 = k.new_empty(b, t, hv, dk), torch.empty_like(v)  # prepare_wy_repr_bwd
            dg2, db = torch.empty_like(g), torch.empty_like(beta)
            if hk != hv:
                dk2 = dk2.view(b, t, hk, hv // hk, dk).sum(3)
            dkk.add_(dk2)
            dg.add_(dg2)
            del w, u, h, v_new, dh, dv, dk2, dg2, dw
            dg = torch.empty_like(dg)  # chunk_local_cumsum(reverse=True)
            if ctx.l2:  # l2norm_bwd: dx like x
                dq, dkk = torch.empty_like(q), torch.empty_like(k)
            return dq, dkk, dv3, dg, db, None, None

    return ChunkGatedDeltaRule


def _conv_function() -> Any:
    import torch

    class CausalConv1d(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, weight: Any) -> Any:
            x = x.contiguous() if x.stride(2) != 1 and x.stride(1) != 1 else x
            ctx.save_for_backward(x, weight)
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx: Any, dout: Any) -> Any:
            x, weight = ctx.saved_tensors
            return torch.empty_like(x), torch.empty_like(weight)

    return CausalConv1d


#: model_type -> its modeling module (under transformers.models)
MODULES = {
    "qwen3_next": "qwen3_next.modeling_qwen3_next",
    "qwen3_5": "qwen3_5.modeling_qwen3_5",
    "qwen3_5_moe": "qwen3_5_moe.modeling_qwen3_5_moe",
}


def patch(p: Any, family: str | None = None) -> None:
    """Replace the gated DeltaNet kernels' PyTorch fallbacks in ``family``'s modeling module (refused, as
    ``trace_unsupported_transformers``, when the module lacks one of the two names), or without ``family`` in
    every installed module that has them.

    The module-level names are what both lines read: transformers 5.24 / 5.25 call them at each forward
    (models/qwen3_next/modeling_qwen3_next.py, 5.25 :409 and :801), 4.57.6 binds them when the layer is built
    (``self.causal_conv1d_fn = causal_conv1d_fn``, ``chunk_gated_delta_rule or torch_chunk_gated_delta_rule``,
    modeling_qwen3_next.py:619-621), which the trace does inside its patches. 4.57.6 passes the conv input as
    ``x=`` (:707-713), 5.x positionally."""
    if os.environ.get("CABE_TRACE_GDN_FALLBACK") == "1":
        return
    import importlib

    from cabe.trace import compat

    gdn, conv = _gdn_function(), _conv_function()

    def chunk_gated_delta_rule(query: Any, key: Any, value: Any, g: Any, beta: Any, **kw: Any) -> Any:
        return gdn.apply(
            query, key, value, g, beta, bool(kw.get("use_qk_l2norm_in_kernel")), bool(kw.get("output_final_state"))
        )

    def causal_conv1d_fn(
        hidden_states: Any = None, weight: Any = None, bias: Any = None, activation: Any = None, **kw: Any
    ) -> Any:
        x = hidden_states if hidden_states is not None else kw.get("x")
        return conv.apply(x, weight)

    names = ("torch_chunk_gated_delta_rule", "causal_conv1d_fn")
    if family is not None:
        mod = compat.module("models." + MODULES[family], family)
        for n in names:
            compat.require(mod, n, family)
        p.set(mod, names[0], chunk_gated_delta_rule)
        p.set(mod, names[1], causal_conv1d_fn)
        return
    for name in MODULES.values():
        try:
            mod = importlib.import_module(f"transformers.models.{name}")
        except ImportError:
            continue
        if hasattr(mod, names[0]):
            p.set(mod, names[0], chunk_gated_delta_rule)
        if hasattr(mod, names[1]):
            p.set(mod, names[1], causal_conv1d_fn)
