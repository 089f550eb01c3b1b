"""What a trace patches for its duration: fake CUDA (device queries, placeholder kernels), SDPA routed
through the CUDA backend choice, the transformers and bitsandbytes hooks that would block tracing, and the
patches of the traced family only (:mod:`cabe.trace.family_patches`). Every private name of transformers is fetched
through :func:`cabe.trace.compat.require`: a release without it refuses in one sentence, never an AttributeError.
Everything is undone when :func:`trace_environment` exits."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Iterator
from typing import Any

from cabe.trace import _native, compat, family_patches, state
from cabe.trace.deps import needs_bitsandbytes, needs_peft
from cabe.trace.inputs import has_documents
from cabe.training import TrainingSetup


class _Patch:
    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []

    def set(self, obj: Any, name: str, value: Any) -> None:
        # a class's own attribute is kept as it is stored (a staticmethod or classmethod, not what getattr binds), so
        # restoring it puts the same descriptor back
        own = isinstance(obj, type) and name in vars(obj)
        self._undo.append((obj, name, vars(obj)[name] if own else getattr(obj, name, None)))
        setattr(obj, name, value)

    def restore(self) -> None:
        for obj, name, old in reversed(self._undo):
            setattr(obj, name, old)
        self._undo.clear()


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


def _find_packed_sequence_indices(position_ids: Any) -> None:
    """``transformers.masking_utils.find_packed_sequence_indices`` for unpacked batches."""
    import torch

    first_dummy_value = position_ids[:, :1] - 1
    position_diff = torch.diff(position_ids, prepend=first_dummy_value, dim=-1)
    packed_sequence_mask = (position_diff != 1).cumsum(-1)
    _ = (packed_sequence_mask[:, -1] == 0).all()  # True for a batch of whole sequences
    return None


def _packed_sequence_indices(position_ids: Any) -> Any:
    """``transformers.masking_utils.find_packed_sequence_indices`` for packed rows (masking_utils.py:756-764):
    the documents' indices, without the data-dependent test for "no document starts inside a row" (the trace's
    packed rows always have some, cabe.trace.inputs.packed_positions)."""
    import torch

    first_dummy_value = position_ids[:, :1] - 1
    position_diff = torch.diff(position_ids, prepend=first_dummy_value, dim=-1)
    return (position_diff != 1).cumsum(-1)


def _route_sdpa(p: _Patch) -> None:
    """``F.scaled_dot_product_attention`` through the CUDA backend choice of the current trace."""
    import torch

    from cabe.trace.attention import routed_sdpa

    p.set(
        torch.nn.functional,
        "scaled_dot_product_attention",
        functools.partial(routed_sdpa, state.current(), torch.nn.functional.scaled_dot_product_attention),
    )


def _cuda_dropout(p: _Patch) -> None:
    """at::dropout uses the fused native_dropout (1-byte mask) only for CUDA tensors
    (is_fused_kernel_acceptable); meta tensors would take the float-mask path."""
    import torch

    real_dropout = torch.nn.functional.dropout

    def cuda_dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if training and 0.0 < p < 1.0 and not inplace and input.numel() > 0:
            return torch.ops.aten.native_dropout(input, p, True)[0]
        return real_dropout(input, p, training, inplace)

    p.set(torch.nn.functional, "dropout", cuda_dropout)


class _Props:
    name = "cabe fake H100"
    major, minor = 9, 0
    total_memory = 80 * 2**30
    multi_processor_count = 132


def _fake_cuda(p: _Patch) -> None:
    """The shim's fake device on, placeholder kernels, and ``torch.cuda`` answering as one H100."""
    import torch

    _native.enable(True)
    _register_cuda_placeholders()
    p.set(torch.cuda, "is_available", lambda: True)
    p.set(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    p.set(torch.cuda, "device_count", lambda: 1)
    p.set(torch.cuda, "current_device", lambda: 0)
    p.set(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    p.set(torch.cuda, "get_device_properties", lambda *a, **k: _Props())
    p.set(torch.cuda, "synchronize", lambda *a, **k: None)
    p.set(torch.cuda, "empty_cache", lambda *a, **k: None)
    _tensor_data_to_fake_cuda(p)


def _tensor_data_to_fake_cuda(p: _Patch) -> None:
    """``torch.tensor(data, device="cuda")`` made as the host tensor moved to the device.

    ``torch.tensor`` builds its tensor from Python data in C++ (``internal_new_from_data``, with the Python
    dispatch keys excluded), so FakeTensorMode never sees it and a CPU-only build has no CUDA kernel to make
    it: GPT-Neo's eager attention (``torch.tensor(mask_value, device=...)``, modeling_gpt_neo.py:120 in
    transformers 5.24), XLM and CPM-Ant failed there. Moving the host tensor with ``.to`` does not help: the
    fake mode keeps a host tensor's values as a constant and runs ops on constants for real
    (fake_tensor.py:2703-2729, torch 2.13), on a CUDA the build lacks. So the tensor is made with
    ``torch.empty`` of its shape and dtype on the device: the allocation CUDA makes, through the fake mode
    and the tracker; its values are lost, as every fake tensor's are."""
    import torch

    real = torch.tensor

    @functools.wraps(real)
    def tensor(data: Any, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is None or torch.device(device).type != "cuda":
            return real(data, *args, **kwargs)
        grad = bool(kwargs.pop("requires_grad", False))
        host = real(data, *args, **{k: v for k, v in kwargs.items() if k not in ("device", "pin_memory")})
        return torch.empty(host.shape, dtype=host.dtype, device=device, requires_grad=grad)

    # torch.utils._device caches its set of factory functions (an lru_cache of the functions then in ``torch``), by
    # identity. The wrapper above calls the real ``torch.tensor``, which ``with torch.device("meta")`` must still
    # redirect: the set is built now, before the patch, so that it holds the real function (built while the
    # patch stood it held only the wrapper, and phi-4-mini's longrope ``torch.tensor(factors) * meta arange``
    # failed, meta against cpu, in that trace and in any meta build after it).
    from torch.utils._device import _device_constructors

    _device_constructors.cache_clear()
    _device_constructors()
    p.set(torch, "tensor", tensor)


def _bnb_host_side(p: _Patch, bnb_opt: Any) -> None:
    """bitsandbytes' optimizer without device syncs, its quantisation map built on the host."""
    import bitsandbytes.functional as bnb_f
    import torch
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


@contextlib.contextmanager
def trace_environment(kind: str, setup: TrainingSetup, model_types: tuple[str, ...] = ()) -> Iterator[None]:
    """Patches for the duration of one trace (``kind``: fake | meta | cpu | cuda) of a model of ``model_types``
    (:func:`cabe.trace.family_patches.model_types` of its config: which families' patches to apply)."""
    import torch

    mu = compat.module("masking_utils", compat.EVERY_FAMILY)

    bnb_opt: Any = None
    if needs_bitsandbytes(setup):
        import bitsandbytes  # (imported before torch.cuda is patched)
        import bitsandbytes.optim.optimizer as bnb_opt
    if needs_peft(setup):
        import peft  # noqa: F401

        # PEFT 0.22 imports bitsandbytes lazily, inside get_peft_model, whenever it is installed
        # (peft/tuners/lora/model.py _create_new_module: "avoid eager bnb import" -> lora/bnb.py); under the patched
        # torch.cuda that import would load bitsandbytes' CUDA backend, which reads torch._C._cuda_getCurrentRawStream,
        # absent from a CPU torch. PEFT 0.21 imported it with peft itself; import it here, before the patch, likewise.
        if importlib.util.find_spec("bitsandbytes") is not None:
            import bitsandbytes  # noqa: F401

    p = _Patch()
    try:
        if kind in ("fake", "meta"):
            _route_sdpa(p)
        if kind == "meta":
            _cuda_dropout(p)
        # transformers reads position_ids to detect packed sequences (a data-dependent branch);
        # a batch of whole sequences has none. Same tensor ops as the original, answer None.
        packed = has_documents(setup)
        compat.require(mu, "find_packed_sequence_indices", compat.EVERY_FAMILY)
        p.set(mu, "find_packed_sequence_indices", _packed_sequence_indices if packed else _find_packed_sequence_indices)
        family_patches.install(p, kind, model_types)
        if kind == "fake" and not torch.cuda.is_available() and _native.available():
            _fake_cuda(p)
        if bnb_opt is not None and kind != "cuda":
            _bnb_host_side(p, bnb_opt)
        yield
    finally:
        p.restore()
        # torch.utils._device's cache of factory functions: rebuilt from the restored functions on next use
        # (see _tensor_data_to_fake_cuda)
        from torch.utils._device import _device_constructors

        _device_constructors.cache_clear()
        if kind == "fake":
            _native.enable(False)
