"""transformers' ``generate`` run on fake CUDA tensors: the prefill of the prompt, then the decode steps, every
allocation recorded as the caching allocator sees it (``cabe infer --trace``).

The run is the real thing: the model transformers builds from the config (:func:`cabe.trace.build.build_model`,
``eval()``), materialised on the fake device in the weights' dtype, then ``model.generate(input_ids,
attention_mask, max_new_tokens=new_tokens, do_sample=False)`` -- under ``torch.no_grad`` as ``generate`` is
decorated (transformers 5.25 generation/utils.py:2586), with the cache transformers builds for the config
(``DynamicCache``, or ``StaticCache`` with ``cache="static"``; their sliding-window layers where the config has
``layer_types`` / ``sliding_window``: cache_utils.py), ``logits_to_keep=1`` (utils.py:2958-2959) and the fp32 copy
of the last position's logits (utils.py:3251), and ``prefill_chunk_size`` when a chunk is asked (utils.py:4339-4420).
SDPA runs through the CUDA backend choice of :mod:`cabe.trace.attention`.

What fake tensors cannot decide is told from what the trace knows of its own batch (no padding, every sequence
the same length):

* ``StopCheck`` reads ``unfinished_sequences.max() == 0`` on the host (utils.py:397): the same op runs, and the
  loop stops when the sequences reach ``prompt + new_tokens`` (no EOS: ``eos_token_id=None``), as
  ``MaxLengthCriteria`` would;
* ``masking_utils._ignore_causal_mask_sdpa`` reads the padding mask and the cache offset (masking_utils.py:252-303,
  so that SDPA gets ``is_causal`` and no mask where it can); it skips the read for fake tensors (``is_tracing``),
  which would build a mask CUDA never builds: here it runs on host tensors of the values the batch has (ones over
  the tokens seen so far, zeros over a static cache's empty slots) and the offset the trace counted.

What cannot run on fake tensors is refused in one sentence (:func:`check`): a quantized weight format (its kernels
are CUDA-only), a KV dtype other than the weights' (transformers' caches store keys and values in the dtype the
layer computes them in), images in the prompt.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from cabe.errors import CabeError, ConfigError, trace_failed

#: the weight formats a fake-tensor ``generate`` runs: the plain dtypes (cabe.weights.PLAIN)
TRACE_FORMATS = ("fp32", "fp16", "bf16")
#: the caches ``generate`` builds (``cache_implementation``): dynamic (DynamicCache, torch.cat per step) or static
#: (StaticCache, preallocated to the whole length); sliding-window and hybrid layers follow from the config
CACHES = ("dynamic", "static")
#: the component of every allocation at the peak
COMPONENTS = ("weights", "kv_cache", "activations", "logits", "cuda_workspaces")
#: the largest allocations live at the peak the result lists (the weights and workspaces apart)
TOP = 24


def check(weights: str, kv_dtype: str, images: int = 0) -> str:
    """The dtype the trace loads the weights in, or a typed refusal of what cannot run on fake tensors."""
    if weights not in TRACE_FORMATS:
        raise ConfigError("trace_weights_format", "weights", format=weights, allowed=", ".join(TRACE_FORMATS))
    if kv_dtype != weights:
        raise ConfigError("trace_kv_dtype", "kv_dtype", kv_dtype=kv_dtype, weights=weights)
    if images:
        raise ConfigError("trace_images", "images", images=images)
    return weights


def request(
    config: dict[str, Any],
    *,
    weights: str,
    kv_dtype: str,
    prompt: int,
    new_tokens: int,
    batch: int,
    prefill_chunk: int | None = None,
    cache: str = "dynamic",
    images: int = 0,
) -> dict[str, Any]:
    """The trace's request (what travels to the worker), checked."""
    check(weights, kv_dtype, images)
    if cache not in CACHES:
        raise ConfigError("bad_choice", "cache", value=cache, allowed=", ".join(CACHES))
    if prompt < 1 or new_tokens < 1:
        field = "new_tokens" if new_tokens < 1 else "context"
        raise ConfigError("trace_tokens", field, prompt=prompt, new_tokens=new_tokens)
    chunk = prefill_chunk if prefill_chunk is not None and prefill_chunk < prompt else None
    return {
        "config": config,
        "weights": weights,
        "prompt": prompt,
        "new_tokens": new_tokens,
        "batch": batch,
        "prefill_chunk": chunk,
        "cache": cache,
    }


def trace_generate(config: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """Trace ``generate`` (:func:`request`'s keywords): in this process when the fake-CUDA shim is loaded, else in
    the trace worker (:mod:`cabe.trace.worker`). Returns the result's dict (:func:`run`)."""
    req = request(config, **kw)
    from cabe.trace import _native

    if not _native.available():
        import os

        if not os.environ.get("CABE_NO_SUBPROCESS") and _native.reason() == "torch_imported":
            from cabe.trace.worker import request_generate

            return request_generate(req)
        raise ConfigError("mode_unsupported", "mode", mode="fake", why=_native.reason(), detail=_native.detail())
    return handle_request(req)


def handle_request(req: dict[str, Any]) -> dict[str, Any]:
    """:func:`run`, its failures typed (the worker's side calls this too)."""
    try:
        return run(req)
    except CabeError:
        raise
    except MemoryError:
        raise
    except Exception as exc:  # an architecture or op the simulation cannot run
        raise trace_failed(exc) from exc


class _Counter:
    """Tokens the running ``generate`` has fed the model so far, and the event index where each forward began."""

    def __init__(self) -> None:
        self.offset = 0  # tokens in the cache before the running forward
        self.q = 0  # tokens of the running forward
        self.forwards: list[tuple[int, int]] = []  # (first event, tokens) of each forward


def run(req: dict[str, Any]) -> dict[str, Any]:
    """Trace one ``generate`` in this process (the shim loaded). Returns ``trace_peak_bytes`` (allocated at the
    peak), ``trace_reserved_bytes`` (the caching allocator's replay), the components at the peak, the peak of the
    prefill and of the decode steps, the attention kernels picked and the cache's layer classes."""
    import torch

    from cabe.families import config_dtype  # noqa: F401  (the family modules registered)
    from cabe.trace import _native, state
    from cabe.trace.analysis import _allocator
    from cabe.trace.build import build_model
    from cabe.trace.family_patches import model_types
    from cabe.trace.modes import fake_mode
    from cabe.trace.modes import tracker as make_tracker
    from cabe.trace.patches import trace_environment
    from cabe.trace.state import AttentionState
    from cabe.trace.step import materialize, tag_params
    from cabe.training import TrainingSetup

    if not torch.cuda.is_available() and not _native.available():
        raise ConfigError("mode_unsupported", "mode", mode="fake", why=_native.reason(), detail=_native.detail())
    t0 = time.perf_counter()
    config = req["config"]
    b, prompt, new = req["batch"], req["prompt"], req["new_tokens"]
    setup = TrainingSetup(method="full", dtype=req["weights"], autocast="none", attention="sdpa", batch=b, seq=prompt)
    device = torch.device("cuda")
    counter = _Counter()
    notes: list[str] = []
    types = model_types(config)
    with state.active(AttentionState(device)) as astate, trace_environment("fake", setup, types):
        model, cfg = build_model(config, setup, notes)
        model.eval()
        _refuse_kernels(model, cfg)
        tracker = make_tracker(setup, "fake", device, astate, None)
        with fake_mode("fake"), tracker, _generate_patches(counter, prompt + new, tracker):
            tracker.set_phase("setup")
            materialize(model, device)
            tag_params(model, tracker)
            handles = _hooks(model, counter, tracker)
            try:
                vocab = int(getattr(cfg.get_text_config(), "vocab_size", 0) or 32000)
                ids = torch.randint(0, vocab, (b, prompt), device=device)
                mask = torch.ones(b, prompt, dtype=torch.long, device=device)
                tracker.set_phase("forward")
                kwargs: dict[str, Any] = {}
                if req["cache"] == "static":
                    kwargs["cache_implementation"] = "static"
                if req["prefill_chunk"]:
                    kwargs["prefill_chunk_size"] = req["prefill_chunk"]
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=new,
                    min_new_tokens=0,
                    do_sample=False,
                    use_cache=True,
                    eos_token_id=None,
                    pad_token_id=0,
                    return_dict_in_generate=False,
                    **kwargs,
                )
                del out, ids, mask
            finally:
                for h in handles:
                    h.remove()
            tracker.set_phase("setup")
    return _result(tracker, counter, _allocator(tracker), astate, req, notes, time.perf_counter() - t0)


def _refuse_kernels(model: Any, cfg: Any) -> None:
    """Mamba-2 layers at inference call mamba-ssm's and causal-conv1d's kernels (``mamba_chunk_scan_combined`` at
    the prefill, ``selective_state_update`` and ``causal_conv1d_update`` per decode step: models/granitemoehybrid/
    modeling_granitemoehybrid.py, ``cuda_kernels_forward``); on fake tensors transformers would run its PyTorch
    reference scan instead, whose chunk-by-chunk fp32 tensors the kernels never make: refused, in one sentence, rather
    than traced as that (the training trace's stand-in, :mod:`cabe.trace.ssm`, is the training kernel's)."""
    if any("Mamba" in type(m).__name__ for m in model.modules()):
        raise ConfigError("trace_generate_kernels", "model", model_type=cfg.model_type, kernels="mamba-ssm")


def _hooks(model: Any, counter: _Counter, tracker: Any) -> list[Any]:
    """Count each forward's tokens (the offset the mask decision reads) and tag what the LM head makes as ``logits``
    (generate's fp32 copy of them, made after the forward, counts as ``activations``)."""

    def pre(mod: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids: Any = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
        if ids is None and args:
            ids = args[0]
        counter.q = int(ids.shape[1]) if ids is not None else 0
        counter.forwards.append((len(tracker.events), counter.q))
        tracker.region = None

    def post(mod: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        counter.offset += counter.q

    def head(mod: Any, args: Any) -> None:
        tracker.region = "logits"

    def head_done(mod: Any, args: Any, out: Any) -> None:
        tracker.region = None

    handles = [
        model.register_forward_pre_hook(pre, with_kwargs=True),
        model.register_forward_hook(post, with_kwargs=True),
    ]
    out_head = model.get_output_embeddings()
    if out_head is not None:
        handles.append(out_head.register_forward_pre_hook(head))
        handles.append(out_head.register_forward_hook(head_done))
    return handles


@contextlib.contextmanager
def _generate_patches(counter: _Counter, length: int, tracker: Any) -> Iterator[None]:
    """The host reads fake tensors cannot answer (module docstring), and the cache's writes tagged ``kv_cache``."""
    import torch
    import transformers.generation.utils as gu
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from cabe.trace import compat

    mu = compat.module("masking_utils", compat.EVERY_FAMILY)
    cu = compat.module("cache_utils", compat.EVERY_FAMILY)
    real_ignore = compat.require(mu, "_ignore_causal_mask_sdpa", compat.EVERY_FAMILY)
    stop_cls = compat.require(gu, "StopCheck", compat.EVERY_FAMILY)
    real_stop = stop_cls.__call__
    # the cache's layer classes: attention layers, and the linear-attention / Mamba ones of hybrid models (their
    # conv and recurrent states: update_conv_state, update_recurrent_state)
    bases = tuple(getattr(cu, n) for n in ("CacheLayerMixin", "LinearAttentionCacheLayerMixin") if hasattr(cu, n))
    layer_classes = [c for c in vars(cu).values() if isinstance(c, type) and issubclass(c, bases)]
    real_updates = {
        (c, name): vars(c)[name]
        for c in layer_classes
        for name in vars(c)
        if name.startswith("update") or name == "lazy_initialization"
    }

    def stop(self: Any, unfinished: Any, tokens: Any, n: int) -> bool:
        _ = unfinished.max() == 0  # the op StopCheck runs (utils.py:397); its value is what MaxLengthCriteria gives
        return n >= length

    def ignore(padding_mask: Any, q_length: int, kv_length: int, q_offset: Any, kv_offset: int, *a: Any) -> bool:
        seen = counter.offset + q_length  # real tokens at absolute positions [0, seen)
        with unset_fake_temporarily():
            pm = None
            if padding_mask is not None:
                pos = torch.arange(padding_mask.shape[-1])
                pm = (pos < seen).expand(padding_mask.shape[0], -1).clone()
            qo = counter.offset if isinstance(q_offset, torch.Tensor) else q_offset
            return bool(real_ignore(pm, q_length, kv_length, qo, kv_offset, *a))

    seq_lengths: dict[Any, Any] = {c: vars(c)["get_seq_length"] for c in layer_classes if "get_seq_length" in vars(c)}

    def seq_length(real: Any) -> Any:
        def wrapper(self: Any) -> Any:
            # StaticLayer answers its step counter, a device tensor (cache_utils.py:502-504) that a chunked prefill
            # slices the mask with (generation/utils.py:4399-4403): the count of tokens written, which the trace
            # knows
            n = real(self)
            return counter.offset if isinstance(n, torch.Tensor) else n

        return wrapper

    def tagged(update: Any) -> Any:
        def wrapper(self: Any, *a: Any, **k: Any) -> Any:
            device = next((t.device for t in a if isinstance(t, torch.Tensor) and t.device.type == "cuda"), None)
            for name, value in list(vars(self).items()):
                if device is not None and isinstance(value, torch.Tensor) and value.device.type == "cpu":
                    # the layers' host tensors (StaticLayer's step counter, ``torch.tensor(0)``, cache_utils.py:421;
                    # DynamicSlidingWindowLayer's window, l.210) moved to the device when the layer is first filled
                    # (l.449, l.221; generate fills a static cache early for a chunked prefill, generation/utils.py:
                    # 2198-2208): fake-mode constants whose move would run for real, on a CUDA this build lacks; the
                    # same bytes made on the device
                    setattr(self, name, torch.zeros(value.shape, dtype=value.dtype, device=device))
            before, tracker.region = tracker.region, "kv_cache"
            try:
                return update(self, *a, **k)
            finally:
                tracker.region = before

        return wrapper

    try:
        stop_cls.__call__ = stop
        mu._ignore_causal_mask_sdpa = ignore
        for (c, name), u in real_updates.items():
            setattr(c, name, tagged(u))
        for c, g in seq_lengths.items():
            c.get_seq_length = seq_length(g)
        yield
    finally:
        stop_cls.__call__ = real_stop
        mu._ignore_causal_mask_sdpa = real_ignore
        for (c, name), u in real_updates.items():
            setattr(c, name, u)
        for c, g in seq_lengths.items():
            c.get_seq_length = g


def _result(
    tracker: Any, counter: _Counter, replays: Any, astate: Any, req: dict[str, Any], notes: list[str], seconds: float
) -> dict[str, Any]:
    curve = tracker.curve()
    peak_i = max(range(len(curve)), key=curve.__getitem__) if len(curve) else -1
    peak = curve[peak_i] if peak_i >= 0 else 0
    live = tracker.replay(peak_i) - tracker.ignored if peak_i >= 0 else set()
    comps = dict.fromkeys(COMPONENTS, 0)
    for aid in live:
        tag = tracker.tag.get(aid)
        region = tracker.region_of[aid]
        comps[tag if tag in comps else region if region in comps else "activations"] += tracker.size[aid]
    starts = [s for s, _ in counter.forwards]
    prefill_forwards = _prefill_forwards(counter)
    split = starts[prefill_forwards] if len(starts) > prefill_forwards else len(curve)
    stage_peaks = {"prefill": max(curve[:split], default=0), "decode": max(curve[split:], default=0)}
    _, _, st, st_exp = replays
    return {
        "trace_peak_bytes": peak,
        "trace_reserved_bytes": st.peak_reserved_bytes,
        "trace_reserved_bytes_expandable_segments": st_exp.peak_reserved_bytes,
        "trace_peak_stage": "prefill" if peak_i < split else "decode",
        "trace_stage_peaks": stage_peaks,
        "trace_components": comps,
        "trace_top_allocations": [
            {"bytes": tracker.size[a], "op": tracker.op_of[a], "region": tracker.region_of[a]}
            for a in sorted(live - set(tracker.tag), key=lambda a: -tracker.size[a])[:TOP]
        ],
        "trace_forwards": len(counter.forwards),
        "trace_attention_kernels": dict(astate.choices),
        "trace_prompt": req["prompt"],
        "trace_new_tokens": req["new_tokens"],
        "trace_cache": req["cache"],
        "trace_prefill_chunk": req["prefill_chunk"],
        "trace_notes": notes,
        "trace_seconds": round(seconds, 2),
    }


def _prefill_forwards(counter: _Counter) -> int:
    """How many of the forwards were the prefill: those before the first one-token forward (a one-token prompt's
    prefill is its first forward)."""
    for i, (_, q) in enumerate(counter.forwards):
        if q == 1 and i > 0:
            return i
    return len(counter.forwards)


def beside_estimate(out: dict[str, Any], config: dict[str, Any], images: int = 0) -> dict[str, Any]:
    """``cabe infer --trace``: the estimate ``out`` (:func:`cabe.inference.infer_json`) with the traced ``generate`` of
    the same request beside it: ``trace_peak_bytes``, ``trace_reserved_bytes``, ``estimate_relative_error`` (of
    ``total_bytes``) and the trace's details under ``trace``."""
    if out.get("mode") != "generate":
        raise ConfigError("trace_mode", "mode", mode=out.get("mode"))
    chunk = out.get("prefill_chunk")
    res = trace_generate(
        config,
        weights=out["weights_format"],
        kv_dtype=out["kv_dtype"],
        prompt=out["prompt_tokens"],
        new_tokens=out["new_tokens"],
        batch=out["batch"],
        prefill_chunk=chunk if chunk and chunk < out["prompt_tokens"] else None,
        cache=out.get("cache", "dynamic"),
        images=images,
    )
    peak = res["trace_peak_bytes"]
    out["trace_peak_bytes"] = peak
    out["trace_reserved_bytes"] = res["trace_reserved_bytes"]
    out["estimate_relative_error"] = round((out["total_bytes"] - peak) / peak, 5) if peak else None
    out["trace"] = {
        k[len("trace_") :]: v for k, v in res.items() if k not in ("trace_peak_bytes", "trace_reserved_bytes")
    }
    return out
