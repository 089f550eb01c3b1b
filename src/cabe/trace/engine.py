"""Simulate real training steps on fake tensors and measure every allocation.

The step is the real thing: ``AutoModelForCausalLM.from_config`` (built on ``meta``, then
``to_empty`` on the fake device), PEFT / bitsandbytes wrappers, ``torch.autocast``,
gradient checkpointing, ``loss.backward()``, a real ``torch.optim`` (or bitsandbytes)
optimizer and ``zero_grad(set_to_none=True)``. Only the tensors are fake: they carry shape,
dtype and device but no data, so a 70B step costs seconds and no memory.

Modes:

* ``fake`` -- FakeTensorMode on a fake ``cuda`` device (see :mod:`cabe.trace._native` for
  how a CPU-only torch gets one). ``torch.autocast('cuda')`` and fused optimizers really run.
  If torch was imported before :mod:`cabe.trace` the shim cannot be installed in-process and
  the trace runs in a subprocess (``python -m cabe.trace._worker``).
* ``meta`` -- plain meta tensors, no fake mode. AMP and fused optimizers cannot run there.
* ``cpu`` -- real tensors on the CPU: the exactness reference for tiny models (tests).
* ``auto`` -- ``fake`` when possible, else ``meta``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cabe.errors import CabeError, ConfigError, MissingDependencyError
from cabe.trace import _native
from cabe.training import TrainingSetup

TIMELINE_POINTS = 1500
LEARNING_RATE = 1e-5


# ---------------------------------------------------------------------------------------
# result
# ---------------------------------------------------------------------------------------
@dataclass
class TraceResult:
    """What :func:`trace_step` measured. All byte counts are per GPU."""

    peak_bytes: int
    peak_phase: str
    components: dict[str, int]
    phase_peaks: dict[str, int]
    timeline: list[tuple[int, str, int]]
    parameters: int = 0
    trainable_parameters: int = 0
    reserved_bytes: int = 0
    reserved_bytes_expandable: int = 0
    allocator_allocated_bytes: int = 0  # max_memory_allocated() incl. unsplit block remainders
    segments: int = 0
    paged_bytes: int = 0
    first_step_peak_bytes: int = 0
    mode: str = "fake"
    attention_kernels: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    setup: dict[str, Any] = field(default_factory=dict)
    steps: int = 2
    micro_batches_per_step: int = 1
    events: int = 0
    peak_event: int = 0
    step_starts: list[int] = field(default_factory=list)
    seconds: float = 0.0
    top_allocations: list[dict[str, Any]] = field(default_factory=list)
    alloc_sizes: list[int] | None = None  # allocation id -> rounded bytes (for the allocator)
    alloc_events: list[int] | None = None  # +id+1 malloc / -(id+1) free, paged excluded

    def to_json(self, *, include_events: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "peak_bytes": self.peak_bytes,
            "peak_gib": round(self.peak_bytes / 2**30, 4),
            "peak_phase": self.peak_phase,
            "components": dict(self.components),
            "phase_peaks": dict(self.phase_peaks),
            "parameters": self.parameters,
            "trainable_parameters": self.trainable_parameters,
            "reserved_bytes": self.reserved_bytes,
            "reserved_bytes_expandable_segments": self.reserved_bytes_expandable,
            "allocator_allocated_bytes": self.allocator_allocated_bytes,
            "segments": self.segments,
            "paged_bytes": self.paged_bytes,
            "first_step_peak_bytes": self.first_step_peak_bytes,
            "mode": self.mode,
            "attention_kernels": dict(self.attention_kernels),
            "notes": list(self.notes),
            "setup": dict(self.setup),
            "steps": self.steps,
            "micro_batches_per_step": self.micro_batches_per_step,
            "events": self.events,
            "peak_event": self.peak_event,
            "step_starts": list(self.step_starts),
            "seconds": round(self.seconds, 3),
            "top_allocations": list(self.top_allocations),
            "timeline": [list(t) for t in self.timeline],
        }
        if include_events and self.alloc_sizes is not None:
            out["alloc_sizes"] = list(self.alloc_sizes)
            out["alloc_events"] = list(self.alloc_events or [])
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TraceResult:
        return cls(
            peak_bytes=d["peak_bytes"],
            peak_phase=d["peak_phase"],
            components=d["components"],
            phase_peaks=d["phase_peaks"],
            timeline=[tuple(t) for t in d["timeline"]],
            parameters=d["parameters"],
            trainable_parameters=d["trainable_parameters"],
            reserved_bytes=d["reserved_bytes"],
            reserved_bytes_expandable=d.get("reserved_bytes_expandable_segments", 0),
            allocator_allocated_bytes=d.get("allocator_allocated_bytes", 0),
            segments=d.get("segments", 0),
            paged_bytes=d["paged_bytes"],
            first_step_peak_bytes=d["first_step_peak_bytes"],
            mode=d["mode"],
            attention_kernels=d.get("attention_kernels", {}),
            notes=d.get("notes", []),
            setup=d.get("setup", {}),
            steps=d.get("steps", 2),
            micro_batches_per_step=d.get("micro_batches_per_step", 1),
            events=d.get("events", 0),
            peak_event=d.get("peak_event", 0),
            step_starts=d.get("step_starts", []),
            seconds=d.get("seconds", 0.0),
            top_allocations=d.get("top_allocations", []),
            alloc_sizes=d.get("alloc_sizes"),
            alloc_events=d.get("alloc_events"),
        )


# ---------------------------------------------------------------------------------------
# dependencies and config
# ---------------------------------------------------------------------------------------
def import_deps(setup: TrainingSetup | None = None) -> None:
    """Import what a trace needs, raising :class:`MissingDependencyError` for what is missing."""
    needed = ["torch", "transformers"]
    if setup is not None and setup.method in ("lora", "qlora", "prompt-tuning"):
        needed.append("peft")
    if setup is not None and (
        setup.method == "qlora" or setup.optimizer in ("adamw-8bit", "paged-adamw", "paged-adamw-8bit", "lion")
    ):
        needed.append("bitsandbytes")
    for name in needed:
        try:
            __import__(name)
        except ImportError:
            raise MissingDependencyError("missing_extra", None, extra="trace", package=name) from None


_DROP_KEYS = (
    "quantization_config",
    "auto_map",
    "_name_or_path",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "_commit_hash",
    "attn_implementation",
    "_attn_implementation",
)


def hf_config(config: dict[str, Any]) -> Any:
    """A transformers config from a config.json dict; bad input raises :class:`ConfigError`."""
    from transformers import AutoConfig

    if not isinstance(config, dict):
        raise ConfigError("config_not_object", "config")
    model_type = config.get("model_type")
    if not model_type or not isinstance(model_type, str):
        raise ConfigError("missing_model_type", "model_type")
    kwargs = {k: v for k, v in config.items() if k not in _DROP_KEYS and k != "model_type"}
    kwargs["use_cache"] = False
    try:
        cfg = AutoConfig.for_model(model_type, **kwargs)
    except ValueError as exc:
        if "Unrecognized model identifier" in str(exc) or model_type in str(exc):
            raise ConfigError("unknown_architecture", "model_type", model_type=model_type) from None
        raise ConfigError("bad_config", None, model_type=model_type, reason=str(exc)[:300]) from None
    except Exception as exc:
        raise ConfigError("bad_config", None, model_type=model_type, reason=str(exc)[:300]) from None
    return cfg


def _torch_dtype(name: str) -> Any:
    import torch

    return {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "bf16-amp": torch.float32,
        "fp16-amp": torch.float32,
    }[name]


def autocast_dtype(setup: TrainingSetup) -> Any:
    import torch

    if setup.precision == "bf16-amp":
        return torch.bfloat16
    if setup.precision == "fp16-amp":
        return torch.float16
    return None


def load_dtype(setup: TrainingSetup) -> Any:
    """The dtype the model's parameters are created in (before any method-specific casts)."""
    import torch

    if setup.method == "qlora":
        # QLoRA loads the non-quantised modules in the compute dtype (prepare_model_for_kbit_training
        # then upcasts them to fp32); the 4-bit weights dequantise to it.
        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[setup.compute_dtype]
    return _torch_dtype(setup.precision)


def decoder_layers(model: Any, cfg: Any) -> Any:
    """The ModuleList of decoder layers (the longest list of the configured length)."""
    import torch

    n = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", None)
    best = None
    for _, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 0:
            if n is not None and len(mod) != n:
                continue
            if best is None or len(mod) > len(best):
                best = mod
    if best is None:
        raise ConfigError("no_decoder_layers", None)
    return best


# ---------------------------------------------------------------------------------------
# building the model
# ---------------------------------------------------------------------------------------
def build_model(config: dict[str, Any], setup: TrainingSetup, notes: list[str]) -> tuple[Any, Any]:
    """The model on ``meta`` with the training method applied. Returns (model, hf config)."""
    import torch
    from transformers import AutoModelForCausalLM

    from cabe.trace.attention import register_flash

    cfg = hf_config(config)
    attn = {"eager": "eager", "sdpa": "sdpa", "flash": register_flash()}[setup.attention]
    if setup.attention == "flash":
        head_dim = getattr(cfg, "head_dim", None) or (cfg.hidden_size // cfg.num_attention_heads)
        if head_dim > 256:
            raise ConfigError("flash_head_dim", "attention", head_dim=head_dim, maximum=256)
    dtype = load_dtype(setup)
    try:
        with torch.device("meta"):
            try:
                model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn)
            except (ValueError, ImportError) as exc:
                if attn == "eager" or ("attn" not in str(exc).lower() and "attention" not in str(exc).lower()):
                    raise
                notes.append(f"{setup.attention} attention is not supported by this architecture; used eager")
                model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="eager")
    except CabeError:
        raise
    except ValueError as exc:
        msg = str(exc)
        if "Unrecognized configuration class" in msg:
            raise ConfigError("not_causal_lm", "model_type", model_type=cfg.model_type) from None
        raise ConfigError("bad_config", None, model_type=cfg.model_type, reason=msg[:300]) from None
    except (TypeError, AttributeError, RuntimeError, KeyError, ImportError) as exc:
        raise ConfigError("bad_config", None, model_type=cfg.model_type, reason=str(exc)[:300]) from None
    model.train()
    if setup.attention == "flash":
        for m in model.modules():
            m._cabe_flash_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(
                setup.compute_dtype, torch.bfloat16
            )
    gc_kwargs = {"gradient_checkpointing_kwargs": {"use_reentrant": False}}

    if setup.method == "full":
        if setup.checkpointing:
            model.gradient_checkpointing_enable(**gc_kwargs)
    elif setup.method == "freeze":
        for p in model.parameters():
            p.requires_grad_(False)
        layers = decoder_layers(model, cfg)
        k = min(setup.trainable_layers, len(layers))
        for layer in list(layers)[len(layers) - k :]:
            for p in layer.parameters():
                p.requires_grad_(True)
        if setup.checkpointing:
            model.gradient_checkpointing_enable(**gc_kwargs)
    elif setup.method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        if setup.method == "qlora":
            from peft import prepare_model_for_kbit_training

            from cabe.trace.quant import quantize_on_meta

            quantize_on_meta(model, setup, dtype)
            model = prepare_model_for_kbit_training(
                model,
                use_gradient_checkpointing=setup.checkpointing,
                gradient_checkpointing_kwargs={"use_reentrant": False},
            )
        elif setup.checkpointing:
            model.gradient_checkpointing_enable(**gc_kwargs)
            model.enable_input_require_grads()
        targets: Any = list(setup.lora_targets) or None  # None: PEFT's default for the model type
        if targets == ["all-linear"]:
            targets = "all-linear"
        lcfg = LoraConfig(
            r=setup.lora_rank,
            lora_alpha=setup.lora_alpha,  # type: ignore[arg-type]  # PEFT annotates int, uses it as a float scale
            target_modules=targets,
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        )
        try:
            try:
                model = get_peft_model(model, lcfg)
            except ValueError as exc:
                if targets is not None or "target_modules" not in str(exc):
                    raise
                # PEFT knows no default targets for this architecture: adapt every linear layer
                notes.append("PEFT has no default LoRA targets for this model type; used all-linear")
                lcfg.target_modules = "all-linear"
                model = get_peft_model(model, lcfg)
        except ValueError as exc:
            raise ConfigError(
                "bad_lora_targets",
                "lora_targets",
                targets=",".join(setup.lora_targets) or "(peft default)",
                reason=str(exc)[:300],
            ) from None
    elif setup.method == "prompt-tuning":
        from peft import PromptTuningConfig, get_peft_model

        if setup.checkpointing:
            model.gradient_checkpointing_enable(**gc_kwargs)
            model.enable_input_require_grads()
        model = get_peft_model(model, PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=setup.prompt_tokens))
    model.train()
    return model, cfg


# ---------------------------------------------------------------------------------------
# environment: fake CUDA and the transformers hooks that block tracing
# ---------------------------------------------------------------------------------------
class _Patch:
    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []

    def set(self, obj: Any, name: str, value: Any) -> None:
        self._undo.append((obj, name, getattr(obj, name, None)))
        setattr(obj, name, value)

    def restore(self) -> None:
        for obj, name, old in reversed(self._undo):
            setattr(obj, name, old)
        self._undo.clear()


_ASTATE: list[Any] = []
_CUDA_LIB: Any = None


def _register_cuda_placeholders() -> None:
    """Give CUDA a kernel for the ops that would otherwise decompose on fake CUDA tensors.

    A few aten ops (``silu_backward``, ``mish_backward``, ``native_channel_shuffle``) have
    CPU/CUDA kernels *and* a CompositeImplicitAutograd fallback. On a CPU-only build the CUDA
    slot is empty, so on a fake ``cuda`` tensor the fallback runs above the Python dispatch
    key and the tracker would count its temporaries (``silu_backward`` -> sigmoid, 1 - s,
    products), which the real CUDA kernel never allocates. A placeholder CUDA kernel restores
    real dispatch: FakeTensorMode then sees the op itself. It is never called (no real CUDA
    tensors exist in a CPU-only build).
    """
    global _CUDA_LIB
    import torch

    if _CUDA_LIB is not None:
        return
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    lib = torch.library.Library("aten", "IMPL")

    def _never(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("cabe.trace placeholder CUDA kernel called")

    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        try:
            if (
                has(name, "CompositeImplicitAutograd")
                and (has(name, "CPU") or has(name, "Meta"))
                and not has(name, "CUDA")
            ):
                lib.impl(name[len("aten::") :], _never, "CUDA")
        except RuntimeError:
            continue
    _CUDA_LIB = lib


def _patch_falcon_split_heads(p: _Patch) -> None:
    """Falcon's multi-query ``_split_heads`` indexes with Python lists (``fused_qkv[..., [-2], :]``).

    PyTorch turns such a list into an index tensor in C++, below the Python dispatch key, so it
    is created as a real CUDA tensor and fails on a CPU-only build. ``index_select`` with an
    index made by ``torch.arange`` (a factory op the fake mode intercepts) makes the same copies.
    """
    try:
        from transformers.models.falcon import modeling_falcon as mf
    except ImportError:
        return
    original = mf.FalconAttention._split_heads

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


def _find_packed_sequence_indices(position_ids: Any) -> None:
    """``transformers.masking_utils.find_packed_sequence_indices`` for unpacked batches."""
    import torch

    first_dummy_value = position_ids[:, :1] - 1
    position_diff = torch.diff(position_ids, prepend=first_dummy_value, dim=-1)
    packed_sequence_mask = (position_diff != 1).cumsum(-1)
    _ = (packed_sequence_mask[:, -1] == 0).all()  # True for a batch of whole sequences
    return None


def _current_attention_state() -> Any:
    return _ASTATE[-1]


@contextlib.contextmanager
def trace_environment(kind: str, setup: TrainingSetup) -> Iterator[None]:
    """Patches for the duration of one trace (``kind``: fake | meta | cpu)."""
    import torch
    import transformers.masking_utils as mu

    if setup.method == "qlora" or setup.optimizer in ("adamw-8bit", "paged-adamw", "paged-adamw-8bit", "lion"):
        import bitsandbytes  # noqa: F401  (import before torch.cuda is patched)
        import bitsandbytes.optim.optimizer as bnb_opt
    else:
        bnb_opt = None  # type: ignore[assignment]
    if setup.method in ("lora", "qlora", "prompt-tuning"):
        import peft  # noqa: F401

    p = _Patch()
    try:
        if kind in ("fake", "meta"):
            import functools

            from cabe.trace.attention import routed_sdpa

            astate = _current_attention_state()
            p.set(
                torch.nn.functional,
                "scaled_dot_product_attention",
                functools.partial(routed_sdpa, astate, torch.nn.functional.scaled_dot_product_attention),
            )
        if kind == "meta":
            # at::dropout uses the fused native_dropout (1-byte mask) only for CUDA tensors
            # (is_fused_kernel_acceptable); meta tensors would take the float-mask path.
            real_dropout = torch.nn.functional.dropout

            def cuda_dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
                if training and 0.0 < p < 1.0 and not inplace and input.numel() > 0:
                    return torch.ops.aten.native_dropout(input, p, True)[0]
                return real_dropout(input, p, training, inplace)

            p.set(torch.nn.functional, "dropout", cuda_dropout)
        # transformers reads position_ids to detect packed sequences (a data-dependent branch);
        # a batch of whole sequences has none. Same tensor ops as the original, answer None.
        p.set(mu, "find_packed_sequence_indices", _find_packed_sequence_indices)
        _patch_falcon_split_heads(p)
        if kind == "fake" and not torch.cuda.is_available() and _native.available():
            _native.enable(True)
            _register_cuda_placeholders()

            class _Props:
                name = "cabe fake H100"
                major, minor = 9, 0
                total_memory = 80 * 2**30
                multi_processor_count = 132

            p.set(torch.cuda, "is_available", lambda: True)
            p.set(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
            p.set(torch.cuda, "device_count", lambda: 1)
            p.set(torch.cuda, "current_device", lambda: 0)
            p.set(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
            p.set(torch.cuda, "get_device_properties", lambda *a, **k: _Props())
            p.set(torch.cuda, "synchronize", lambda *a, **k: None)
            p.set(torch.cuda, "empty_cache", lambda *a, **k: None)
        if bnb_opt is not None and kind != "cuda":
            import bitsandbytes.functional as bnb_f
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            p.set(bnb_opt, "sync_gpu", lambda t: None)
            real_map = bnb_f.create_dynamic_map

            def create_dynamic_map(*a: Any, **k: Any) -> Any:
                # computed from values on the host, outside the fake mode (a 256-entry table)
                with unset_fake_temporarily():
                    out = real_map(*a, **k)
                fm = torch._guards.detect_fake_mode()
                return fm.from_tensor(out) if fm is not None else out

            p.set(bnb_f, "create_dynamic_map", create_dynamic_map)
        yield
    finally:
        p.restore()
        if kind == "fake":
            _native.enable(False)


def resolve_mode(mode: str, setup: TrainingSetup) -> str:
    """``fake`` (in this process), ``fake-subprocess``, ``meta`` or ``cpu``."""
    import torch

    if mode not in ("auto", "fake", "meta", "cpu"):
        raise ConfigError("bad_choice", "mode", value=mode, allowed="auto, fake, meta")
    needs_fake = setup.precision in ("bf16-amp", "fp16-amp") or setup.resolved_optimizer_impl == "fused"
    if mode in ("meta", "cpu"):
        if needs_fake and mode == "meta":
            raise ConfigError(
                "mode_unsupported", "mode", mode=mode, reason="AMP and fused optimizers need the fake CUDA device"
            )
        if mode == "cpu" and setup.precision in ("bf16-amp", "fp16-amp"):
            raise ConfigError("mode_unsupported", "mode", mode=mode, reason="CUDA autocast on a CPU run")
        return mode
    if torch.cuda.is_available() or _native.available():
        return "fake"
    if _native.torch_has_cuda():
        return "fake"
    if not os.environ.get("CABE_NO_SUBPROCESS") and _native.reason().startswith("torch was imported"):
        return "fake-subprocess"
    if mode == "fake" or needs_fake:
        raise ConfigError(
            "mode_unsupported", "mode", mode=mode, reason=f"no fake CUDA device here ({_native.reason()})"
        )
    return "meta"


# ---------------------------------------------------------------------------------------
# the step
# ---------------------------------------------------------------------------------------
def _make_optimizer(params: list[Any], setup: TrainingSetup, tracker: Any, kind: str = "fake") -> Any:
    import torch

    impl = setup.resolved_optimizer_impl
    kw: dict[str, Any] = {}
    if impl == "fused":
        kw["fused"] = True
    elif impl == "foreach":
        kw["foreach"] = True
    else:
        kw["foreach"] = False
    opt = setup.optimizer
    if opt == "adamw":
        return torch.optim.AdamW(params, lr=LEARNING_RATE, **kw)
    if opt in ("sgd", "sgd-momentum"):
        return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=0.9 if opt == "sgd-momentum" else 0.0, **kw)
    if opt == "adafactor":
        kw.pop("fused", None)
        if impl == "fused":
            kw["foreach"] = True
        return torch.optim.Adafactor(params, lr=1e-2, **kw)
    import bitsandbytes as bnb

    cls = {
        "adamw-8bit": bnb.optim.AdamW8bit,
        "paged-adamw": bnb.optim.PagedAdamW,
        "paged-adamw-8bit": bnb.optim.PagedAdamW8bit,
        "lion": bnb.optim.Lion,
    }[opt]
    o = cls(params, lr=LEARNING_RATE)

    def get_state_buffer(self: Any, p: Any, dtype: Any = torch.float32) -> Any:
        # bitsandbytes Optimizer8bit.get_state_buffer: paged (cudaMallocManaged) when the
        # optimizer is paged and the parameter has >= 1e5 elements; not in torch's allocator.
        if not self.is_paged or p.numel() < 1e5:
            return torch.zeros_like(p, dtype=dtype, device=p.device)
        tracker.paged_mode = True
        try:
            return torch.zeros_like(p, dtype=dtype, device=p.device)
        finally:
            tracker.paged_mode = False

    import types

    if kind != "cuda":  # on a real GPU, bitsandbytes pages for real
        o.get_state_buffer = types.MethodType(get_state_buffer, o)
    return o


def _tag_params(model: Any, tracker: Any) -> None:
    for p in model.parameters():
        tracker.tag_tensor(p, "weights")
    for b in model.buffers():
        tracker.tag_tensor(b, "weights")
    tracker.weight_keys = {p.untyped_storage()._cdata for p in model.parameters()}


def _optimizer_tensors(opt: Any) -> Iterator[Any]:
    import torch

    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                yield v


def run_trace(
    config: dict[str, Any],
    setup: TrainingSetup,
    steps: int,
    kind: str,
    inventory: bool = False,
    hooks: dict[str, Any] | None = None,
) -> Any:
    """Run the simulation in this process.

    ``kind``: ``fake`` | ``meta`` (simulations), ``cpu`` (real tensors on the CPU: the
    exactness reference) or ``cuda`` (real tensors on a GPU: :mod:`cabe.trace.measure`).
    ``hooks``: optional ``{"on_step_start": f(step)}``.
    """
    import torch

    from cabe.trace.attention import AttentionState

    t0 = time.perf_counter()
    notes: list[str] = []
    if steps < 2 and not inventory:
        raise ConfigError("out_of_range", "steps", value=steps, minimum=2, maximum=100)
    if kind == "fake" and not torch.cuda.is_available() and not _native.available():
        # without the shim, autograd on fake CUDA tensors aborts the process: refuse instead
        raise ConfigError(
            "mode_unsupported", "mode", mode="fake", reason=f"no fake CUDA device in this process ({_native.reason()})"
        )
    device = torch.device({"fake": "cuda", "meta": "meta", "cpu": "cpu", "cuda": "cuda"}[kind])
    astate = AttentionState(device)
    _ASTATE.append(astate)
    try:
        return _run_trace(config, setup, steps, kind, inventory, notes, device, astate, t0, hooks or {})
    finally:
        _ASTATE.pop()


def _run_trace(
    config: dict[str, Any],
    setup: TrainingSetup,
    steps: int,
    kind: str,
    inventory: bool,
    notes: list[str],
    device: Any,
    astate: Any,
    t0: float,
    hooks: dict[str, Any],
) -> Any:
    import torch

    from cabe.trace.attention import intercept as attn_intercept
    from cabe.trace.quant import gemm_4bit_scratch
    from cabe.trace.tracker import AllocationTracker

    with trace_environment(kind, setup):
        model, cfg = build_model(config, setup, notes)
        gemm4 = None
        if setup.method == "qlora":
            try:
                gemm4 = torch.ops.bitsandbytes.gemm_4bit.default
            except (AttributeError, RuntimeError):
                gemm4 = None

        def intercept(tr: Any, func: Any, args: tuple, kwargs: dict) -> Any:
            if kind in ("cpu", "cuda"):  # real kernels allocate for themselves
                return NotImplemented
            if gemm4 is not None and func is gemm4:
                return gemm_4bit_scratch(tr, func, args, kwargs)
            return attn_intercept(astate, tr, func, args, kwargs)

        tracker = AllocationTracker(device_type=device.type, intercept=intercept)
        # A CPU run stands in for a GPU run: optimizer `step` counters are host tensors there.
        tracker.host_scalars_in_optimizer = kind == "cpu" and setup.resolved_optimizer_impl != "fused"
        if kind == "fake":
            from torch._subclasses.fake_tensor import FakeTensorMode

            fake_ctx: Any = FakeTensorMode(allow_non_fake_inputs=True)
        else:
            fake_ctx = contextlib.nullcontext()
        with fake_ctx, tracker:
            tracker.set_phase("setup")
            materialize(model, device)
            if kind in ("cpu", "cuda"):
                with torch.no_grad():
                    for p in model.parameters():
                        if p.is_floating_point():
                            p.normal_(0.0, 0.02)
                    for b in model.buffers():
                        if b.is_floating_point():
                            b.uniform_(0.0, 1.0)
            if setup.method == "qlora":
                from cabe.trace.quant import materialize as quant_materialize

                quant_materialize(model, setup, device, tracker)
                if kind in ("cpu", "cuda"):
                    from cabe.trace.quant import fill_real

                    fill_real(model)
            _tag_params(model, tracker)
            n_params = sum(_numel_stored(p) for p in model.parameters())
            trainable = [p for p in model.parameters() if p.requires_grad]
            n_train = sum(p.numel() for p in trainable)
            if inventory:
                return _inventory(model, cfg, setup, device, tracker, astate)
            if not trainable:
                raise ConfigError("nothing_to_train", "method", method=setup.method)
            result = _train(model, cfg, setup, steps, device, tracker, trainable, kind, hooks)
    result.parameters = n_params
    result.trainable_parameters = n_train
    result.mode = kind
    result.attention_kernels = dict(astate.choices)
    result.notes = notes + result.notes
    result.setup = setup.to_dict()
    result.seconds = time.perf_counter() - t0
    return result


def materialize(model: Any, device: Any) -> None:
    """``Module.to_empty`` without tensor swapping: a new (uninitialised) storage for every
    parameter and buffer, in module order, shared parameters (tied embeddings) once.

    ``to_empty`` swaps tensors in place, which fails for parameters other objects hold
    weak references to (PEFT's prompt encoder), so parameters are replaced instead; attributes
    set on a parameter (bitsandbytes' ``quant_type``...) are carried over.
    """
    import torch

    memo: dict[int, Any] = {}
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is None:
                continue
            new = memo.get(id(p))
            if new is None:
                with torch.no_grad():
                    data = torch.empty_like(p, device=device)
                new = torch.nn.Parameter(data, requires_grad=p.requires_grad)
                for k, v in vars(p).items():
                    setattr(new, k, v)
                memo[id(p)] = new
            mod._parameters[name] = new
        for name, b in list(mod._buffers.items()):
            if b is None:
                continue
            new = memo.get(id(b))
            if new is None:
                new = torch.empty_like(b, device=device)
                memo[id(b)] = new
            mod._buffers[name] = new


def _numel_stored(p: Any) -> int:
    """Parameters as counted by users: a 4-bit packed weight holds two parameters per byte."""
    qs = getattr(p, "quant_state", None)
    if qs is not None and getattr(qs, "shape", None) is not None:
        n = 1
        for s in qs.shape:
            n *= int(s)
        return n
    return p.numel()


def _inputs(cfg: Any, setup: TrainingSetup, device: Any) -> tuple[Any, Any]:
    import torch

    vocab = int(getattr(cfg, "vocab_size", 32000) or 32000)
    ids = torch.randint(0, vocab, (setup.batch, setup.seq), device=device)
    labels = ids.clone()
    return ids, labels


def _install_logits_hooks(model: Any, tracker: Any) -> list[Any]:
    """Tag everything from the LM head's forward to its output gradient as ``logits``."""
    head = model.get_output_embeddings()
    handles: list[Any] = []
    if head is None:
        return handles

    def on_grad(grad: Any) -> None:
        tracker.region = None

    def pre(mod: Any, args: Any) -> None:
        tracker.region = "logits"

    def post(mod: Any, args: Any, out: Any) -> None:
        if hasattr(out, "requires_grad") and out.requires_grad:
            out.register_hook(on_grad)

    handles.append(head.register_forward_pre_hook(pre))
    handles.append(head.register_forward_hook(post))
    return handles


def _train(
    model: Any,
    cfg: Any,
    setup: TrainingSetup,
    steps: int,
    device: Any,
    tracker: Any,
    trainable: list[Any],
    kind: str,
    hooks: dict[str, Any] | None = None,
) -> TraceResult:
    import torch

    notes: list[str] = []
    amp = autocast_dtype(setup)
    micro = min(setup.grad_accum, 2)
    if setup.grad_accum > 2:
        notes.append(
            f"grad_accum={setup.grad_accum}: simulated 2 micro-batches per step "
            "(memory is the same for every micro-batch after the first)"
        )
    scaler = None
    if setup.precision == "fp16-amp":
        scaler = torch.amp.GradScaler("cuda")
    opt = _make_optimizer(trainable, setup, tracker, kind)
    for p in trainable:
        p.register_post_accumulate_grad_hook(lambda p: tracker.tag_tensor(p.grad, "gradients"))
    handles = _install_logits_hooks(model, tracker)
    step_starts: list[int] = []
    try:
        for step in range(1, steps + 1):
            if hooks and "on_step_start" in hooks:
                hooks["on_step_start"](step)
            tracker.step = step
            step_starts.append(len(tracker.events))
            for _mb in range(micro):
                tracker.set_phase("setup")
                tracker.region = None
                ids, labels = _inputs(cfg, setup, device)
                tracker.set_phase("forward")
                ctx = torch.autocast("cuda", dtype=amp) if amp is not None else contextlib.nullcontext()
                with ctx:
                    loss = model(input_ids=ids, labels=labels, use_cache=False).loss
                if micro > 1:
                    loss = loss / setup.grad_accum
                tracker.set_phase("backward")
                if scaler is not None:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
                del loss, ids, labels
                tracker.region = None
            tracker.set_phase("optimizer")
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            for t in _optimizer_tensors(opt):
                tracker.tag_tensor(t, "optimizer")
            opt.zero_grad(set_to_none=True)
    finally:
        for h in handles:
            h.remove()
    tracker.set_phase("setup")
    res = analyse(tracker, steps, step_starts)
    res.micro_batches_per_step = micro
    res.steps = steps
    res.notes = notes
    if scaler is not None:
        res.notes.append("fp16-amp: GradScaler.scale/step/update included")
    return res


# ---------------------------------------------------------------------------------------
# analysis
# ---------------------------------------------------------------------------------------
def analyse(tracker: Any, steps: int, step_starts: list[int]) -> TraceResult:
    from cabe.trace.allocator import replay
    from cabe.trace.tracker import COMPONENTS, PHASES

    curve = tracker.curve()
    n = len(curve)
    last_start = step_starts[-1]
    # the level when the last step begins, then every event of the last step
    start_level = curve[last_start - 1] if last_start > 0 else 0
    peak = start_level
    peak_i = last_start - 1
    phase_peaks = dict.fromkeys(("forward", "backward", "optimizer"), 0)
    ev_phase = tracker.event_phase
    for i in range(last_start, n):
        v = curve[i]
        if v > peak:
            peak = v
            peak_i = i
        ph = PHASES[ev_phase[i]]
        if ph in phase_peaks and v > phase_peaks[ph]:
            phase_peaks[ph] = v
    # step 1 peak, for comparison
    first_end = step_starts[1] if len(step_starts) > 1 else n
    first_peak = max(curve[step_starts[0] : first_end], default=0)

    live = tracker.replay(peak_i) if peak_i >= 0 else set()
    live -= tracker.ignored
    comps = dict.fromkeys(COMPONENTS, 0)
    size = tracker.size
    for aid in live:
        comps[tracker.classify(aid)] += size[aid]
    assert sum(comps.values()) == peak, (sum(comps.values()), peak)
    peak_phase = PHASES[ev_phase[peak_i]] if peak_i >= 0 else "setup"
    if peak_phase == "setup":
        peak_phase = "forward"
    top = sorted(live, key=lambda a: -size[a])[:15]
    top_allocations = [
        {
            "bytes": size[a],
            "component": tracker.classify(a),
            "op": tracker.op_of[a],
            "phase": PHASES[tracker.phase_of[a]],
            "step": tracker.step_of[a],
        }
        for a in top
    ]

    # timeline: at most TIMELINE_POINTS samples, each the max of its bucket
    timeline: list[tuple[int, str, int]] = []
    if n:
        bucket = max(1, -(-n // TIMELINE_POINTS))
        for s in range(0, n, bucket):
            j = max(range(s, min(n, s + bucket)), key=lambda k: curve[k])
            timeline.append((j, PHASES[ev_phase[j]], curve[j]))
    events = [
        e
        for e in tracker.events
        if (e if e > 0 else -e) - 1 not in tracker.paged and (e if e > 0 else -e) - 1 not in tracker.ignored
    ]
    sizes = list(tracker.size)
    st = replay(sizes, events)
    st_exp = replay(sizes, events, expandable_segments=True)
    paged = sum(tracker.raw_size[a] for a in tracker.paged)
    return TraceResult(
        peak_bytes=peak,
        peak_phase=peak_phase,
        components=comps,
        phase_peaks=phase_peaks,
        timeline=timeline,
        reserved_bytes=st.peak_reserved_bytes,
        reserved_bytes_expandable=st_exp.peak_reserved_bytes,
        allocator_allocated_bytes=st.peak_allocated_bytes,
        segments=st.peak_segments,
        paged_bytes=paged,
        first_step_peak_bytes=first_peak,
        events=n,
        peak_event=peak_i,
        step_starts=step_starts,
        top_allocations=top_allocations,
        alloc_sizes=sizes,
        alloc_events=events,
    )


# ---------------------------------------------------------------------------------------
# layer inventory
# ---------------------------------------------------------------------------------------
def _inventory(
    model: Any, cfg: Any, setup: TrainingSetup, device: Any, tracker: Any, astate: Any
) -> list[dict[str, Any]]:
    import torch

    from cabe.trace.tracker import round_up

    layers = decoder_layers(model, cfg)
    layer0 = layers[0]
    names = {m: n for n, m in layer0.named_modules()}
    stack: list[str] = []
    active = [False]
    rows: list[dict[str, Any]] = []
    keys: list[int] = []
    seen: dict[int, int] = {}

    def pre(mod: Any, args: Any) -> None:
        stack.append(names.get(mod, "?"))
        if mod is layer0:
            active[0] = True

    def post(mod: Any, args: Any, out: Any) -> None:
        if stack:
            stack.pop()
        if mod is layer0:
            active[0] = False

    handles = []
    for m in layer0.modules():
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))

    params = {p.untyped_storage()._cdata: n for n, p in model.named_parameters()}

    def pack(t: Any) -> Any:
        if active[0] and isinstance(t, torch.Tensor) and t.device.type == device.type:
            key = t.untyped_storage()._cdata
            aid = tracker.live.get(key)
            nbytes = t.untyped_storage().nbytes()
            if key in params:
                kind = "parameter"
            elif aid is not None and aid in tracker.copy_of_weight:
                kind = "weight_copy"
            else:
                kind = "activation"
            mod = next((s for s in reversed(stack) if s), "") or "(layer)"
            row = {
                "module": mod,
                "op": tracker.op_of[aid] if aid is not None else "",
                "grad_fn": type(t.grad_fn).__name__ if t.grad_fn is not None else ("leaf" if t.requires_grad else ""),
                "shape": list(t.shape),
                "dtype": str(t.dtype).replace("torch.", ""),
                "bytes": round_up(nbytes),
                "kind": kind,
                "shared_with": None,
                "name": params.get(key),
            }
            if key in seen:
                row["shared_with"] = seen[key]
                row["bytes"] = 0
            else:
                seen[key] = len(rows)
            rows.append(row)
            keys.append(key)
        return t

    amp = autocast_dtype(setup)
    ids, labels = _inputs(cfg, setup, device)
    tracker.set_phase("forward")
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            ctx = torch.autocast("cuda", dtype=amp) if amp is not None else contextlib.nullcontext()
            with ctx:
                out = model(input_ids=ids, labels=labels, use_cache=False)
        saved_by = _saved_by(out.loss, device)
        del out
    finally:
        for h in handles:
            h.remove()
    for r, key in zip(rows, keys):
        r["saved_by"] = ",".join(sorted(set(saved_by.get(key, []))))
    return rows


def _saved_by(loss: Any, device: Any) -> dict[int, list[str]]:
    """storage key -> names of the autograd nodes that hold it as a saved tensor."""
    import torch

    out: dict[int, list[str]] = {}
    stack = [loss.grad_fn]
    seen: set[int] = set()
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        name = type(fn).__name__
        values: list[Any] = []
        for attr in dir(fn):
            if attr.startswith("_saved_") or attr == "saved_tensors":
                try:
                    v = getattr(fn, attr)
                except Exception:
                    continue
                values.extend(v if isinstance(v, (tuple, list)) else (v,))
        for x in values:
            if isinstance(x, torch.Tensor) and x.device.type == device.type:
                out.setdefault(x.untyped_storage()._cdata, []).append(name)
        for nxt, _ in fn.next_functions:
            stack.append(nxt)
    return out


# ---------------------------------------------------------------------------------------
# public entry points
# ---------------------------------------------------------------------------------------
def _check_setup(setup: Any) -> TrainingSetup:
    if not isinstance(setup, TrainingSetup):
        raise ConfigError("bad_setup", "setup")
    return setup


def trace_step(config: dict[str, Any], setup: TrainingSetup, *, steps: int = 2, mode: str = "auto") -> TraceResult:
    """Trace ``steps`` training steps of the model ``config`` trained as ``setup``.

    Raises :class:`~cabe.errors.ConfigError` for configs transformers cannot build and
    :class:`~cabe.errors.MissingDependencyError` when the ``[trace]`` extra is missing.
    """
    setup = _check_setup(setup)
    import_deps(setup)
    if not isinstance(steps, int) or isinstance(steps, bool) or not 2 <= steps <= 100:
        raise ConfigError("out_of_range", "steps", value=steps, minimum=2, maximum=100)
    kind = resolve_mode(mode, setup)
    if kind == "fake-subprocess":
        return TraceResult.from_json(_subprocess("trace", config, setup, steps))
    try:
        return run_trace(config, setup, steps, kind)
    except CabeError:
        raise
    except MemoryError:
        raise
    except Exception as exc:  # an architecture or op the simulation cannot run
        raise ConfigError("trace_failed", None, reason=f"{type(exc).__name__}: {str(exc)[:400]}") from exc


def layer_inventory(config: dict[str, Any], setup: TrainingSetup, *, mode: str = "auto") -> list[dict[str, Any]]:
    """Tensors decoder layer 0 saves for backward during one forward (checkpointing off).

    Each row: ``module`` (path inside the layer), ``op`` (the aten op that allocated the
    storage), ``saved_by`` (the autograd node(s) holding it for backward), ``grad_fn`` (the
    node that produced the tensor), ``shape``, ``dtype``,
    ``bytes`` (the storage, rounded to 512 B; 0 when the storage was already listed -- see
    ``shared_with``), ``kind`` (activation | parameter | weight_copy), ``name`` (parameter name).
    """
    setup = _check_setup(setup)
    import_deps(setup)
    if setup.checkpointing:
        setup = setup.with_(checkpointing=False)
    kind = resolve_mode(mode, setup)
    if kind == "fake-subprocess":
        return _subprocess("inventory", config, setup, 1)["rows"]
    try:
        return run_trace(config, setup, 1, kind, inventory=True)
    except CabeError:
        raise
    except Exception as exc:
        raise ConfigError("trace_failed", None, reason=f"{type(exc).__name__}: {str(exc)[:400]}") from exc


class _Worker:
    """A long-lived ``python -m cabe.trace._worker --serve`` (torch is imported once)."""

    def __init__(self) -> None:
        import threading

        self.proc: Any = None
        self.lock = threading.Lock()

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            for _attempt in (0, 1):
                if self.proc is None or self.proc.poll() is not None:
                    env = dict(os.environ)
                    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
                    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
                    self.proc = subprocess.Popen(
                        [sys.executable, "-m", "cabe.trace._worker", "--serve"],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                        text=True,
                        env=env,
                    )
                try:
                    self.proc.stdin.write(json.dumps(payload) + "\n")
                    self.proc.stdin.flush()
                    line = self.proc.stdout.readline()
                except (BrokenPipeError, OSError):
                    line = ""
                if line:
                    return json.loads(line)
                self.proc = None  # died (e.g. killed for memory): one fresh try
            raise ConfigError("trace_failed", None, reason="the trace worker process exited")


_WORKER = _Worker()


def _subprocess(
    fn: str, config: dict[str, Any], setup: TrainingSetup, steps: int, include_events: bool = False
) -> dict[str, Any]:
    """Run one trace in a worker interpreter where the fake-CUDA shim precedes torch."""
    out = _WORKER.request(
        {"fn": fn, "config": config, "setup": setup.to_dict(), "steps": steps, "include_events": include_events}
    )
    if "error" in out:
        err = out["error"]
        import cabe.errors as errors

        cls = getattr(errors, err.get("type", "ConfigError"), ConfigError)
        if not (isinstance(cls, type) and issubclass(cls, CabeError)):
            cls = ConfigError
        raise cls(err["code"], err.get("field"), **err.get("params", {}))
    return out
