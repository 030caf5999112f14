"""The harness itself: without faults a mixed workload converges, and a restart keeps it."""

from __future__ import annotations

from tests.crash.conftest import MakeNode


def test_mixed_workload_converges_and_survives_a_clean_restart(make_node: MakeNode) -> None:
    node = make_node()
    assert node.start()
    a = node.new_pod("a", ["fs", "block", "emptydir", "tmpfs"])
    b = node.new_pod("b", ["fs", "block"])
    assert node.apply(a, b)
    node.converge()
    assert node.stop() == 0
    assert node.start()
    assert node.resync()
    assert node.delete(b.uid)
    node.converge()
    assert node.delete(a.uid)
    node.converge()
    assert node.stop() == 0
