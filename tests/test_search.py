"""cabe.search.largest: the largest count a monotone test accepts (longest context, most sequences or slots)."""

from cabe.search import largest


def test_largest_finds_the_boundary_and_the_edges():
    for limit in (1, 2, 3, 7, 8, 9, 1000, 131_071):
        assert largest(lambda n, m=limit: n <= m, 1 << 20) == limit
    assert largest(lambda n: n <= 50, 10) == 10  # capped
    assert largest(lambda n: False, 10) == 0 and largest(lambda n: True, 0) == 0


def test_largest_asks_a_logarithmic_number_of_times():
    calls: list[int] = []
    assert largest(lambda n: calls.append(n) is None and n <= 100_000, 1 << 24) == 100_000
    assert len(calls) <= 2 * 24 and max(calls) <= 1 << 24
