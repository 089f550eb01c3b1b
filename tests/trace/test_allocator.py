"""The caching-allocator model follows CUDACachingAllocator.cpp's rules (no torch needed)."""

import pytest

from cabe.trace.allocator import (
    CUDA_CONTEXT_ESTIMATES,
    CachingAllocatorModel,
    cuda_context_bytes,
    get_allocation_size,
    replay,
    round_size,
)

pytestmark = pytest.mark.trace
MiB = 2**20


def test_round_size_and_segment_sizes():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert get_allocation_size(512) == 2 * MiB  # small pool: 2 MiB segments
    assert get_allocation_size(MiB) == 2 * MiB
    assert get_allocation_size(MiB + 512) == 20 * MiB  # 1-10 MiB: 20 MiB segments
    assert get_allocation_size(10 * MiB - 512) == 20 * MiB
    assert get_allocation_size(10 * MiB) == 10 * MiB  # >= 10 MiB: rounded to 2 MiB
    assert get_allocation_size(11 * MiB) == 12 * MiB


def test_small_requests_share_a_2mib_segment():
    m = CachingAllocatorModel()
    blocks = [m.malloc(1000) for _ in range(4)]
    assert m.stats.reserved_bytes == 2 * MiB and m.stats.segments == 1
    assert m.stats.allocated_bytes == 4 * 1024
    for b in blocks:
        m.free(b)
    assert m.stats.allocated_bytes == 0 and m.stats.reserved_bytes == 2 * MiB  # cached, not released
    m.malloc(2 * MiB - 512 * 4)  # > 1 MiB: the large pool, a new segment
    assert m.stats.segments == 2


def test_large_pool_split_rule_and_unsplit_remainder():
    m = CachingAllocatorModel()
    a = m.malloc(5 * MiB)  # new 20 MiB segment, remainder 15 MiB > 1 MiB: split
    assert m.stats.reserved_bytes == 20 * MiB and m.stats.allocated_bytes == 5 * MiB
    m.free(a)
    b = m.malloc(int(19.5 * MiB))  # best fit: the merged 20 MiB block; remainder 0.5 MiB <= 1 MiB: no split
    assert m.stats.reserved_bytes == 20 * MiB
    assert m.stats.allocated_bytes == 20 * MiB  # memory_allocated counts the whole block
    m.free(b)


def test_best_fit_and_merge():
    m = CachingAllocatorModel()
    x = m.malloc(12 * MiB)
    y = m.malloc(30 * MiB)
    m.free(x)
    m.free(y)
    z = m.malloc(11 * MiB)  # smallest block that fits: the 12 MiB one, no new segment
    assert m.stats.reserved_bytes == 42 * MiB and z.size == 12 * MiB
    # three adjacent pieces of one 20 MiB segment merge back into one block when freed
    m2 = CachingAllocatorModel()
    p, q = m2.malloc(4 * MiB), m2.malloc(4 * MiB)
    m2.free(p)
    m2.free(q)
    assert m2.pools[False].keys == [(20 * MiB, m2.pools[False].keys[0][1])]


def test_growing_sizes_fragment_without_expandable_segments():
    sizes = [(12 + 2 * i) * MiB for i in range(8)]
    events = []
    for n in range(len(sizes)):  # allocate, free, next one a bit larger: nothing cached fits
        events += [n + 1, -(n + 1)]
    st = replay(sizes, events)
    assert st.peak_allocated_bytes == sizes[-1]
    assert st.peak_reserved_bytes == sum(sizes)
    exp = replay(sizes, events, expandable_segments=True)
    assert exp.peak_reserved_bytes < st.peak_reserved_bytes
    assert exp.peak_reserved_bytes == 40 * MiB  # 26 MiB mapped in 20 MiB pages


def test_max_split_size():
    m = CachingAllocatorModel(max_split_size=20 * MiB)
    a = m.malloc(40 * MiB)
    m.free(a)
    m.malloc(4 * MiB)  # below max_split_size: may not take the oversize cached block
    assert m.stats.reserved_bytes == 60 * MiB


def test_context_table():
    assert set(CUDA_CONTEXT_ESTIMATES) >= {"sm80", "sm90"}
    assert 0.2 * 2**30 < cuda_context_bytes("sm90") < 1.5 * 2**30
