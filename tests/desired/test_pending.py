"""Pending pods: accepted while their claims (or PVs) are not there yet, woken by their apply.

The kubelet's populator keeps a pod whose claim is missing, not bound, or
bound to a PV not there yet, and retries it (ContainerCreating); the DSW
records it as `PodPending` and resolves it again when an object it waits
for is applied, in the same apply.
"""

from __future__ import annotations

from typing import Any

import pytest

from events.streams import pod_stream
from events.types import PodAdded, PodPending, PodRemoved
from projections.validate import validate
from tests.desired.builders import Recorder, can_serve, pod, pv, pvc
from volfsm.desired import DesiredStateOfWorld, InvalidObjectError

EPHEMERAL = {
    "name": "scratch",
    "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}},
}


@pytest.fixture
def dsw() -> DesiredStateOfWorld:
    return DesiredStateOfWorld(can_serve)


@pytest.fixture
def rec(dsw: DesiredStateOfWorld) -> Recorder:
    return Recorder(dsw)


def scratch_claim(owner: str = "uid-web") -> dict[str, Any]:
    claim = pvc("web-scratch")
    claim["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": owner, "controller": True}
    ]
    return claim


def scratch_pv() -> dict[str, Any]:
    return pv(claim=("default", "web-scratch"))


def test_a_pod_before_its_claim_is_pending_and_mounts_nothing(
    dsw: DesiredStateOfWorld, rec: Recorder
) -> None:
    plan = rec.apply(pod(volumes=[EPHEMERAL]))
    [result] = plan.results
    assert result.action == "created"
    assert result.waiting.startswith(
        "scratch: PersistentVolumeClaim default/web-scratch: not found yet"
    )
    assert str(result).startswith("pod/default/web created; waiting: scratch: ")
    assert set(dsw.pending) == {"uid-web"} and dsw.pods == {}
    assert dsw.volumes_to_mount() == []
    assert dsw.pod_by_name("default", "web") is None
    assert dsw.desired_by_name("default", "web") is dsw.pending["uid-web"]
    assert dsw.pending_spec("uid-web") is not None


def test_applying_the_claim_and_its_pv_adds_the_pod(
    dsw: DesiredStateOfWorld, rec: Recorder
) -> None:
    rec.apply(pod(volumes=[EPHEMERAL]))
    plan = rec.apply(scratch_pv(), scratch_claim())
    assert [type(c.body) for c in plan.changes] == [PodAdded]
    assert plan.changes[0].stream == pod_stream("uid-web")
    assert [str(r) for r in plan.results][-1] == "pod/default/web no longer waiting"
    assert dsw.pending == {} and dsw.pending_spec("uid-web") is None
    [(added, vol)] = dsw.volumes_to_mount()
    assert (added.pod_uid, vol.claim_name, vol.pv_name) == ("uid-web", "web-scratch", "pv-data")
    assert validate(rec.envelopes).ok


def test_the_claim_alone_moves_the_wait_to_its_pv(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    rec.apply(pod(volumes=[EPHEMERAL]))
    plan = rec.apply(scratch_claim())
    [pending] = [c.body for c in plan.changes]
    assert isinstance(pending, PodPending)
    [waiting] = pending.waiting
    assert waiting.waits_for == "PersistentVolume pv-data"
    assert str(plan.results[-1]).startswith("pod/default/web still waiting; waiting: scratch: ")
    plan = rec.apply(scratch_pv())  # the PV it waits for now wakes it
    assert [type(c.body) for c in plan.changes] == [PodAdded]


def test_a_claim_owned_by_another_pod_is_a_reason_to_wait_once_accepted(
    dsw: DesiredStateOfWorld, rec: Recorder
) -> None:
    rec.apply(pod(volumes=[EPHEMERAL]))
    plan = rec.apply(scratch_pv(), scratch_claim(owner="uid-other"))
    [pending] = [c.body for c in plan.changes]
    assert isinstance(pending, PodPending)
    assert "(pod is not owner)" in pending.waiting[0].reason
    plan = rec.apply(scratch_claim())  # the claim fixed: the pod resolves
    assert [type(c.body) for c in plan.changes] == [PodAdded]


def test_a_claim_owned_by_another_pod_refuses_the_pod(dsw: DesiredStateOfWorld) -> None:
    with pytest.raises(InvalidObjectError, match=r"\(pod is not owner\)"):
        dsw.plan_apply([scratch_pv(), scratch_claim(owner="uid-other"), pod(volumes=[EPHEMERAL])])


def test_problems_of_the_manifest_are_still_refused_with_a_waiting_volume(
    dsw: DesiredStateOfWorld,
) -> None:
    bad = {"name": "bad", "emptyDir": {"sizeLimit": "lots"}}
    with pytest.raises(InvalidObjectError, match="sizeLimit") as info:
        dsw.plan_apply([pod(volumes=[EPHEMERAL, bad])])
    assert "web-scratch" not in str(info.value)


def test_other_objects_wake_nothing(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    rec.apply(pod(volumes=[EPHEMERAL]))
    plan = rec.apply(pv("pv-other", handle="vol-9", claim=None), pvc("other", volume="pv-other"))
    assert plan.changes == []
    assert set(dsw.pending) == {"uid-web"}


def test_applying_the_pending_pod_again(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    rec.apply(pod(volumes=[EPHEMERAL]))
    again = rec.apply(pod(volumes=[EPHEMERAL]))
    assert again.changes == []
    [result] = again.results
    assert result.action == "unchanged" and "web-scratch" in result.waiting
    with pytest.raises(InvalidObjectError, match="pods are immutable"):
        dsw.plan_apply([pod(volumes=[{"name": "t", "emptyDir": {}}])])
    both = rec.apply(scratch_pv(), scratch_claim(), pod(volumes=[EPHEMERAL]))
    assert [type(c.body) for c in both.changes] == [PodAdded]
    assert [str(r) for r in both.results][-1] == "pod/default/web no longer waiting"


def test_a_new_uid_replaces_the_pending_pod(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    rec.apply(pod(volumes=[EPHEMERAL]))
    plan = rec.apply(pod(uid="uid-web-2", volumes=[{"name": "t", "emptyDir": {}}]))
    assert [(c.stream, type(c.body)) for c in plan.changes] == [
        (pod_stream("uid-web"), PodRemoved),
        (pod_stream("uid-web-2"), PodAdded),
    ]
    assert dsw.pending == {}
    assert dsw.desired_by_name("default", "web") is dsw.pods["uid-web-2"]


def test_deleting_a_pending_pod(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    rec.apply(pod(volumes=[EPHEMERAL]))
    assert dsw.pods_using(claim=("default", "web-scratch")) == ["default/web"]
    changes = dsw.plan_delete_pod(namespace="default", name="web")
    assert [type(c.body) for c in changes] == [PodRemoved]
    rec.record(changes)
    assert dsw.pending == {} and dsw.desired_by_name("default", "web") is None
    assert dsw.pods_using(claim=("default", "web-scratch")) == []
    assert rec.apply(scratch_pv(), scratch_claim()).changes == []
    assert validate(rec.envelopes).ok


def test_the_fold_and_a_snapshot_keep_pending_pods(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    rec.apply(pv(), pvc(), pod("db", uid="uid-db"))
    rec.apply(pod(volumes=[EPHEMERAL]))
    replayed = DesiredStateOfWorld(can_serve)
    for env in rec.envelopes:
        replayed.observe(env)
    assert replayed.pending == dsw.pending
    restored = DesiredStateOfWorld(can_serve)
    restored.restore_state(dsw.export_state())
    assert restored.pending == dsw.pending
    assert restored.desired_by_name("default", "web") == dsw.pending["uid-web"]
    assert restored.export_state() == dsw.export_state()
    # After a restart the Pod object comes back from the object store; the claim wakes it.
    restored.remember(*_objects_of(rec))
    restored.remember_pods(_stored_pods(dsw))
    plan = restored.plan_apply([scratch_pv(), scratch_claim()])
    assert [type(c.body) for c in plan.changes] == [PodAdded]


def _objects_of(rec: Recorder) -> tuple[list[Any], list[Any]]:
    return list(rec.dsw.persistent_volumes.values()), list(rec.dsw.claims.values())


def _stored_pods(dsw: DesiredStateOfWorld) -> list[Any]:
    spec = dsw.pending_spec("uid-web")
    assert spec is not None
    return [spec]
