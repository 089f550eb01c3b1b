"""The largest count a monotone test accepts: the longest context, the most sequences or slots that fit."""

from __future__ import annotations

from collections.abc import Callable


def largest(ok: Callable[[int], bool], cap: int) -> int:
    """The largest n in 1..``cap`` with ``ok(n)``, 0 when ``ok(1)`` fails; ``ok`` true up to some n, false after.
    Doubles from 1 while ``ok`` holds, then bisects: O(log n) calls."""
    if cap < 1 or not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= cap and ok(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, cap + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
