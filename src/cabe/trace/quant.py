"""QLoRA: a bitsandbytes 4-bit frozen base, built on meta and materialised on fake CUDA.

What QLoRA users run is ``from_pretrained(..., quantization_config=BitsAndBytesConfig(
load_in_4bit=True, bnb_4bit_quant_type=..., bnb_4bit_use_double_quant=...,
bnb_4bit_compute_dtype=...), dtype=<compute dtype>)``, then
``peft.prepare_model_for_kbit_training`` (freezes everything, casts every non-4-bit
fp16/bf16 parameter -- norms, embeddings, ``lm_head`` -- to fp32, optionally enables
gradient checkpointing) and ``get_peft_model`` with LoRA. transformers' bitsandbytes
integration replaces every ``nn.Linear`` except the output embedding (``lm_head``, see
``get_keys_to_not_convert``) with ``bnb.nn.Linear4bit``.

``bnb.nn.Params4bit`` cannot wrap a FakeTensor, so the module's ``weight`` here is a plain
frozen uint8 ``Parameter`` carrying the attributes bitsandbytes and PEFT read
(``quant_state``, ``quant_type``, ``compress_statistics``); ``Linear4bit.forward`` and
``bnb.matmul_4bit`` then run unchanged. The quantisation state mirrors
``bitsandbytes.functional.quantize_4bit`` (0.50) tensor for tensor:

* packed weight: ``((n*k + 1) // 2, 1)`` uint8 (0.5 B/param);
* ``absmax``: one per 64-element block, fp32 -- or, with double quantisation, uint8, plus
  ``offset`` (fp32 scalar), ``state2.absmax`` (fp32, one per 256 absmax values) and
  ``state2.code`` (a 256-entry fp32 copy of the dynamic map);
* ``code``: the 16-entry fp32 NF4/FP4 table, one per layer (``get_4bit_type``).

Every one of these is its own CUDA allocation (at least 512 B). bitsandbytes also caches one
dynamic map per device (``name2qmap["dynamic"]``), allocated once.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from cabe.units import round_alloc

BLOCKSIZE = 64
BLOCKSIZE2 = 256


def _ceil(a: int, b: int) -> int:
    return (a + b - 1) // b


def quant_tensor_specs(n_out: int, n_in: int, double_quant: bool) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shapes and dtypes of the tensors bitsandbytes keeps for one 4-bit weight."""
    numel = n_out * n_in
    blocks = _ceil(numel, BLOCKSIZE)
    specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        "weight": (((numel + 1) // 2, 1), torch.uint8),
        "code": ((16,), torch.float32),
    }
    if double_quant:
        specs["absmax"] = ((blocks,), torch.uint8)
        specs["offset"] = ((), torch.float32)
        specs["state2.absmax"] = ((_ceil(blocks, BLOCKSIZE2),), torch.float32)
        specs["state2.code"] = ((256,), torch.float32)
    else:
        specs["absmax"] = ((blocks,), torch.float32)
    return specs


def quantize_on_meta(model: Any, setup: Any, store_dtype: torch.dtype) -> list[torch.nn.Module]:
    """Replace the model's linear layers (but the LM head) by 4-bit ``bnb.nn.Linear4bit``.

    As transformers' ``replace_with_bnb_linear`` does: ``isinstance(module, Conv1D) or type(module) is
    nn.Linear`` -- GPT-2's Conv1D is quantized (its weight is stored transposed), subclasses of
    ``nn.Linear`` such as Falcon's ``FalconLinear`` are not.
    """
    import bitsandbytes as bnb
    from transformers.pytorch_utils import Conv1D

    compute = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[setup.compute_dtype]
    head = model.get_output_embeddings()
    replaced: list[torch.nn.Module] = []
    child: Any  # nn.Linear or Conv1D; both get in/out_features and bnb's attributes set on them
    new: Any
    w: Any
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            conv1d = isinstance(child, Conv1D)
            if (type(child) is not torch.nn.Linear and not conv1d) or child is head:
                continue
            if conv1d:  # Conv1D keeps weight as (in, out)
                child.in_features, child.out_features = child.weight.shape[0], child.weight.shape[1]
            new = bnb.nn.Linear4bit(
                child.in_features,
                child.out_features,
                bias=child.bias is not None,
                compute_dtype=compute,
                compress_statistics=setup.double_quant,
                quant_type=setup.quant,
                quant_storage=torch.uint8,
                device="meta",
            )
            specs = quant_tensor_specs(child.out_features, child.in_features, setup.double_quant)
            shape, dtype = specs["weight"]
            w = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"), requires_grad=False)
            w.quant_type = setup.quant
            w.compress_statistics = setup.double_quant
            w.quant_state = None
            new._parameters["weight"] = w
            if child.bias is not None:
                new.bias = torch.nn.Parameter(torch.empty(child.out_features, dtype=store_dtype, device="meta"))
            new._cabe_shape = (child.out_features, child.in_features)
            new._cabe_store_dtype = store_dtype
            new.train(child.training)
            setattr(parent, name, new)
            replaced.append(new)
    model.is_loaded_in_4bit = True
    return replaced


def materialize(model: Any, setup: Any, device: torch.device, tracker: Any) -> int:
    """After ``to_empty``: attach a QuantState of real (fake) device tensors to every 4-bit layer.

    Returns the number of bytes (rounded per allocation) of quantisation state created.
    """
    import bitsandbytes as bnb
    from bitsandbytes.functional import QuantState

    total = 0
    dyn = None
    m: Any  # bnb Linear4bit carrying cabe's _cabe_shape / _cabe_store_dtype
    w: Any
    if setup.double_quant:
        dyn = torch.empty((256,), dtype=torch.float32, device=device)  # name2qmap["dynamic"]
        tracker.tag_tensor(dyn, "weights")
        model._cabe_dynamic_map = dyn
    for m in model.modules():
        if not isinstance(m, bnb.nn.Linear4bit) or not hasattr(m, "_cabe_shape"):
            continue
        n_out, n_in = m._cabe_shape  # type: ignore[misc]  # set by quantize_on_meta
        specs = quant_tensor_specs(n_out, n_in, setup.double_quant)

        def mk(key: str, specs: dict[str, Any] = specs) -> torch.Tensor:
            shape, dtype = specs[key]
            t = torch.empty(shape, dtype=dtype, device=device)
            tracker.tag_tensor(t, "weights")
            return t

        code = mk("code")
        absmax = mk("absmax")
        state2 = None
        offset = None
        if setup.double_quant:
            offset = mk("offset")
            s2_absmax = mk("state2.absmax")
            s2_code = mk("state2.code")
            state2 = QuantState(absmax=s2_absmax, code=s2_code, blocksize=BLOCKSIZE2, dtype=torch.float32)
        qs = QuantState(
            absmax=absmax,
            shape=torch.Size((n_out, n_in)),
            dtype=m._cabe_store_dtype,
            blocksize=BLOCKSIZE,
            code=code,
            quant_type=setup.quant,
            offset=offset,
            state2=state2,
        )
        w = m.weight
        w.quant_state = qs
        w.quant_type = setup.quant
        w.compress_statistics = setup.double_quant
        m.quant_state = qs
        for key in specs:
            shape, dtype = specs[key]
            total += round_alloc(math.prod(shape) * dtype.itemsize)
    return total


def fill_real(model: Any) -> None:
    """Give real (CPU/CUDA) 4-bit layers plausible contents: random codes, the NF4/FP4 table,
    small scales. Only for runs with real tensors; allocates nothing that stays."""
    import bitsandbytes as bnb
    from bitsandbytes.functional import create_dynamic_map, get_4bit_type

    with torch.no_grad():
        for m in model.modules():
            if not isinstance(m, bnb.nn.Linear4bit) or not hasattr(m, "_cabe_shape"):
                continue
            qs = m.weight.quant_state  # type: ignore[attr-defined]  # bnb Params4bit
            m.weight.random_(0, 256)
            qs.code.copy_(get_4bit_type(qs.quant_type, device="cpu"))
            if qs.nested:
                qs.absmax.random_(0, 256)
                qs.offset.fill_(0.02)
                qs.state2.absmax.fill_(0.01)
                qs.state2.code.copy_(create_dynamic_map(signed=True))
            else:
                qs.absmax.fill_(0.02)


def gemm_4bit_scratch(tracker: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """``bitsandbytes::gemm_4bit`` as the CUDA backend (bitsandbytes/backends/cuda/ops.py) runs it.

    For M = tokens > 1536 (``_gemm_4bit_custom_max_m``), and for misaligned K, it takes
    ``_dequant_linear_fallback``: it dequantises the absmax (fp32, one per block, then
    ``+ offset``: a second fp32 buffer), dequantises the weight into an (N, K) buffer of the
    input dtype, and calls ``F.linear``. Those buffers live until the op returns. Smaller M
    uses the fused kernel, which allocates only the output.
    """
    A = args[0]
    shapeB = args[2]
    blocksize = args[4]
    absmax_8bit = kwargs.get("absmax_8bit", args[7] if len(args) > 7 else None)
    K = A.shape[-1]
    M = A.numel() // K if K else 0
    N = shapeB[0]
    if not (M > 1536 or K % blocksize != 0):
        return NotImplemented
    frees = []
    if absmax_8bit is not None:
        n_abs = absmax_8bit.numel()
        frees.append(tracker.scratch(n_abs * 4, "gemm_4bit.absmax_dq"))
        frees.append(tracker.scratch(n_abs * 4, "gemm_4bit.absmax_plus_offset"))
    frees.append(tracker.scratch(N * K * A.element_size(), "gemm_4bit.B_dequantized"))
    out = func(*args, **kwargs)
    tracker.record(out, "gemm_4bit")
    for f in reversed(frees):
        f()
    return out
