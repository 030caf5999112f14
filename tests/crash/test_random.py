"""Randomised: at least 50 random crash points over a mixed workload, seeded.

Five runs of ten crashes each (seeds 1-5, or `VOLFSM_CRASH_SEED` for the
first), each on its own node; see `tests.crash.chaos`. A failure names the
seed and every spec armed so far.
"""

from __future__ import annotations

import os

import pytest

from tests.crash.chaos import Chaos
from tests.crash.conftest import MakeNode

RUNS = 5
CRASHES_PER_RUN = 10
BASE_SEED = int(os.environ.get("VOLFSM_CRASH_SEED", "1"))


@pytest.mark.parametrize("seed", [BASE_SEED + i for i in range(RUNS)])
def test_random_crash_points_over_a_mixed_workload_converge(make_node: MakeNode, seed: int) -> None:
    node = make_node()
    stats = Chaos(node, seed).run(CRASHES_PER_RUN)
    print(f"chaos seed {seed}: {stats.summary()}")
    assert stats.crashes >= CRASHES_PER_RUN
    assert stats.checks >= 1
    assert len(node.crashes) == stats.crashes
