"""Units, the allocator's rounding, and how a byte count is written.

- ``GB`` = 10**9 bytes (what vendors print on the card), ``GiB`` = 2**30 bytes (what
  ``torch.cuda.memory_allocated`` divided by 1024**3 shows). Every figure cabe prints names its unit.
- ``round_alloc``: the CUDA caching allocator hands out blocks in multiples of 512 bytes
  (``kMinBlockSize`` = 512 in c10/cuda/CUDACachingAllocator.cpp, ``round_size``), so a tensor of
  ``n`` bytes occupies ``round_alloc(n)``. Zero-byte tensors get no block (``malloc(0)`` returns
  ``nullptr`` there), hence 0 -> 0.
- ``fmt_bytes``: the chosen unit first, the other in parentheses, numbers in the user's language.
"""

from __future__ import annotations

from cabe.errors import InvalidValueError
from cabe.i18n import LANGS, fmt_number

GB = 10**9
GiB = 2**30

#: Granularity of the CUDA caching allocator (kMinBlockSize).
ALLOC_BLOCK = 512

#: The units a user may ask figures in.
UNITS = ("GB", "GiB")


def check_output(units: str, lang: str | None = None) -> None:
    """Refuse a unit (``TB``) or a language (``xx``) the answer cannot be written in, instead of falling
    back to a default without a word (``bad_choice``)."""
    if units not in UNITS:
        raise InvalidValueError("bad_choice", "units", value=units, allowed=", ".join(UNITS))
    if lang is not None and lang not in LANGS:
        raise InvalidValueError("bad_choice", "lang", value=lang, allowed=", ".join(LANGS))


def round_alloc(nbytes: int) -> int:
    """Bytes the caching allocator reserves for a tensor of ``nbytes``: a multiple of 512, 0 for 0."""
    return -(-nbytes // ALLOC_BLOCK) * ALLOC_BLOCK if nbytes > 0 else 0


def fmt_bytes(n: int, lang: str, units: str = "GB", both: bool = True) -> str:
    """``7.5 GB (6.98 GiB)``: two decimals below 10 units, one above; ``both=False`` drops the second."""
    gb = f"{fmt_number(n / GB, lang, 2 if n < 10 * GB else 1)} GB"
    gib = f"{fmt_number(n / GiB, lang, 2 if n < 10 * GiB else 1)} GiB"
    first, second = (gib, gb) if units == "GiB" else (gb, gib)
    return f"{first} ({second})" if both else first


#: cuBLAS's workspace per (handle, stream) on an sm90 GPU (H100/H200), held by PyTorch's caching allocator:
#: aten/src/ATen/cuda/CublasHandlePool.cpp, ``parseChosenWorkspaceSize`` (``sm90 ? 4096 * 8 * 1024 :
#: 4096 * 1024 * 2 + 16 * 1024 * 8``; cuBLASLt shares it by default). Handles come from a thread-local pool
#: and autograd runs CUDA backward on its own device thread (torch/csrc/autograd/engine.cpp), so a training
#: step holds two: the forward's and the backward's. On an H200 max_memory_allocated exceeds every tensor by
#: exactly these 64 MiB (benchmarks/gpu/results/grid.md). Pre-Hopper GPUs use 8.125 MiB each.
CUBLAS_WORKSPACE = 4096 * 8 * 1024
CUDA_WORKSPACES = 2 * CUBLAS_WORKSPACE
