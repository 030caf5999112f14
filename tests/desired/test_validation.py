"""Every way an apply is rejected: the error names the object and field; nothing changes."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from events.types import PodAdded, PodPending
from tests.desired.builders import (
    BLOCK_REFUSING_DRIVER,
    UNKNOWN_DRIVER,
    Recorder,
    can_serve,
    claim_volume,
    pod,
    pv,
    pvc,
    snapshot,
)
from volfsm.desired import DesiredStateOfWorld, InvalidObjectError
from volfsm.desired.errors import InvalidObjectsError
from volfsm.node.layout import RootLayout
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.emptydir import EmptyDirPlugin


@pytest.fixture
def dsw() -> DesiredStateOfWorld:
    return DesiredStateOfWorld(can_serve)


@pytest.fixture
def seeded(dsw: DesiredStateOfWorld) -> DesiredStateOfWorld:
    """A DSW holding PV pv-data, claim default/data and pod default/web using it."""
    Recorder(dsw).apply(pv(), pvc(), pod())
    return dsw


def rejected(dsw: DesiredStateOfWorld, objects: list[Any], field: str, *fragments: str) -> str:
    """Assert plan_apply raises naming `field`, `fragments` in the message, changing nothing."""
    before = snapshot(dsw)
    with pytest.raises(InvalidObjectError) as info:
        dsw.plan_apply(objects)
    err = info.value
    assert err.field == field, str(err)
    assert str(err) == f"{err.field}: {err.message}"
    for fragment in fragments:
        assert fragment in err.message, str(err)
    assert snapshot(dsw) == before
    return str(err)


# --------------------------------------------------------------- kinds, shapes


def test_kinds_a_node_does_not_run_are_skipped_and_the_rest_applied(
    dsw: DesiredStateOfWorld,
) -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}}
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}}
    deploy["metadata"]["namespace"] = "shop"
    plan = dsw.plan_apply([service, pv(), deploy, pvc(), pod()])
    assert [str(s) for s in plan.skipped] == [
        "service/svc skipped: a node does not run Service objects (v1)",
        "deployment.apps/shop/web skipped: a node does not run Deployment objects (apps/v1)",
    ]
    assert [r.kind for r in plan.results] == ["PersistentVolume", "PersistentVolumeClaim", "Pod"]


def test_missing_kind_names_the_list_index(dsw: DesiredStateOfWorld) -> None:
    rejected(dsw, [pv(), {"metadata": {"name": "x"}}], "objects[1]: kind", "unknown kind None")


def test_wrong_api_version(dsw: DesiredStateOfWorld) -> None:
    obj = pod()
    obj["apiVersion"] = "apps/v1"
    rejected(dsw, [obj], "Pod default/web: apiVersion", "apiVersion v1")


def test_object_that_is_not_a_mapping(dsw: DesiredStateOfWorld) -> None:
    rejected(dsw, [pv(), ["not", "an", "object"]], "objects[1]", "expected an object")


def test_unnamed_object_is_named_by_index(dsw: DesiredStateOfWorld) -> None:
    obj = pod()
    del obj["metadata"]
    rejected(dsw, [obj], "objects[0] (Pod): metadata", "required field is missing")


def test_decoding_error_names_object_and_field_path(dsw: DesiredStateOfWorld) -> None:
    obj = pod(volumes=[{"name": "a", "emptyDir": {}}, {"name": 7, "emptyDir": {}}])
    message = rejected(dsw, [obj], "Pod default/web: spec.volumes[1].name", "Expected `str`")
    assert message.startswith("Pod default/web: spec.volumes[1].name: ")


def test_a_pod_without_uid_gets_one(dsw: DesiredStateOfWorld) -> None:
    obj = pod()
    del obj["metadata"]["uid"]
    plan = dsw.plan_apply([pv(), pvc(), obj])
    uid = plan.results[-1].uid
    assert str(uuid.UUID(uid)) == uid
    added = plan.changes[0].body
    assert isinstance(added, PodAdded) and added.pod_uid == uid


def test_non_string_volume_attribute(dsw: DesiredStateOfWorld) -> None:
    obj = pv(volumeAttributes={"replicas": 3})
    rejected(dsw, [obj], "PersistentVolume pv-data: spec.csi.volumeAttributes[...]", "`str`")


def test_non_string_attribute_key(dsw: DesiredStateOfWorld) -> None:
    obj = pv(volumeAttributes={1: "x"})
    rejected(dsw, [obj], "PersistentVolume pv-data: spec.csi.volumeAttributes", "(in a key)")


def test_invalid_volume_mode_value(dsw: DesiredStateOfWorld) -> None:
    rejected(dsw, [pv(mode="Raw")], "PersistentVolume pv-data: spec.volumeMode", "'Raw'")


def test_invalid_access_mode(dsw: DesiredStateOfWorld) -> None:
    obj = pv()
    obj["spec"]["accessModes"] = ["RWO"]
    rejected(dsw, [obj], "PersistentVolume pv-data: spec.accessModes[0]", "'RWO'")


# ------------------------------------------------------------- volume sources


UNSERVED = [
    {"name": "host", "hostPath": {"path": "/srv"}},
    {"name": "share", "nfs": {"server": "nfs.example.com", "path": "/export"}},
    {"name": "creds", "secret": {"secretName": "db"}},
    {"name": "conf", "configMap": {"name": "app"}},
    {"name": "disk", "gcePersistentDisk": {"pdName": "d"}},
]


def test_every_unserved_volume_source_is_named_in_one_line(dsw: DesiredStateOfWorld) -> None:
    obj = pod(volumes=[{"name": "a", "emptyDir": {}}, *UNSERVED])
    message = rejected(dsw, [obj], "Pod default/web: spec.volumes", "no volume plugin")
    assert message == (
        "Pod default/web: spec.volumes: no volume plugin on this node serves host (hostPath), "
        "share (nfs), creds (secret), conf (configMap), "
        "disk (gcePersistentDisk)"
    )


def test_a_key_that_is_no_volume_source(dsw: DesiredStateOfWorld) -> None:
    obj = pod(volumes=[{"name": "a", "emptyDir": {}}, {"name": "b", "confgMap": {}}])
    rejected(
        dsw, [obj], "Pod default/web: spec.volumes[1].confgMap", "unknown volume source 'confgMap'"
    )


def test_more_than_one_source_in_a_volume(dsw: DesiredStateOfWorld) -> None:
    volume = {"name": "a", "emptyDir": {}, "csi": {"driver": "x.example.com"}}
    rejected(dsw, [pod(volumes=[volume])], "Pod default/web: spec.volumes[0]", "exactly one")


def test_volume_without_a_source(dsw: DesiredStateOfWorld) -> None:
    rejected(dsw, [pod(volumes=[{"name": "a"}])], "Pod default/web: spec.volumes[0]", "none")


def test_null_volume_source(dsw: DesiredStateOfWorld) -> None:
    obj = pod(volumes=[{"name": "a", "emptyDir": None}])
    rejected(dsw, [obj], "Pod default/web: spec.volumes[0].emptyDir", "must be an object")


def test_invalid_empty_dir_medium(dsw: DesiredStateOfWorld) -> None:
    for medium in ("Disk", "memory", "HugePages-lots"):
        obj = pod(volumes=[{"name": "a", "emptyDir": {"medium": medium}}])
        rejected(dsw, [obj], "Pod default/web: spec.volumes[0].emptyDir.medium", repr(medium))


def test_huge_pages_media_are_valid_but_not_served(tmp_path: Path) -> None:
    # valid API values (the kubelet mounts hugetlbfs for them); the emptyDir plugin does not
    # serve them, and the refusal says so in one line rather than calling the manifest invalid
    catalog = PluginCatalog()
    catalog.register(EmptyDirPlugin(RootLayout(tmp_path)))
    dsw = DesiredStateOfWorld(catalog.can_serve)
    for medium in ("HugePages", "HugePages-2Mi", "HugePages-1Gi"):
        obj = pod(volumes=[{"name": "huge", "emptyDir": {"medium": medium}}])
        rejected(
            dsw,
            [obj],
            "Pod default/web: spec.volumes[0].emptyDir",
            f"emptyDir medium '{medium}' is not served on this node: volfsm mounts no hugetlbfs",
        )


def test_volume_mounts_are_checked_as_the_api_server_checks_them(
    dsw: DesiredStateOfWorld,
) -> None:
    obj = pod(volumes=[{"name": "cache", "emptyDir": {}}])
    obj["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "cache", "mountPath": "/cache", "subPath": "logs/app"},
        {"name": "config", "mountPath": "/config"},
    ]
    obj["spec"]["initContainers"] = [
        {
            "name": "init",
            "volumeMounts": [
                {"name": "cache"},
                {"name": "cache", "mountPath": "/a", "subPath": "../up"},
                {"name": "cache", "mountPath": "/b", "subPath": "x", "subPathExpr": "$(POD)"},
            ],
        }
    ]
    before = snapshot(dsw)
    with pytest.raises(InvalidObjectsError) as info:
        dsw.plan_apply([obj])
    init = "Pod default/web: spec.initContainers[0].volumeMounts"
    assert str(info.value).splitlines() == [
        "Pod default/web: spec.containers[0].volumeMounts[1].name: not found: the pod has no "
        "volume 'config'",
        f"{init}[0].mountPath: required",
        f"{init}[1].subPath: must not contain '..'",
        f"{init}[2].subPathExpr: subPathExpr and subPath are mutually exclusive",
    ]
    assert snapshot(dsw) == before


def test_invalid_empty_dir_size_limit(dsw: DesiredStateOfWorld) -> None:
    obj = pod(volumes=[{"name": "a", "emptyDir": {"medium": "Memory", "sizeLimit": "lots"}}])
    rejected(dsw, [obj], "Pod default/web: spec.volumes[0].emptyDir.sizeLimit", "'lots'")


def test_inline_csi_driver_the_plugin_cannot_serve(dsw: DesiredStateOfWorld) -> None:
    obj = pod(volumes=[{"name": "a", "csi": {"driver": UNKNOWN_DRIVER}}])
    rejected(dsw, [obj], "Pod default/web: spec.volumes[0].csi", "no CSI driver")


def test_inline_csi_driver_name_that_is_not_a_path_component(dsw: DesiredStateOfWorld) -> None:
    obj = pod(volumes=[{"name": "a", "csi": {"driver": "../../etc"}}])
    rejected(dsw, [obj], "Pod default/web: spec.volumes[0].csi.driver", "'../../etc'")


# ---------------------------------------------------------------------- claims


def waits(dsw: DesiredStateOfWorld, objects: list[Any], volume: str, *fragments: str) -> str:
    """Assert plan_apply accepts the pod as pending: its volume waits, as the text says."""
    plan = dsw.plan_apply(objects)
    [pending] = [c.body for c in plan.changes if isinstance(c.body, PodPending)]
    assert isinstance(pending, PodPending)
    [waiting] = pending.waiting
    assert waiting.name == volume
    for fragment in fragments:
        assert fragment in waiting.text, waiting.text
    [result] = [r for r in plan.results if r.kind == "Pod"]
    assert result.waiting == f"{volume}: {waiting.text}"
    return waiting.text


def test_claim_not_found_waits(dsw: DesiredStateOfWorld) -> None:
    assert waits(dsw, [pv(), pod()], "data") == (
        "PersistentVolumeClaim default/data: not found yet"
    )


def test_claim_in_another_namespace_is_not_found(dsw: DesiredStateOfWorld) -> None:
    waits(dsw, [pv(claim=None), pvc(namespace="other"), pod()], "data", "default/data: not found")


def test_claim_not_bound_waits(dsw: DesiredStateOfWorld) -> None:
    # a node has no PV controller: the reason says what to apply instead
    waits(
        dsw,
        [pvc(volume="", phase="Pending"), pod()],
        "data",
        "not bound yet (spec.volumeName is empty; the PV controller binds claims and volfsm "
        "has none: apply the claim with spec.volumeName naming its PersistentVolume)",
    )


def test_claim_with_volume_name_but_pending_phase(dsw: DesiredStateOfWorld) -> None:
    waits(dsw, [pv(), pvc(phase="Lost"), pod()], "data", "not bound yet (phase Lost)")


def test_bound_volume_not_found_waits(dsw: DesiredStateOfWorld) -> None:
    text = waits(dsw, [pvc(volume="pv-gone"), pod()], "data")
    assert text == (
        "PersistentVolume pv-gone: not found yet (PersistentVolumeClaim default/data is bound "
        "to it)"
    )


def test_volume_bound_to_another_claim(dsw: DesiredStateOfWorld) -> None:
    rejected(
        dsw,
        [pv(claim=("default", "other")), pvc()],
        "PersistentVolumeClaim default/data: spec.volumeName",
        "bound to claim default/other",
    )


def test_claim_volume_mode_conflicts_with_volume(dsw: DesiredStateOfWorld) -> None:
    rejected(
        dsw,
        [pv(mode="Block"), pvc(mode="Filesystem")],
        "PersistentVolumeClaim default/data: spec.volumeMode",
        "conflicts with PersistentVolume pv-data volumeMode Block",
    )


def test_claim_mode_conflict_found_through_a_remembered_claim(dsw: DesiredStateOfWorld) -> None:
    # The claim was applied before its volume existed; the pod brings the volume.
    Recorder(dsw).apply(pvc(mode="Block"))
    rejected(
        dsw,
        [pv(), pod()],
        "Pod default/web: spec.volumes[0].persistentVolumeClaim.claimName",
        "spec.volumeMode",
        "conflicts",
    )


def test_claim_volume_name_is_immutable(seeded: DesiredStateOfWorld) -> None:
    rejected(
        seeded,
        [pv("pv-two", handle="vol-2"), pvc(volume="pv-two")],
        "PersistentVolumeClaim default/data: spec.volumeName",
        "immutable",
    )


def test_same_claim_twice_in_one_pod(dsw: DesiredStateOfWorld) -> None:
    obj = pod(volumes=[claim_volume("a"), claim_volume("b")])
    rejected(dsw, [pv(), pvc(), obj], "Pod default/web: spec.volumes[1]", "already used")


# ----------------------------------------------------------------------- names


def test_duplicate_volume_names(dsw: DesiredStateOfWorld) -> None:
    obj = pod(volumes=[{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}])
    rejected(dsw, [obj], "Pod default/web: spec.volumes[1].name", "duplicate", "spec.volumes[0]")


UNSAFE = ["", ".", "..", "a/b", "../../etc", "/abs", "a\x00b", "caf\u00e9", "a b", "x" * 254]


@pytest.mark.parametrize("uid", UNSAFE[1:])  # "" is no uid: one is given
def test_unsafe_pod_uid(dsw: DesiredStateOfWorld, uid: str) -> None:
    rejected(dsw, [pod(uid=uid, volumes=[])], "Pod default/web: metadata.uid")


@pytest.mark.parametrize("name", UNSAFE)
def test_unsafe_volume_name(dsw: DesiredStateOfWorld, name: str) -> None:
    obj = pod(volumes=[{"name": name, "emptyDir": {}}])
    rejected(dsw, [obj], "Pod default/web: spec.volumes[0].name")


def test_longest_safe_names_are_accepted(dsw: DesiredStateOfWorld) -> None:
    obj = pod(uid="u" * 253, volumes=[{"name": "v-1.x_" + "y" * 247, "emptyDir": {}}])
    assert len(dsw.plan_apply([obj]).changes) == 1


@pytest.mark.parametrize("namespace", ["Default", "a_b", "-a", "x" * 64])
def test_bad_namespace(dsw: DesiredStateOfWorld, namespace: str) -> None:
    obj = pod(namespace=namespace, volumes=[])
    rejected(dsw, [obj], f"Pod {namespace}/web: metadata.namespace", "DNS-1123 label")


@pytest.mark.parametrize("name", ["Web", "a_b", "a..b", "-a", "a/b"])
def test_bad_object_name(dsw: DesiredStateOfWorld, name: str) -> None:
    rejected(dsw, [pv(name)], f"PersistentVolume {name}: metadata.name", "DNS-1123 subdomain")


# ------------------------------------------------------------ persistent volumes


def test_volume_mode_the_plugin_cannot_serve(dsw: DesiredStateOfWorld) -> None:
    obj = pv(driver=BLOCK_REFUSING_DRIVER, mode="Block")
    rejected(
        dsw,
        [obj],
        "PersistentVolume pv-data: spec.volumeMode",
        "does not support block",
        BLOCK_REFUSING_DRIVER,
    )


def test_volume_without_csi(dsw: DesiredStateOfWorld) -> None:
    obj = pv()
    obj["spec"]["nfs"] = {"server": "nfs.example", "path": "/srv"}
    del obj["spec"]["csi"]
    rejected(dsw, [obj], "PersistentVolume pv-data: spec.csi", "only CSI, hostPath and local")


def test_volume_without_capacity(dsw: DesiredStateOfWorld) -> None:
    obj = pv()
    del obj["spec"]["capacity"]
    rejected(dsw, [obj], "PersistentVolume pv-data: spec.capacity.storage", "missing")


def test_volume_with_bad_capacity(dsw: DesiredStateOfWorld) -> None:
    rejected(dsw, [pv(storage="1GB")], "PersistentVolume pv-data: spec.capacity.storage", "1GB")


def test_volume_with_empty_handle(dsw: DesiredStateOfWorld) -> None:
    rejected(dsw, [pv(handle="")], "PersistentVolume pv-data: spec.csi.volumeHandle", "empty")


def test_volume_shrink_is_rejected(seeded: DesiredStateOfWorld) -> None:
    rejected(
        seeded,
        [pv(storage="512Mi")],
        "PersistentVolume pv-data: spec.capacity.storage",
        "do not shrink",
        "512Mi < 1Gi",
    )


def test_volume_shrink_is_rejected_against_desired_size_after_restart(
    dsw: DesiredStateOfWorld,
) -> None:
    recorder = Recorder(dsw)
    recorder.apply(pv(), pvc(), pod())
    recorder.apply(pv(storage="2Gi"))
    # A DSW rebuilt from the log knows the pods and sizes but no PV objects.
    fresh = DesiredStateOfWorld(can_serve)
    for env in recorder.envelopes:
        fresh.observe(env)
    assert fresh.persistent_volumes == {}
    rejected(fresh, [pv(storage="1Gi")], "PersistentVolume pv-data: spec.capacity.storage", "2Gi")


def test_volume_source_is_immutable(seeded: DesiredStateOfWorld) -> None:
    rejected(seeded, [pv(handle="vol-other")], "PersistentVolume pv-data: spec", "immutable")


def test_volume_mode_is_immutable(seeded: DesiredStateOfWorld) -> None:
    rejected(seeded, [pv(mode="Block")], "PersistentVolume pv-data: spec.volumeMode", "immutable")


# ------------------------------------------------------------------------ pods


def test_changing_a_pods_volumes_under_the_same_uid(seeded: DesiredStateOfWorld) -> None:
    changed = pod(volumes=[claim_volume(), {"name": "scratch", "emptyDir": {}}])
    rejected(seeded, [changed], "Pod default/web: spec.volumes", "pods are immutable", "new uid")


def test_changing_read_only_under_the_same_uid(seeded: DesiredStateOfWorld) -> None:
    changed = pod(volumes=[claim_volume(read_only=True)])
    rejected(seeded, [changed], "Pod default/web: spec.volumes", "immutable")


def test_reusing_a_uid_for_another_pod(seeded: DesiredStateOfWorld) -> None:
    other = pod("db", uid="uid-web")
    rejected(seeded, [other], "Pod default/db: metadata.uid", "already belongs to pod default/web")


def test_two_pods_with_one_name_in_one_apply(dsw: DesiredStateOfWorld) -> None:
    first, second = pod(uid="u1", volumes=[]), pod(uid="u2", volumes=[])
    rejected(dsw, [first, second], "Pod default/web: metadata.uid", "two pods named default/web")


def test_conflicting_duplicates_in_one_apply(dsw: DesiredStateOfWorld) -> None:
    rejected(
        dsw,
        [pv(), pv(storage="2Gi")],
        "PersistentVolume pv-data: metadata.name",
        "given twice",
        "objects[0]",
    )


# ------------------------------------------------------------- all-or-nothing


def test_one_bad_object_rejects_the_whole_apply(dsw: DesiredStateOfWorld) -> None:
    good = pod("good", uid="uid-good", volumes=[{"name": "a", "emptyDir": {}}])
    bad = pod("bad", uid="uid-bad", volumes=[{"name": "a", "hostPath": {"path": "/"}}])
    rejected(dsw, [pv(), pvc(), good, bad], "Pod default/bad: spec.volumes", "a (hostPath)")
    assert dsw.pods == {}
    assert dsw.persistent_volumes == {}


def test_a_later_bad_object_does_not_let_earlier_objects_through(
    seeded: DesiredStateOfWorld,
) -> None:
    grown = pv(storage="5Gi")
    rejected(seeded, [grown, pod("x", uid="bad/uid", volumes=[])], "Pod default/x: metadata.uid")
    assert seeded.desired_size("kubernetes.io/csi/hostpath.csi.example.com^vol-1") == 1024**3


# ------------------------------------------------------------------ nodeName


def test_a_pod_for_another_node_is_refused_and_one_without_a_node_accepted() -> None:
    dsw = DesiredStateOfWorld(can_serve, node_name="node-1")
    elsewhere = pod("web", uid="uid-web")
    elsewhere["spec"]["nodeName"] = "node-2"
    here = pod("db", uid="uid-db", volumes=[{"name": "a", "emptyDir": {}}])
    here["spec"]["nodeName"] = "node-1"
    anywhere = pod("tmp", uid="uid-tmp", volumes=[{"name": "a", "emptyDir": {}}])

    message = rejected(dsw, [pv(), pvc(), here, elsewhere], "Pod default/web: spec.nodeName")
    assert message == 'Pod default/web: spec.nodeName: "node-2" is not this node ("node-1")'
    assert dsw.pods == {}
    assert len(dsw.plan_apply([here, anywhere]).changes) == 2
    assert len(DesiredStateOfWorld(can_serve).plan_apply([elsewhere, pv(), pvc()]).changes) == 1
