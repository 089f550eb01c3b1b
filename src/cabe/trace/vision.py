"""Images in a traced step: the fake ``pixel_values`` and ``image_grid_thw`` a Qwen2.5-VL model reads, and what
the fake-tensor simulation needs so that the vision tower's data-dependent bookkeeping runs.

The tower computes its window order and cumulative lengths from ``image_grid_thw`` with ``.tolist()`` and boolean
indexing (transformers 5.24 vision_utils.py:43-190), and SDPA splits q, k, v by those lengths
(modeling_qwen2_5_vl.py:316-319): values fake tensors do not have. transformers takes them precomputed
(``image_cu_seqlens``, ``image_window_index``... through ``accepts_precomputed_kwargs``, utils/generic.py:1052), so
they are computed here with transformers' own functions on real CPU tensors, outside the simulation, and fed to
the model as fake CUDA tensors that carry their values (FakeTensor constants; their size limit,
``CONSTANT_NUMEL_LIMIT``, is raised while the step runs so that the small integer tensors derived from them keep
their values). The placeholder-count check (``torch_compilable_check``, which reads a sum of the fake input ids)
is switched off with transformers' own switch, ``TRANSFORMERS_DISABLE_TORCH_CHECK``. Positions: the 3-D rotary
positions of ``get_rope_index`` need the processor's ``mm_token_type_ids``; without them transformers uses text
positions, which allocate the same (3, batch, seq) tensor. None of this changes what the step allocates on the
GPU beyond these few integer tensors.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from cabe.training import TrainingSetup


def _vision_config(cfg: Any) -> Any:
    return getattr(cfg, "vision_config", None)


def wants_images(cfg: Any, setup: TrainingSetup) -> bool:
    return setup.images > 0 and _vision_config(cfg) is not None and hasattr(cfg, "image_token_id")


def _learned_positions(cfg: Any) -> bool:
    """A Qwen3-VL-style tower (learned positions, no windows): Qwen3-VL's, and Qwen3.5's
    (``Qwen3_5VisionConfig`` has ``num_position_embeddings`` and no ``deepstack_visual_indexes``)."""
    return getattr(_vision_config(cfg), "num_position_embeddings", None) is not None


def _grid(cfg: Any, setup: TrainingSetup) -> tuple[int, int, int]:
    """(grid_t, grid_h, grid_w) of one image, by the processor's resize (cabe.vision.images.resized)."""
    from cabe import families
    from cabe.vision.images import image_grid

    spec = families.from_config(cfg.to_dict())
    if spec.vision is None:
        raise ValueError("no vision tower")
    g = image_grid(spec.vision, setup.image_size)
    return 1, g.grid_h, g.grid_w


def image_inputs(cfg: Any, setup: TrainingSetup, device: Any, ids: Any) -> dict[str, Any]:
    """The model's image keywords for one micro-batch (``setup.images`` images in each of ``setup.batch``
    sequences); writes the image tokens at the start of each row of ``ids``. Empty without images."""
    if not wants_images(cfg, setup):
        return {}
    if getattr(cfg, "mm_tokens_per_image", None) is not None:  # Gemma 3: fixed-size images, no grid
        return _fixed_size_inputs(cfg, setup, device, ids)
    if getattr(_vision_config(cfg), "deepstack_visual_indexes", None) is not None or _learned_positions(cfg):
        return _qwen3_vl_inputs(cfg, setup, device, ids)
    import torch
    from torch.utils._python_dispatch import _disable_current_modes
    from transformers import vision_utils as vu

    vc = _vision_config(cfg)
    t, gh, gw = _grid(cfg, setup)
    n = setup.batch * setup.images
    merge = vc.spatial_merge_size
    with _disable_current_modes():  # real CPU tensors: transformers' own precomputation
        grid = torch.tensor([[t, gh, gw]] * n)
        window_index, cu_window = vu.get_vision_window_index(grid, merge, vc.window_size, vc.patch_size)
        cu_seqlens = vu.get_vision_cu_seqlens(grid)
        position_ids = vu.get_vision_position_ids(grid, merge)
        lists = {
            "grid": grid.tolist(),
            "window_index": window_index.tolist(),
            "cu_window": cu_window.tolist(),
            "cu_seqlens": cu_seqlens.tolist(),
            "position_ids": position_ids.tolist(),
        }
        max_window = int((cu_window[1:] - cu_window[:-1]).max())
        max_full = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    per_image = gh * gw // merge**2
    ids[:, : setup.images * per_image] = cfg.image_token_id
    patch = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    flash = setup.attention == "flash"
    return {
        # the processor's output is fp32 (normalised pixels); the model casts it to the tower's dtype
        "pixel_values": torch.randn(n * t * gh * gw, patch, device=device),
        # host tensors whose values the fake mode keeps (only their values are read: split sizes, lengths)
        "image_grid_thw": torch.tensor(lists["grid"]),
        "image_cu_window_seqlens": torch.tensor(lists["cu_window"], dtype=torch.int32),
        "image_cu_seqlens": torch.tensor(lists["cu_seqlens"], dtype=torch.int32),
        "image_window_index": torch.tensor(lists["window_index"], device=device),
        "image_position_ids": torch.tensor(lists["position_ids"], device=device),
        **({"image_max_seqlen": max_full, "image_max_window_seqlen": max_window} if flash else {}),
    }


@contextlib.contextmanager
def simulated(active: bool, types: tuple[str, ...] | None = None) -> Iterator[None]:
    """While a step with images runs: FakeTensor constants up to 16M elements, transformers' tensor checks off, and
    the DeepStack step of Qwen3-VL (``types``: the traced config's model types) made static."""
    if not active:
        yield
        return
    import torch._subclasses.fake_tensor as ft

    limit, check = ft.CONSTANT_NUMEL_LIMIT, os.environ.get("TRANSFORMERS_DISABLE_TORCH_CHECK")
    ft.CONSTANT_NUMEL_LIMIT = 1 << 24
    os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = "1"
    deepstack = _static_deepstack(types)
    try:
        yield
    finally:
        deepstack()
        ft.CONSTANT_NUMEL_LIMIT = limit
        if check is None:
            os.environ.pop("TRANSFORMERS_DISABLE_TORCH_CHECK", None)
        else:
            os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = check


def _fixed_size_inputs(cfg: Any, setup: TrainingSetup, device: Any, ids: Any) -> dict[str, Any]:
    """Gemma 3's image keywords: what ``Gemma3Processor`` returns (transformers 5.24 processing_gemma3.py). The
    image processor resizes every image to the tower's ``image_size`` square (image_processing_gemma3.py, no
    pan-and-scan by default): ``pixel_values`` (images, channels, side, side) fp32; each image becomes
    ``mm_tokens_per_image`` image tokens in the text, and ``token_type_ids`` (the processor's
    ``mm_token_type_ids``, ``return_mm_token_type_ids = True``) mark them 1, which makes ``Gemma3Model.forward``
    build the bidirectional-over-images masks (modeling_gemma3.py:867-881) as a collator passing the processor's
    output does. Images sit one after another at the start of each row (the processor writes
    ``\\n\\n<boi>...<eoi>\\n\\n`` around each, making each image its own block of the mask; adjacent images here
    are one block: the same boolean masks, the same allocations)."""
    import torch

    vc = _vision_config(cfg)
    side, per_image = int(vc.image_size), int(cfg.mm_tokens_per_image)
    n = setup.batch * setup.images
    token = int(cfg.image_token_id)
    types = torch.zeros_like(ids)
    ids[:, : setup.images * per_image] = token
    types[:, : setup.images * per_image] = 1
    return {
        "pixel_values": torch.randn(n, int(vc.num_channels), side, side, device=device),
        "token_type_ids": types,
    }


def _qwen3_vl_inputs(cfg: Any, setup: TrainingSetup, device: Any, ids: Any) -> dict[str, Any]:
    """Qwen3-VL's image keywords: ``pixel_values`` and ``image_grid_thw`` as Qwen2.5-VL's, and the tower's
    data-dependent bookkeeping precomputed with transformers' own functions (vision_utils.py, 5.24): the
    cumulative lengths per image, the 2-D rotary positions and the bilinear resampling of the learned positions
    (``get_vision_interpolation_indices_and_weights``), fed as ``image_*`` keywords
    (``accepts_precomputed_kwargs`` strips the prefix)."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes
    from transformers import vision_utils as vu

    vc = _vision_config(cfg)
    t, gh, gw = _grid(cfg, setup)
    n = setup.batch * setup.images
    merge = vc.spatial_merge_size
    with _disable_current_modes():  # real CPU tensors: transformers' own precomputation
        grid = torch.tensor([[t, gh, gw]] * n)
        cu_seqlens = vu.get_vision_cu_seqlens(grid)
        position_ids = vu.get_vision_position_ids(grid, merge)
        indices, weights = vu.get_vision_interpolation_indices_and_weights(
            grid, int(vc.num_position_embeddings**0.5), mode="bilinear", align_corners=True, spatial_merge_size=merge
        )
        lists = {"grid": grid.tolist(), "cu": cu_seqlens.tolist(), "pos": position_ids.tolist()}
        idx, wts = indices.tolist(), weights.tolist()
        max_len = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    per_image = gh * gw // merge**2
    ids[:, : setup.images * per_image] = cfg.image_token_id
    patch = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    # the 3-D rotary positions: get_rope_index reads the token types' values (data-dependent), so the step gets
    # positions as a (3, batch, seq) tensor, the same allocation (text positions on the three axes)
    rows, row = ids.shape
    positions = torch.arange(row, device=device).view(1, 1, row).expand(3, rows, row)
    return {
        "pixel_values": torch.randn(n * t * gh * gw, patch, device=device),
        "position_ids": positions,
        "image_grid_thw": torch.tensor(lists["grid"]),
        "image_cu_seqlens": torch.tensor(lists["cu"], dtype=torch.int32),
        "image_position_ids": torch.tensor(lists["pos"], device=device),
        "image_interp_indices": torch.tensor(idx, device=device),
        "image_interp_weights": torch.tensor(wts, device=device),
        **({"image_max_seqlen": max_len} if setup.attention == "flash" else {}),
    }


def _static_deepstack(types: tuple[str, ...] | None = None) -> Any:
    """Qwen3-VL's DeepStack step (transformers 5.24 ``Qwen3VLTextModel._deepstack_process``,
    modeling_qwen3_vl.py:841-850, and Qwen3-VL-MoE's, the same lines at modeling_qwen3_vl_moe.py:960-968) indexes
    the hidden states with the image tokens' boolean mask, whose
    ``nonzero`` has a data-dependent shape the fake mode cannot give. The image tokens are the first of each row
    here (:func:`_qwen3_vl_inputs`), so the same step is run on that slice: the same clone of the hidden states,
    the same sum, written back in place. What differs: the gathered copy of the image tokens' rows (a transient the
    sum replaces at once) and the int64 indices the two index nodes save (16 bytes per image token and layer).
    Only the traced family's class is patched (``types``: the config's model types, cabe.trace.family_patches);
    one without ``_deepstack_process`` refuses that family (``trace_unsupported_transformers``). Without ``types``,
    every class this transformers has.
    Returns the function that restores transformers' own."""
    from cabe.trace import compat

    owns = []
    for family, module, name in (("qwen3_vl", "qwen3_vl.modeling_qwen3_vl", "Qwen3VLTextModel"), _QWEN3_VL_MOE_TEXT):
        if types is None:
            cls = getattr(sys.modules.get("transformers.models." + module), name, None)
            if cls is not None and hasattr(cls, "_deepstack_process"):
                owns.append((cls, cls._deepstack_process))
        elif family in types:
            cls = compat.require(compat.module("models." + module, family), name, family)
            owns.append((cls, compat.require(cls, "_deepstack_process", family)))

    def static(self: Any, hidden_states: Any, visual_pos_masks: Any, visual_embeds: Any) -> Any:
        visual_embeds = visual_embeds.to(hidden_states.device, hidden_states.dtype)
        rows = hidden_states.shape[0]
        k = visual_embeds.shape[0] // rows
        hidden_states = hidden_states.clone()
        local_this = hidden_states[:, :k, :] + visual_embeds.view(rows, k, -1)
        hidden_states[:, :k, :] = local_this
        return hidden_states

    for cls, _ in owns:
        setattr(cls, "_deepstack_process", static)  # noqa: B010 (mypy: no method assignment)

    def restore() -> None:
        for cls, own in owns:
            setattr(cls, "_deepstack_process", own)  # noqa: B010

    return restore


#: Qwen3-VL-MoE's text model, whose DeepStack step is Qwen3-VL's (:func:`_static_deepstack`)
_QWEN3_VL_MOE_TEXT = ("qwen3_vl_moe", "qwen3_vl_moe.modeling_qwen3_vl_moe", "Qwen3VLMoeTextModel")
