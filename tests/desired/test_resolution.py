"""Pod volumes resolved to DesiredVolumes: PVC -> CSI PV, inline CSI, emptyDir, block."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import pytest

from events.streams import pod_stream
from events.types import PodAdded, VolumeSource
from tests.desired.builders import can_serve, claim_volume, pod, pv, pvc
from volfsm.desired import PLUGIN_CSI, PLUGIN_EMPTY_DIR, DesiredStateOfWorld
from volfsm.errors import InvalidObjectError


def only_pod(dsw: DesiredStateOfWorld, *objects: Mapping[str, Any]) -> PodAdded:
    plan = dsw.plan_apply(list(objects))
    [change] = [c for c in plan.changes if isinstance(c.body, PodAdded)]
    assert isinstance(change.body, PodAdded)
    assert change.stream == pod_stream(change.body.pod_uid)
    return change.body


def test_claim_resolves_to_its_csi_volume() -> None:
    dsw = DesiredStateOfWorld(can_serve)
    volume = pv(
        storage="10Gi",
        fsType="ext4",
        readOnly=False,
        volumeAttributes={"pool": "fast"},
        nodeStageSecretRef={"name": "stage", "namespace": "kube-system"},
        nodePublishSecretRef={"name": "pub", "namespace": "apps"},
    )
    volume["spec"]["mountOptions"] = ["noatime", "discard"]
    volume["spec"]["accessModes"] = ["ReadWriteOnce", "ReadOnlyMany"]
    added = only_pod(dsw, volume, pvc(), pod())
    assert (added.pod_uid, added.namespace, added.name) == ("uid-web", "default", "web")
    [vol] = added.volumes
    assert vol.name == "data"
    assert vol.volume_id == "kubernetes.io/csi/hostpath.csi.example.com^vol-1"
    assert vol.source == VolumeSource(
        plugin=PLUGIN_CSI,
        driver="hostpath.csi.example.com",
        volume_handle="vol-1",
        fs_type="ext4",
        mount_options=("noatime", "discard"),
        attributes={"pool": "fast"},
        access_modes=("ReadWriteOnce", "ReadOnlyMany"),
        node_stage_secret_ref="kube-system/stage",
        node_publish_secret_ref="apps/pub",
    )
    assert vol.volume_mode == "Filesystem"
    assert (vol.pv_name, vol.claim_name) == ("pv-data", "data")
    assert vol.size_bytes == 10 * 1024**3
    assert vol.read_only is False


def test_read_only_comes_from_the_pod_or_the_volume() -> None:
    dsw = DesiredStateOfWorld(can_serve)
    [by_pod] = only_pod(dsw, pv(), pvc(), pod(volumes=[claim_volume(read_only=True)])).volumes
    assert by_pod.read_only and by_pod.claim_read_only
    [by_pv] = only_pod(dsw, pv(readOnly=True), pvc(), pod()).volumes
    assert by_pv.read_only and not by_pv.claim_read_only


def test_block_mode_volume() -> None:
    dsw = DesiredStateOfWorld(can_serve)
    [vol] = only_pod(dsw, pv(mode="Block"), pvc(mode="Block"), pod()).volumes
    assert vol.volume_mode == "Block"
    assert vol.volume_id == "kubernetes.io/csi/hostpath.csi.example.com^vol-1"


def test_can_serve_sees_the_source_and_mode() -> None:
    seen: list[tuple[VolumeSource, str]] = []

    def recording(source: VolumeSource, mode: str) -> str | None:
        seen.append((source, mode))
        return None

    dsw = DesiredStateOfWorld(recording)
    dsw.plan_apply([pv(mode="Block"), pvc(mode="Block"), pod()])
    assert {(s.plugin, s.volume_handle, mode) for s, mode in seen} == {
        (PLUGIN_CSI, "vol-1", "Block")
    }


def test_inline_csi_volume_is_pod_scoped() -> None:
    dsw = DesiredStateOfWorld(can_serve)
    inline = {
        "name": "cache",
        "csi": {
            "driver": "inline.csi.example.com",
            "fsType": "xfs",
            "readOnly": True,
            "volumeAttributes": {"size": "1Gi"},
            "nodePublishSecretRef": {"name": "creds"},
        },
    }
    added = only_pod(dsw, pod(namespace="apps", volumes=[inline]))
    [vol] = added.volumes
    assert vol.volume_id == "kubernetes.io/csi/inline.csi.example.com^uid-web-cache"
    expected_handle = "csi-" + hashlib.sha256(b"uid-webcache").hexdigest()
    assert vol.source == VolumeSource(
        plugin=PLUGIN_CSI,
        driver="inline.csi.example.com",
        volume_handle=expected_handle,
        fs_type="xfs",
        attributes={"size": "1Gi"},
        node_publish_secret_ref="apps/creds",
    )
    assert vol.read_only is True
    assert (vol.pv_name, vol.claim_name, vol.size_bytes) == ("", "", None)
    assert vol.volume_mode == "Filesystem"


def test_empty_dir_on_disk_and_in_memory() -> None:
    dsw = DesiredStateOfWorld(can_serve)
    volumes = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
    ]
    scratch, shm = only_pod(dsw, pod(volumes=volumes)).volumes
    assert scratch.volume_id == "kubernetes.io/empty-dir/uid-web-scratch"
    assert scratch.source == VolumeSource(plugin=PLUGIN_EMPTY_DIR)
    assert shm.volume_id == "kubernetes.io/empty-dir/uid-web-shm"
    assert shm.source == VolumeSource(
        plugin=PLUGIN_EMPTY_DIR, medium="Memory", size_limit_bytes=64 * 1024**2
    )
    assert shm.volume_mode == "Filesystem"


def test_two_pods_share_a_claimed_volume_but_not_pod_scoped_ones() -> None:
    dsw = DesiredStateOfWorld(can_serve)
    volumes = [claim_volume(), {"name": "tmp", "emptyDir": {}}]
    plan = dsw.plan_apply(
        [
            pv(claim=None),
            pvc(),
            pod("a", uid="ua", volumes=volumes),
            pod("b", uid="ub", volumes=volumes),
        ]
    )
    a, b = (c.body for c in plan.changes)
    assert isinstance(a, PodAdded) and isinstance(b, PodAdded)
    assert a.volumes[0].volume_id == b.volumes[0].volume_id
    assert a.volumes[1].volume_id != b.volumes[1].volume_id


def test_pod_without_volumes_and_default_namespace() -> None:
    dsw = DesiredStateOfWorld(can_serve)
    obj = pod(volumes=[])
    del obj["metadata"]["namespace"]
    added = only_pod(dsw, obj)
    assert added.namespace == "default"
    assert added.volumes == ()


def test_claim_and_volume_remembered_from_an_earlier_apply() -> None:
    dsw = DesiredStateOfWorld(can_serve)
    plan = dsw.plan_apply([pv(), pvc()])
    assert plan.changes == []
    dsw.commit_objects(plan)
    [vol] = only_pod(dsw, pod()).volumes
    assert vol.pv_name == "pv-data"


def test_objects_in_a_kind_list() -> None:
    dsw = DesiredStateOfWorld(can_serve)
    listed = {"apiVersion": "v1", "kind": "List", "items": [pv(), pvc(), pod()]}
    [vol] = only_pod(dsw, listed).volumes
    assert vol.claim_name == "data"


def test_claim_status_capacity_is_carried_with_the_volume() -> None:
    claim = pvc()
    claim["status"]["capacity"] = {"storage": "512Mi"}
    added = only_pod(DesiredStateOfWorld(can_serve), pv(storage="1Gi"), claim, pod())
    [vol] = added.volumes
    assert (vol.size_bytes, vol.claim_capacity_bytes) == (1 << 30, 512 << 20)
    plain = only_pod(DesiredStateOfWorld(can_serve), pv(), pvc(), pod())
    assert plain.volumes[0].claim_capacity_bytes is None  # the claim says nothing


def test_a_malformed_claim_status_capacity_is_refused() -> None:
    claim = pvc()
    claim["status"]["capacity"] = {"storage": "lots"}
    with pytest.raises(InvalidObjectError) as caught:
        DesiredStateOfWorld(can_serve).plan_apply([pv(), claim, pod()])
    assert "PersistentVolumeClaim default/data" in str(caught.value)
    assert "status.capacity.storage" in str(caught.value)
