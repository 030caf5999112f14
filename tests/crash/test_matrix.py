"""Crash matrix: every fault point on the mount and unmount paths, per volume kind, converges.

See `tests.crash.scenarios` for what one case does. Each case runs on its
own node (data dir, root dir, driver volumes) against the suite's shared
nats-server and CSI driver.
"""

from __future__ import annotations

import pytest

from tests.crash.conftest import MakeNode
from tests.crash.harness import Crash
from tests.crash.scenarios import Case, matrix, retry_fails, run_case

CASES = matrix()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_crash_on_mount_and_unmount_path_then_converge(make_node: MakeNode, case: Case) -> None:
    node = make_node()
    run_case(node, case)
    crashed_at = [c.line for c in node.crashes]
    assert len(crashed_at) == 2, crashed_at


def test_the_matrix_covers_every_hit_point_for_every_kind() -> None:
    points = {"driver.before", "driver.during", "driver.after", "append.after"}
    relay = {"relay.before_publish", "relay.before_cursor"}
    for kind in ("fs", "block", "emptydir"):
        for path in ("mount", "unmount"):
            specs = [getattr(c, path) for c in CASES if c.kind == kind]
            have = {s.split("/")[0].split("@")[0].split("+")[0] for s in specs}
            assert points <= have, (kind, path, points - have)
            assert have & relay, (kind, path)


def test_a_killed_csi_call_gets_its_retry_failed_for_the_volume_it_was_for() -> None:
    line = (
        "volfsm: fault point driver.during map_volume/kubernetes.io/csi/csi.volfsm.dev/"
        "MapPodDevice (call returned) [pod=u1 volume=kubernetes.io/csi/csi.volfsm.dev^n1-v3]"
        ": SIGKILL"
    )
    [rule] = retry_fails(Crash("driver.during", line))
    assert (rule["rpc"], rule["volume_id"], rule["code"], rule["times"]) == (
        "NodePublishVolume",
        "n1-v3",
        "FAILED_PRECONDITION",
        1,
    )
    emptydir = line.replace("csi/csi.volfsm.dev/MapPodDevice", "empty-dir/SetUp")
    assert retry_fails(Crash("driver.during", emptydir.replace("csi.volfsm.dev^n1-v3", "x"))) == []
    appended = line.replace("driver.during", "append.after")
    assert retry_fails(Crash("append.after", appended)) == []
