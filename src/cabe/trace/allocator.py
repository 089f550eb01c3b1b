"""A model of PyTorch's CUDA caching allocator, to turn a malloc/free sequence into reserved memory.

Ported from ``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch main, read for this module;
names below are the C++ names), for one device and one stream:

* ``round_size``: requests below ``kMinBlockSize`` = 512 B become 512 B, others are rounded
  up to a multiple of 512 (``roundup_power2_divisions`` is off by default).
* ``get_pool``: ``size <= kSmallSize`` (1 MiB) -> small pool, else large pool.
* ``get_allocation_size``: a new segment is ``kSmallBuffer`` (2 MiB) for small requests,
  ``kLargeBuffer`` (20 MiB) for requests under ``kMinLargeAlloc`` (10 MiB), else the request
  rounded up to ``kRoundLarge`` (2 MiB).
* ``get_free_block``: best fit -- the smallest cached free block of the pool with
  ``size >= request`` (``std::set`` ordered by (stream, size, address): ties go to the lowest
  address); with ``max_split_size`` set, a request below it never takes a block at or above
  it, and a request at or above it only takes a block less than ``kLargeBuffer`` larger.
* ``should_split``: small pool (or expandable segments): split when the remainder is
  >= 512 B; large pool: split when ``size < max_split_size`` and the remainder > ``kSmallSize``.
  An unsplit remainder stays part of the allocated block -- and of
  ``memory_allocated()`` (``allocated_bytes`` adds ``block->size``).
* ``free_block`` / ``try_merge_blocks``: a freed block merges with free neighbours of the
  same segment; segments are never returned to the driver (``release_cached_blocks`` only
  runs when ``cudaMalloc`` fails or on ``empty_cache()``, neither of which is modelled: the
  GPU is assumed large enough).
* ``expandable_segments:True`` (``Note [Expandable Segments]``): one growing segment per pool
  whose physical memory is mapped in pages of 2 MiB (small pool) or 20 MiB (large pool);
  a request maps just the pages it needs at the lowest free address (the end), merging with
  a free block before the unmapped tail (``find_expandable_block`` / ``map_block``); every
  split is allowed.

The result is what ``torch.cuda.max_memory_reserved()`` would report for the traced
sequence (``reserved_bytes``) and what ``max_memory_allocated()`` would report
(``allocated_bytes``, which exceeds the sum of rounded tensor sizes by unsplit remainders).

CUDA context: memory the driver and libraries take outside the caching allocator; see
:data:`CUDA_CONTEXT_ESTIMATES`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

kMinBlockSize = 512
kSmallSize = 1048576
kSmallBuffer = 2097152
kLargeBuffer = 20971520
kMinLargeAlloc = 10485760
kRoundLarge = 2097152
SIZE_MAX = 2**64 - 1

#: GiB outside the caching allocator once CUDA, cuBLAS and a first kernel are initialised:
#: CUDA context + kernel images (lazy module loading, the default since CUDA 11.7) + cuBLAS/
#: cuBLASLt handles. Basis: commonly reported ``nvidia-smi`` minus ``memory_reserved()`` for a
#: PyTorch 2.x process right after its first matmul (CUDA 12.x); NOT measured in this
#: project -- replace with ``cabe measure`` figures when a GPU run is available. The spread
#: between CUDA versions and drivers is about +-0.15 GiB.
CUDA_CONTEXT_ESTIMATES: dict[str, tuple[float, str]] = {
    "sm70": (0.35, "V100"),
    "sm75": (0.35, "T4, RTX 20xx"),
    "sm80": (0.45, "A100, A800"),
    "sm86": (0.40, "A10, A40, RTX 30xx"),
    "sm89": (0.45, "L4, L40S, RTX 40xx"),
    "sm90": (0.55, "H100, H200, H800"),
    "sm100": (0.70, "B200, B300"),
    "sm120": (0.60, "RTX 50xx"),
}


def cuda_context_bytes(arch: str = "sm90") -> int:
    """Estimated bytes of CUDA context etc. for a GPU architecture (see the table)."""
    gib = CUDA_CONTEXT_ESTIMATES.get(arch, CUDA_CONTEXT_ESTIMATES["sm90"])[0]
    return int(gib * 2**30)


def round_size(size: int) -> int:
    if size < kMinBlockSize:
        return kMinBlockSize
    return kMinBlockSize * ((size + kMinBlockSize - 1) // kMinBlockSize)


def get_allocation_size(size: int) -> int:
    if size <= kSmallSize:
        return kSmallBuffer
    if size < kMinLargeAlloc:
        return kLargeBuffer
    return kRoundLarge * ((size + kRoundLarge - 1) // kRoundLarge)


class _Block:
    __slots__ = ("allocated", "expandable", "mapped", "next", "prev", "ptr", "size", "small")

    def __init__(self, ptr: int, size: int, small: bool, expandable: bool = False) -> None:
        self.ptr = ptr
        self.size = size
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.small = small
        self.mapped = True
        self.expandable = expandable


class _Pool:
    """Free, mapped blocks of one pool, ordered like ``BlockComparatorSize`` (size, address)."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[tuple[int, int], _Block] = {}

    def insert(self, b: _Block) -> None:
        k = (b.size, b.ptr)
        bisect.insort(self.keys, k)
        self.blocks[k] = b

    def erase(self, b: _Block) -> None:
        k = (b.size, b.ptr)
        i = bisect.bisect_left(self.keys, k)
        if i < len(self.keys) and self.keys[i] == k:
            del self.keys[i]
            del self.blocks[k]

    def lower_bound(self, size: int) -> int:
        return bisect.bisect_left(self.keys, (size, -1))


@dataclass
class AllocatorStats:
    reserved_bytes: int = 0  # current
    peak_reserved_bytes: int = 0  # max_memory_reserved()
    allocated_bytes: int = 0
    peak_allocated_bytes: int = 0  # max_memory_allocated()
    segments: int = 0
    peak_segments: int = 0


class CachingAllocatorModel:
    """Replays mallocs and frees (one device, one stream) through the caching allocator's rules."""

    def __init__(self, *, max_split_size: int | None = None, expandable_segments: bool = False) -> None:
        self.max_split = SIZE_MAX if max_split_size is None else max_split_size
        self.expandable = expandable_segments
        self.pools = {True: _Pool(True), False: _Pool(False)}
        self.stats = AllocatorStats()
        self._next_ptr = 1 << 40  # fake device addresses, increasing per segment
        # expandable segments: the unmapped tail block of each pool's segment
        self._tail: dict[bool, _Block | None] = {True: None, False: None}

    # ---- helpers ------------------------------------------------------------------------
    def _reserve(self, nbytes: int, new_segment: bool) -> None:
        s = self.stats
        s.reserved_bytes += nbytes
        s.peak_reserved_bytes = max(s.peak_reserved_bytes, s.reserved_bytes)
        if new_segment:
            s.segments += 1
            s.peak_segments = max(s.peak_segments, s.segments)

    def _get_free_block(self, pool: _Pool, size: int) -> _Block | None:
        i = pool.lower_bound(size)
        if i >= len(pool.keys):
            return None
        if self.expandable:
            # best fit by the size a block can grow to (a block before the unmapped tail)
            def exp_size(b: _Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

            b = pool.blocks[pool.keys[i]]
            j = i + 1
            while j < len(pool.keys) and exp_size(pool.blocks[pool.keys[j]]) < exp_size(b):
                b = pool.blocks[pool.keys[j]]
                i = j
                j += 1
        b = pool.blocks[pool.keys[i]]
        if size < self.max_split and b.size >= self.max_split:
            return None
        if size >= self.max_split and b.size >= size + kLargeBuffer:
            return None
        pool.erase(b)
        return b

    def _alloc_segment(self, pool: _Pool, size: int) -> _Block:
        alloc = get_allocation_size(size)
        b = _Block(self._next_ptr, alloc, pool.small)
        self._next_ptr += alloc + (1 << 30)  # separate segments never touch
        self._reserve(alloc, True)
        return b

    def _alloc_expandable(self, pool: _Pool, size: int) -> _Block:
        page = kSmallBuffer if pool.small else kLargeBuffer
        tail = self._tail[pool.small]
        if tail is None:
            # a new segment: address space only (no physical memory yet)
            tail = _Block(self._next_ptr, 1 << 44, pool.small, expandable=True)
            tail.mapped = False
            self._next_ptr += 1 << 45
            self._tail[pool.small] = tail
            self.stats.segments += 1
            self.stats.peak_segments = max(self.stats.peak_segments, self.stats.segments)
        cand = tail
        have = 0
        if tail.prev is not None and not tail.prev.allocated:
            cand = tail.prev
            pool.erase(cand)
            have = cand.size
        need = size - have
        pages = -(-need // page)
        mapped = pages * page
        self._reserve(mapped, False)
        # carve the newly mapped range off the front of the tail
        newb = _Block(tail.ptr, mapped, pool.small, expandable=True)
        newb.prev, newb.next = tail.prev, tail
        if tail.prev is not None:
            tail.prev.next = newb
        tail.prev = newb
        tail.ptr += mapped
        tail.size -= mapped
        if cand is not tail:  # merge the free block before the tail with the new pages
            cand.size += newb.size
            cand.next = tail
            tail.prev = cand
            return cand
        return newb

    # ---- API ----------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> _Block | None:
        if nbytes == 0:
            return None
        size = round_size(nbytes)
        small = size <= kSmallSize
        pool = self.pools[small]
        block = self._get_free_block(pool, size)
        if block is None:
            block = self._alloc_expandable(pool, size) if self.expandable else self._alloc_segment(pool, size)
        remaining = block.size - size
        if pool.small or self.expandable:
            split = remaining >= kMinBlockSize
        else:
            split = size < self.max_split and remaining > kSmallSize
        if split:
            rest = _Block(block.ptr + size, remaining, pool.small, block.expandable)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.insert(rest)
        block.allocated = True
        s = self.stats
        s.allocated_bytes += block.size
        s.peak_allocated_bytes = max(s.peak_allocated_bytes, s.allocated_bytes)
        return block

    def free(self, block: _Block | None) -> None:
        if block is None:
            return
        block.allocated = False
        self.stats.allocated_bytes -= block.size
        pool = self.pools[block.small]
        for nb in (block.prev, block.next):
            if nb is None or nb.allocated or nb.mapped != block.mapped or not nb.mapped:
                continue
            pool.erase(nb)
            if nb is block.prev:
                block.ptr = nb.ptr
                block.prev = nb.prev
                if nb.prev is not None:
                    nb.prev.next = block
            else:
                block.next = nb.next
                if nb.next is not None:
                    nb.next.prev = block
            block.size += nb.size
        pool.insert(block)


def replay(sizes: list[int], events: Iterable[int], **kwargs: object) -> AllocatorStats:
    """Replay tracker events (``+id+1`` malloc, ``-(id+1)`` free of ``sizes[id]`` bytes)."""
    model = CachingAllocatorModel(**kwargs)  # type: ignore[arg-type]
    blocks: dict[int, _Block | None] = {}
    for e in events:
        if e > 0:
            a = e - 1
            blocks[a] = model.malloc(sizes[a])
        else:
            model.free(blocks.pop(-e - 1, None))
    return model.stats


def replay_reserved(
    sizes: list[int], events: Iterable[int], *, expandable_segments: bool = False, max_split_size: int | None = None
) -> int:
    """Predicted ``torch.cuda.max_memory_reserved()`` for the event sequence."""
    return replay(
        sizes, events, expandable_segments=expandable_segments, max_split_size=max_split_size
    ).peak_reserved_bytes
