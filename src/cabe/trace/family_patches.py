"""The patches one model family needs, applied only when that family is traced.

Each entry of :data:`FAMILIES` (a ``model_type`` of the traced config or of one of its sub-configs) installs the
patches of its family on the trace's patch set, fetching every private name through :func:`cabe.trace.compat.require`:
a release without one refuses that family (``trace_unsupported_transformers``) and no other. Before issue 29 these
patches ran on every trace, and transformers 5.25's Falcon (no ``FalconAttention._split_heads``) failed every model.

* ``falcon``: :func:`_falcon` (the multi-query split and Falcon's own flash class, transformers before 5.25);
* ``granitemoehybrid``: :mod:`cabe.trace.ssm` (mamba-ssm's fused Mamba-2 kernel);
* ``qwen3_next``, ``qwen3_5``, ``qwen3_5_moe``: :mod:`cabe.trace.linear_attention` (fla's and causal-conv1d's
  kernels);
* ``qwen3_vl``, ``qwen3_vl_moe``: the DeepStack step of a step with images (:mod:`cabe.trace.vision`, applied there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cabe.trace import compat


def model_types(config: Any) -> tuple[str, ...]:
    """The ``model_type`` of a config dict and of its sub-configs (``text_config``, ``vision_config``), with a
    ``_text`` suffix dropped (Qwen3-VL's text model is patched as ``qwen3_vl``)."""
    out: list[str] = []
    if not isinstance(config, dict):
        return ()
    for c in (config, *(v for v in config.values() if isinstance(v, dict))):
        mt = c.get("model_type")
        if isinstance(mt, str):
            mt = mt.removesuffix("_text")
            if mt not in out:
                out.append(mt)
    return tuple(out)


# ---- Falcon -------------------------------------------------------------------------------------------------------
def _falcon(p: Any, kind: str) -> None:
    """transformers 5.25 rewrote ``FalconAttention.forward``: q, k and v are views of the fused projection
    (``fused_qkv.split([num_heads, 1, 1], dim=-2)`` for multi-query, transformers 5.25
    models/falcon/modeling_falcon.py:297-306) and every kernel goes through ``ALL_ATTENTION_FUNCTIONS`` (:320-331; eager is
    the generic one, with ``repeat_kv``, :212-223),
    ``cabe_fa2`` included; ``_split_heads``, ``FalconFlashAttention2`` and ``FALCON_ATTENTION_CLASSES`` are gone.
    Before it (4.57.6 modeling_falcon.py:229-262, 420-550; 5.24 :414-547) both patches below are needed."""
    if compat.transformers_at_least("5.25"):
        return
    mf = compat.module("models.falcon.modeling_falcon", "falcon")
    _falcon_split_heads(p, mf)
    _falcon_flash(p, mf)


def _falcon_split_heads(p: Any, mf: Any) -> None:
    """Falcon's multi-query ``_split_heads`` indexes with Python lists (``fused_qkv[..., [-2], :]``).

    PyTorch turns such a list into an index tensor in C++, below the Python dispatch key, so it
    is created as a real CUDA tensor and fails on a CPU-only build. ``index_select`` with an
    index made by ``torch.arange`` (a factory op the fake mode intercepts) makes the same copies.
    """
    original = compat.require(mf, "FalconAttention._split_heads", "falcon")

    def split_heads(self: Any, fused_qkv: Any) -> Any:
        if self.new_decoder_architecture or not self.multi_query:
            return original(self, fused_qkv)
        import torch

        b, s, _ = fused_qkv.shape
        fused_qkv = fused_qkv.view(b, s, self.num_heads + 2, self.head_dim)
        n = self.num_heads + 2
        k_idx = torch.arange(n - 2, n - 1, device=fused_qkv.device)
        v_idx = torch.arange(n - 1, n, device=fused_qkv.device)
        return (
            fused_qkv[..., :-2, :],
            torch.index_select(fused_qkv, 2, k_idx),
            torch.index_select(fused_qkv, 2, v_idx),
        )

    p.set(mf.FalconAttention, "_split_heads", split_heads)


def _falcon_flash(p: Any, mf: Any) -> None:
    """Falcon does not go through transformers' attention interface before 5.25: ``FalconDecoderLayer`` picks its
    attention class from ``FALCON_ATTENTION_CLASSES[config._attn_implementation]`` unless
    ``is_flash_attention_requested`` (a name containing "flash"), and ``FalconFlashAttention2.forward`` calls the
    module's own ``_flash_attention_forward`` (transformers 5.24 models/falcon/modeling_falcon.py:414-547; 4.57.6
    :420-558), imported only when the flash-attn package is there. The trace's ``cabe_fa2`` therefore gets Falcon's
    own flash class, whose forward (the 16-bit casts of fp32 inputs, the (b, s, h, d) transposes) runs as written,
    and its kernel call reaches ``aten._flash_attention_forward``, the same FlashAttention-2 code
    :func:`cabe.trace.attention.flash_attention_forward` uses (no mask: causal)."""
    from cabe.trace.attention import flash_kernel

    classes = dict(compat.require(mf, "FALCON_ATTENTION_CLASSES", "falcon"))
    flash_class = compat.require(mf, "FalconFlashAttention2", "falcon")

    def flash_forward(
        query_states: Any,
        key_states: Any,
        value_states: Any,
        attention_mask: Any,
        query_length: int,
        is_causal: bool,
        dropout: float = 0.0,
        softmax_scale: float | None = None,
        **kwargs: Any,
    ) -> Any:
        return flash_kernel(query_states, key_states, value_states, float(dropout), bool(is_causal), softmax_scale)

    classes["cabe_fa2"] = flash_class
    p.set(mf, "FALCON_ATTENTION_CLASSES", classes)
    p.set(mf, "_flash_attention_forward", flash_forward)
    p.set(mf, "flash_attn_supports_top_left_mask", lambda: False)  # flash-attn >= 2.1: bottom-right causal mask


# ---- the fused kernels of hybrid layers (simulations only) --------------------------------------------------------
def _mamba2(p: Any, kind: str) -> None:
    if kind in ("fake", "meta"):
        from cabe.trace import ssm

        ssm.install(p, family="granitemoehybrid")  # mamba-ssm's fused Mamba-2 kernel, as a GPU with the package runs it


def _gated_deltanet(family: str) -> Callable[[Any, str], None]:
    def install(p: Any, kind: str) -> None:
        if kind in ("fake", "meta"):
            from cabe.trace import linear_attention

            # flash-linear-attention's and causal-conv1d's allocations, not the PyTorch fallback
            linear_attention.patch(p, family=family)

    return install


#: model_type -> installer(patch set, trace kind)
FAMILIES: dict[str, Callable[[Any, str], None]] = {
    "falcon": _falcon,
    "granitemoehybrid": _mamba2,
    "qwen3_next": _gated_deltanet("qwen3_next"),
    "qwen3_5": _gated_deltanet("qwen3_5"),
    "qwen3_5_moe": _gated_deltanet("qwen3_5_moe"),
}


def install(p: Any, kind: str, types: tuple[str, ...]) -> None:
    """The patches of the traced families (``types``: :func:`model_types` of the config)."""
    for mt in types:
        installer = FAMILIES.get(mt)
        if installer is not None:
            installer(p, kind)
