"""Which (node, seq) pairs the store has applied: per node, sorted disjoint seq ranges.

A node's events normally arrive in `seq` order, so a node holds one range
[first, last] that grows at its end. An event past `last + 1` opens a hole:
a gap in that node's sequence, reported until events fill it. An event
inside a range has been applied already (a redelivery) and is skipped.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import pairwise


@dataclass(slots=True)
class SeqRanges:
    """Applied seq ranges per node (inclusive, sorted, not touching) and which nodes changed."""

    ranges: dict[str, list[list[int]]] = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)

    def accept(self, node: str, seq: int) -> tuple[bool, tuple[int, int] | None]:
        """Mark (node, seq) applied. (False, None) if it already was; else (True, hole) where
        hole is the (from, to) seq range this event skipped over, or None."""
        rs = self.ranges.get(node)
        if rs is None:
            self.ranges[node] = [[seq, seq]]
            self.dirty.add(node)
            return True, None
        last = rs[-1]
        hi = last[1]
        if seq == hi + 1:
            last[1] = seq
            self.dirty.add(node)
            return True, None
        if seq > hi:
            rs.append([seq, seq])
            self.dirty.add(node)
            return True, (hi + 1, seq - 1)
        return self._insert(node, rs, seq), None

    def _insert(self, node: str, rs: list[list[int]], seq: int) -> bool:
        i = bisect_right(rs, seq, key=lambda r: r[0]) - 1  # last range starting at or before seq
        if i >= 0 and rs[i][1] >= seq:
            return False
        joins_left = i >= 0 and rs[i][1] == seq - 1
        joins_right = i + 1 < len(rs) and rs[i + 1][0] == seq + 1
        if joins_left and joins_right:
            rs[i][1] = rs[i + 1][1]
            del rs[i + 1]
        elif joins_left:
            rs[i][1] = seq
        elif joins_right:
            rs[i + 1][0] = seq
        else:
            rs.insert(i + 1, [seq, seq])
        self.dirty.add(node)
        return True

    def contains(self, node: str, seq: int) -> bool:
        """True if (node, seq) was applied."""
        rs = self.ranges.get(node, [])
        i = bisect_right(rs, seq, key=lambda r: r[0]) - 1
        return i >= 0 and rs[i][1] >= seq

    def holes(self) -> list[tuple[str, int, int]]:
        """Every gap still open: (node, from_seq, to_seq), sorted."""
        result = []
        for node in sorted(self.ranges):
            rs = self.ranges[node]
            for left, right in pairwise(rs):
                result.append((node, left[1] + 1, right[0] - 1))
        return result

    def applied(self, node: str) -> int:
        """How many seqs of `node` were applied."""
        return sum(hi - lo + 1 for lo, hi in self.ranges.get(node, []))

    def take_dirty(self) -> dict[str, list[tuple[int, int]]]:
        """The ranges of every node changed since the last call (and forget the marks)."""
        changed = {node: [(lo, hi) for lo, hi in self.ranges[node]] for node in self.dirty}
        self.dirty = set()
        return changed
