"""Rank 0 of a tensor-parallel replica running a prompt's forward (prefill) with a KV cache, traced in one process:
transformers' own tensor parallelism (the model's ``tp_plan`` on DTensor, as ``from_pretrained(tp_plan="auto")``
applies it; :func:`cabe.trace.distributed._tensor_parallel`) on PyTorch's fake process group, the logits gathered
whole (``colwise_gather_output``, as vLLM's ``LogitsProcessor`` gathers them), a ``DynamicCache`` filled under
``torch.no_grad()``. The check of :mod:`cabe.serving_parallel`'s per-rank weights, KV heads and working memory.

Kept small on purpose: a plain forward, no ``generate`` (its tracing lives in :mod:`cabe.trace.generate`).
"""

from __future__ import annotations

import inspect
from typing import Any

from cabe.errors import ConfigError
from cabe.training import TrainingSetup


def trace_prefill(
    config: dict[str, Any],
    *,
    tp: int,
    context: int,
    batch: int = 1,
    dtype: str = "bf16",
    attention: str = "sdpa",
    kind: str = "fake",
) -> dict[str, int]:
    """Rank 0's ``weights_bytes``, ``kv_bytes`` (its cache's keys and values), ``logits_bytes`` (the last position's,
    gathered) and ``peak_bytes`` (allocated, the weights included) over one no-grad forward of ``batch`` prompts of
    ``context`` tokens on ``tp`` GPUs (``kind``: ``fake`` tensors on the fake CUDA device, or real ``cpu`` ones)."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import DynamicCache

    from cabe.trace import distributed, state
    from cabe.trace.build import build_model
    from cabe.trace.family_patches import model_types
    from cabe.trace.modes import fake_mode, tracker
    from cabe.trace.patches import trace_environment
    from cabe.trace.state import AttentionState
    from cabe.trace.streams import streams

    setup = TrainingSetup(  # (the setup's checks take the literal values: a bad dtype or kernel is a typed error)
        batch=batch,
        seq=context,
        dtype=dtype,  # type: ignore[arg-type]
        autocast="none",
        attention=attention,  # type: ignore[arg-type]
        gpus=tp,
        tp=tp,
        loss_parallel=False,  # the lm_head's logits gathered whole on every rank
        optimizer_impl="for-loop",
    )
    if tp > 1:
        distributed._tp_refusal(config, tp)  # a TP plan that cuts whole heads
    if dist.is_initialized():
        raise ConfigError("mode_unsupported", "mode", mode=kind, why="process_group")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=tp)
    device = torch.device("cuda" if kind == "fake" else "cpu")
    try:
        with (
            state.active(AttentionState(device)) as astate,
            trace_environment(kind, setup, model_types(config)),
            streams(kind),
        ):
            model, cfg = build_model(config, setup, [])
            model.eval()
            for p in model.parameters():
                p.requires_grad_(False)
            if tp > 1:
                from torch.distributed.device_mesh import init_device_mesh

                mesh = init_device_mesh(device.type, (tp,), mesh_dim_names=("tp",))
                distributed._tensor_parallel(model, mesh["tp"], setup)
            rank0 = tracker(setup, kind, device, astate, None)
            rank0.local = distributed._local  # a DTensor counted by its local shard
            with fake_mode(kind), rank0, distributed._real_mesh_coordinates():
                rank0.set_phase("setup")
                model.to_empty(device=device)
                weights = rank0.live_bytes
                ids = torch.randint(0, cfg.get_text_config().vocab_size, (batch, context), device=device)
                rank0.set_phase("forward")
                cache = DynamicCache(config=cfg)
                # transformers 5.25 names the argument ``cache`` (``past_key_values`` deprecated), earlier ones not
                name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
                with torch.no_grad():
                    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{name: cache})
                kv = sum(
                    distributed._local(t).untyped_storage().nbytes()
                    for layer in cache.layers
                    for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                    if t is not None
                )
                logits = out.logits.untyped_storage().nbytes()
                peak = max(rank0.curve())
    finally:
        dist.destroy_process_group()
    return {"weights_bytes": weights, "kv_bytes": kv, "logits_bytes": logits, "peak_bytes": peak}
