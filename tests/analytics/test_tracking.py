"""Applied (node, seq) ranges: in-order growth, duplicates, holes and their filling."""

from __future__ import annotations

import random

from volfsm.analytics.tracking import SeqRanges


def test_in_order_events_grow_one_range_per_node() -> None:
    r = SeqRanges()
    for seq in range(1, 101):
        assert r.accept("a", seq) == (True, None)
    assert r.accept("b", 40) == (True, None)  # a node's first event sets its start: no gap
    assert r.ranges == {"a": [[1, 100]], "b": [[40, 40]]}
    assert r.holes() == []
    assert r.take_dirty() == {"a": [(1, 100)], "b": [(40, 40)]}
    assert r.take_dirty() == {}


def test_duplicates_are_refused() -> None:
    r = SeqRanges()
    for seq in (1, 2, 3):
        r.accept("a", seq)
    r.take_dirty()
    assert r.accept("a", 2) == (False, None)
    assert r.accept("a", 3) == (False, None)
    assert r.take_dirty() == {}


def test_a_skip_opens_a_hole_that_late_events_fill() -> None:
    r = SeqRanges()
    for seq in (1, 2, 3):
        r.accept("a", seq)
    assert r.accept("a", 7) == (True, (4, 6))
    assert r.holes() == [("a", 4, 6)]
    assert r.accept("a", 5) == (True, None)
    assert r.holes() == [("a", 4, 4), ("a", 6, 6)]
    assert r.accept("a", 5) == (False, None)
    assert r.accept("a", 4) == (True, None)
    assert r.accept("a", 6) == (True, None)
    assert r.ranges["a"] == [[1, 7]]
    assert r.holes() == []
    assert r.accept("a", 0) == (True, None)  # before the first range: extends it
    assert r.ranges["a"] == [[0, 7]]


def test_random_order_matches_a_set() -> None:
    rng = random.Random(5)
    r = SeqRanges()
    seen: set[int] = set()
    for _ in range(3000):
        seq = rng.randint(1, 400)
        fresh, _ = r.accept("n", seq)
        assert fresh == (seq not in seen)
        seen.add(seq)
        assert r.contains("n", seq)
    assert r.applied("n") == len(seen)
    missing = sorted(set(range(min(seen), max(seen) + 1)) - seen)
    assert sum(hi - lo + 1 for _, lo, hi in r.holes()) == len(missing)
