"""The DSW as a fold of desired-state events: apply, re-apply, delete, resize, replay."""

from __future__ import annotations

import pytest

from events.streams import device_stream, pod_stream
from events.types import DesiredSizeChanged, PodAdded, PodRemoved
from projections.asw import fold
from projections.validate import validate
from tests.desired.builders import Recorder, can_serve, claim_volume, pod, pv, pvc, snapshot
from volfsm.desired import DesiredStateOfWorld

VOLUME_ID = "kubernetes.io/csi/hostpath.csi.example.com^vol-1"
GI = 1024**3


@pytest.fixture
def dsw() -> DesiredStateOfWorld:
    return DesiredStateOfWorld(can_serve)


@pytest.fixture
def rec(dsw: DesiredStateOfWorld) -> Recorder:
    return Recorder(dsw)


def test_plan_apply_is_pure(dsw: DesiredStateOfWorld) -> None:
    before = snapshot(dsw)
    plan = dsw.plan_apply([pv(), pvc(), pod()])
    assert [type(c.body) for c in plan.changes] == [PodAdded]
    assert snapshot(dsw) == before
    assert dsw.pods == {}


def test_apply_then_observe_holds_the_pod(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    plan = rec.apply(pv(), pvc(), pod())
    assert [str(r) for r in plan.results] == [
        "persistentvolume/pv-data created",
        "persistentvolumeclaim/default/data created",
        "pod/default/web created",
    ]
    added = dsw.pods["uid-web"]
    assert dsw.pod_by_name("default", "web") is added
    assert dsw.is_desired("uid-web", "data")
    assert not dsw.is_desired("uid-web", "other")
    assert dsw.volume_desired(VOLUME_ID)
    assert dsw.pods_on_volume(VOLUME_ID) == ["uid-web"]
    assert dsw.desired_size(VOLUME_ID) == GI
    assert dsw.volumes_to_mount() == [(added, added.volumes[0])]
    assert dsw.desired_volume("uid-web", "data") == added.volumes[0]
    assert dsw.persistent_volume("pv-data") is not None
    assert dsw.claim("default", "data") is not None


def test_applying_the_same_objects_twice_changes_nothing(
    dsw: DesiredStateOfWorld, rec: Recorder
) -> None:
    objects = [
        pv(),
        pvc(),
        pod(),
        pod("tmp", uid="uid-tmp", volumes=[{"name": "t", "emptyDir": {}}]),
    ]
    first = rec.apply(*objects)
    assert len(first.changes) == 2
    before = snapshot(dsw)
    again = dsw.plan_apply(objects)
    assert again.changes == []
    assert {r.action for r in again.results} == {"unchanged"}
    dsw.commit_objects(again)
    assert snapshot(dsw) == before


def test_reapplying_a_pod_alone_needs_no_claims(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    rec.apply(pv(), pvc(), pod())
    fresh = DesiredStateOfWorld(can_serve)
    for env in rec.envelopes:
        fresh.observe(env)
    # After a restart the PV and PVC objects are gone; the pod is known and unchanged.
    plan = fresh.plan_apply([pod()])
    assert plan.changes == []
    assert [r.action for r in plan.results] == ["unchanged"]


def test_identical_duplicates_in_one_apply_count_once(dsw: DesiredStateOfWorld) -> None:
    plan = dsw.plan_apply([pv(), pv(), pvc(), pvc(), pod(), pod()])
    assert len(plan.changes) == 1


def test_delete_by_uid(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    rec.apply(pv(), pvc(), pod())
    before = snapshot(dsw)
    changes = dsw.plan_delete_pod(uid="uid-web")
    assert snapshot(dsw) == before
    assert [(c.stream, c.body) for c in changes] == [
        (pod_stream("uid-web"), PodRemoved(pod_uid="uid-web", namespace="default", name="web"))
    ]
    rec.record(changes)
    assert dsw.pods == {}
    assert dsw.pod_by_name("default", "web") is None
    assert not dsw.is_desired("uid-web", "data")
    assert not dsw.volume_desired(VOLUME_ID)
    assert dsw.pods_on_volume(VOLUME_ID) == []
    assert dsw.desired_size(VOLUME_ID) is None
    assert dsw.volumes_to_mount() == []
    assert dsw.plan_delete_pod(uid="uid-web") == []


def test_delete_by_namespace_and_name(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    rec.apply(pod(volumes=[]), pod("web", uid="uid-other", namespace="other", volumes=[]))
    assert dsw.plan_delete_pod(namespace="default", name="nope") == []
    assert dsw.plan_delete_pod(namespace="other", name="web", uid="uid-web") == []
    changes = dsw.plan_delete_pod(namespace="default", name="web")
    assert [c.body for c in changes] == [
        PodRemoved(pod_uid="uid-web", namespace="default", name="web")
    ]
    rec.record(changes)
    assert list(dsw.pods) == ["uid-other"]


def test_delete_needs_uid_or_namespace_and_name(dsw: DesiredStateOfWorld) -> None:
    with pytest.raises(ValueError, match="uid"):
        dsw.plan_delete_pod()
    with pytest.raises(ValueError, match="uid"):
        dsw.plan_delete_pod(name="web")


def test_shared_volume_stays_desired_until_the_last_pod_goes(
    dsw: DesiredStateOfWorld, rec: Recorder
) -> None:
    rec.apply(pv(claim=None), pvc(), pod("a", uid="ua"), pod("b", uid="ub"))
    assert dsw.pods_on_volume(VOLUME_ID) == ["ua", "ub"]
    assert not dsw.only_user(VOLUME_ID, "ua") and not dsw.only_user(VOLUME_ID, "ub")
    rec.record(dsw.plan_delete_pod(uid="ua"))
    assert dsw.volume_desired(VOLUME_ID)
    assert dsw.desired_size(VOLUME_ID) == GI
    assert dsw.pods_on_volume(VOLUME_ID) == ["ub"]
    assert dsw.only_user(VOLUME_ID, "ub") and not dsw.only_user(VOLUME_ID, "ua")
    rec.record(dsw.plan_delete_pod(uid="ub"))
    assert not dsw.volume_desired(VOLUME_ID)
    assert dsw.pods_on_volume(VOLUME_ID) == [] and not dsw.only_user(VOLUME_ID, "ub")


def test_larger_capacity_while_in_use_asks_for_expansion(
    dsw: DesiredStateOfWorld, rec: Recorder
) -> None:
    rec.apply(pv(), pvc(), pod())
    plan = rec.apply(pv(storage="3Gi"))
    assert [(c.stream, c.body) for c in plan.changes] == [
        (pod_stream("uid-web"), DesiredSizeChanged(volume_id=VOLUME_ID, size_bytes=3 * GI))
    ]
    assert [str(r) for r in plan.results] == ["persistentvolume/pv-data configured"]
    assert dsw.desired_size(VOLUME_ID) == 3 * GI
    assert dsw.persistent_volume("pv-data") is not None
    assert dsw.plan_apply([pv(storage="3Gi")]).changes == []
    # The pod as applied is unchanged: re-applying it is still a no-op.
    assert dsw.plan_apply([pv(storage="3Gi"), pvc(), pod()]).changes == []


def test_larger_capacity_of_an_unused_volume_is_only_remembered(
    dsw: DesiredStateOfWorld, rec: Recorder
) -> None:
    rec.apply(pv(), pvc())
    assert rec.apply(pv(storage="2Gi")).changes == []
    added = dsw.plan_apply([pod()]).changes[0].body
    assert isinstance(added, PodAdded)
    assert added.volumes[0].size_bytes == 2 * GI


def test_new_pod_and_growth_in_one_apply(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    rec.apply(pv(claim=None), pvc(), pod("a", uid="ua"), pod("c", uid="uc"))
    plan = rec.apply(pv(claim=None, storage="2Gi"), pod("b", uid="ub"))
    assert [(c.stream, type(c.body).__name__) for c in plan.changes] == [
        (pod_stream("ua"), "DesiredSizeChanged"),
        (pod_stream("uc"), "DesiredSizeChanged"),
        (pod_stream("ub"), "PodAdded"),
    ]
    added = plan.changes[-1].body
    assert isinstance(added, PodAdded) and added.volumes[0].size_bytes == 2 * GI
    assert dsw.desired_size(VOLUME_ID) == 2 * GI


def test_secret_refs_of_a_volume_may_change(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    rec.apply(pv(), pvc(), pod())
    plan = dsw.plan_apply([pv(nodeStageSecretRef={"name": "new", "namespace": "x"})])
    assert plan.changes == []
    assert [r.action for r in plan.results] == ["configured"]


def test_pod_recreated_under_a_new_uid_replaces_the_old_one(
    dsw: DesiredStateOfWorld, rec: Recorder
) -> None:
    rec.apply(pv(), pvc(), pod(uid="uid-1"))
    plan = rec.apply(pod(uid="uid-2"))
    assert [(c.stream, type(c.body).__name__) for c in plan.changes] == [
        (pod_stream("uid-1"), "PodRemoved"),
        (pod_stream("uid-2"), "PodAdded"),
    ]
    assert [r.action for r in plan.results] == ["replaced"]
    assert list(dsw.pods) == ["uid-2"]
    assert dsw.pod_by_name("default", "web") is dsw.pods["uid-2"]
    assert dsw.pods_on_volume(VOLUME_ID) == ["uid-2"]


def test_volumes_to_mount_is_cached_until_a_change(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    volumes = [{"name": f"v{i}", "emptyDir": {}} for i in range(3)]
    rec.apply(pod(volumes=volumes))
    first = dsw.volumes_to_mount()
    assert dsw.volumes_to_mount() is first
    assert [v.name for _, v in first] == ["v0", "v1", "v2"]
    generation = dsw.generation
    rec.apply(pod("b", uid="ub", volumes=volumes[:1]))
    assert dsw.generation > generation
    second = dsw.volumes_to_mount()
    assert second is not first
    assert len(second) == 4


def test_observe_ignores_other_events(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    from events.types import DeviceDetached, Envelope

    before = snapshot(dsw)
    dsw.observe(
        Envelope(
            seq=1,
            stream=device_stream(VOLUME_ID),
            version=1,
            type="DeviceDetached",
            schema=1,
            ts=0,
            node="n",
            body=DeviceDetached(volume_id=VOLUME_ID),
        )
    )
    assert snapshot(dsw) == before


def test_replaying_the_events_rebuilds_the_same_state(
    dsw: DesiredStateOfWorld, rec: Recorder
) -> None:
    rec.apply(pv(claim=None), pvc())
    rec.apply(pod("a", uid="ua"), pod("b", uid="ub", volumes=[claim_volume(read_only=True)]))
    rec.apply(pod("c", uid="uc", volumes=[{"name": "m", "emptyDir": {"medium": "Memory"}}]))
    rec.apply(pv(claim=None, storage="4Gi"))
    rec.record(dsw.plan_delete_pod(uid="ua"))
    rec.apply(pod("a", uid="ua2"))

    replayed = DesiredStateOfWorld(can_serve)
    for env in rec.envelopes:
        replayed.observe(env)
    assert replayed.pods == dsw.pods
    assert replayed.volumes_to_mount() == dsw.volumes_to_mount()
    assert replayed.desired_size(VOLUME_ID) == dsw.desired_size(VOLUME_ID) == 4 * GI
    assert replayed.pods_on_volume(VOLUME_ID) == dsw.pods_on_volume(VOLUME_ID) == ["ub", "ua2"]
    assert replayed.pod_by_name("default", "a") == dsw.pods["ua2"]
    # The ASW projection folds the same events to the same desired pods and sizes,
    # and the log tells a legal story.
    assert validate(rec.envelopes).violation is None
    asw = fold(rec.envelopes)
    assert asw.desired_pods == dsw.pods
    assert asw.desired_sizes[VOLUME_ID] == 4 * GI


def test_recorded_events_survive_the_codec(dsw: DesiredStateOfWorld, rec: Recorder) -> None:
    from events.codec import envelope_from_json, envelope_to_json

    inline = {"name": "c", "csi": {"driver": "inline.csi.example.com", "readOnly": True}}
    rec.apply(pv(), pvc(), pod(volumes=[claim_volume(read_only=True), inline]))
    replayed = DesiredStateOfWorld(can_serve)
    for env in rec.envelopes:
        replayed.observe(envelope_from_json(envelope_to_json(env)))
    assert replayed.pods == dsw.pods


def test_sources_without_attributes_share_one_empty_dict(
    dsw: DesiredStateOfWorld, rec: Recorder
) -> None:
    """One empty `attributes` dict for every source that has none (6 MB less at 100,000
    pods); a source with attributes keeps its own, and every body keeps its value."""
    from events.codec import envelope_from_json, envelope_to_json

    inline = {
        "name": "c",
        "csi": {"driver": "inline.csi.example.com", "volumeAttributes": {"k": "v"}},
    }
    rec.apply(pv(), pvc(), pod("a", uid="ua"))
    rec.apply(
        pod("b", uid="ub", volumes=[inline]),
        pod("e", uid="ue", volumes=[{"name": "m", "emptyDir": {}}]),
    )
    sources = {uid: dsw.pods[uid].volumes[0].source for uid in ("ua", "ub", "ue")}
    assert sources["ua"].attributes == {} and sources["ua"].attributes is sources["ue"].attributes
    assert sources["ub"].attributes == {"k": "v"}
    for env in rec.envelopes:
        assert envelope_from_json(envelope_to_json(env)) == env
