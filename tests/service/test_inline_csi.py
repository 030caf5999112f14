"""Inline (ephemeral) CSI volumes and the CSIDriver object, end to end: a real `volfsm serve`,
volfsm's own CSI driver, the driver's call log.

One service and one driver for the module; the tests run in order as one story.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from events.streams import pod_stream
from events.types import VolumeMounted
from tests.helpers.asuser import run_as_member
from tests.helpers.csidriver import MIB, DriverProcess, cleanup_under, create_volume, mounts_at
from tests.service.helpers import ServeProcess, cli, unmount_under, until

DRIVER = "csi.volfsm.dev"
LATE = "late.csi.volfsm.dev"
FS_GROUP = 2345
USER = 1000


@pytest.fixture(scope="module")
def late(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DriverProcess]:
    """A second driver the service knows of but that starts only when a test says so."""
    tmp = tmp_path_factory.mktemp("latecsi")
    drv = DriverProcess(tmp / "driver", node_id="n1", name=LATE)
    drv.workdir.mkdir()
    try:
        yield drv
    finally:
        drv.close()
        cleanup_under(tmp)


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, late: DriverProcess
) -> Iterator[tuple[ServeProcess, DriverProcess]]:
    tmp = tmp_path_factory.mktemp("inlinecsi")
    drv = DriverProcess(tmp / "driver", node_id="n1")
    drv.workdir.mkdir()
    svc = ServeProcess(
        tmp / "svc",
        args=[
            "--csi",
            f"{DRIVER}={drv.endpoint}",
            "--csi",
            f"{LATE}={late.endpoint}",
            "--backoff-max",
            "1",
            "--csi-republish-period",
            "1",
        ],
    )
    svc.workdir.mkdir()
    try:
        drv.start()
        svc.start()
        yield svc, drv
    finally:
        svc.kill()
        unmount_under(tmp)
        drv.close()
        cleanup_under(tmp)


def apply(svc: ServeProcess, obj: dict[str, Any]) -> None:
    path = svc.workdir / f"{obj['kind']}-{obj['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(obj))
    code, out, err = cli(svc, "apply", "-f", str(path))
    assert code == 0, out + err


def inline_pod(name: str) -> dict[str, Any]:
    volume = {
        "name": "scratch",
        "csi": {"driver": DRIVER, "volumeAttributes": {"size": "16Mi", "app": "demo"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "serviceAccountName": "builder",
            "securityContext": {"fsGroup": FS_GROUP},
            "volumes": [volume],
        },
    }


CSI_DRIVER = {
    "apiVersion": "storage.k8s.io/v1",
    "kind": "CSIDriver",
    "metadata": {"name": DRIVER},
    "spec": {
        "attachRequired": False,
        "podInfoOnMount": True,
        "fsGroupPolicy": "File",
        "volumeLifecycleModes": ["Persistent", "Ephemeral"],
    },
}


def scratch_volume(svc: ServeProcess, name: str) -> dict[str, Any]:
    code, out, err = cli(svc, "get", "pods", f"default/{name}", "-o", "json")
    assert code == 0, err
    [pod] = json.loads(out)["items"]
    [vol] = pod["volumes"]
    return dict(vol)


def test_a_pod_waits_for_its_driver_to_register_then_mounts(
    world: tuple[ServeProcess, DriverProcess], late: DriverProcess
) -> None:
    """Applied before its driver registers: pending (the kubelet keeps it ContainerCreating),
    mounted once the driver registers, without applying anything again."""
    svc, _ = world
    pod = inline_pod("waiter")
    pod["spec"]["volumes"][0]["csi"]["driver"] = LATE
    apply(svc, {**CSI_DRIVER, "metadata": {"name": LATE}})
    path = svc.workdir / "waiter.yaml"
    path.write_text(yaml.safe_dump(pod))
    code, out, err = cli(svc, "apply", "-f", str(path))
    assert code == 0, out + err
    why = f"scratch: CSI driver {LATE}: not registered on this node yet"
    assert f"pod/default/waiter created (uid uid-waiter); accepted, waiting: {why}" in out
    vol = scratch_volume(svc, "waiter")
    assert (vol["state"], vol["waiting"]) == (
        "Unmounted",
        f"CSI driver {LATE}: not registered on this node yet",
    )
    late.start()
    code, out, err = cli(
        svc, "wait", "pod", "default/waiter", "--for", "mounted", "--timeout", "60"
    )
    assert code == 0, out + err
    [call] = late.calls("NodePublishVolume", event="start")
    assert call["pod_info"]["csi.storage.k8s.io/pod.uid"] == "uid-waiter"
    assert [m.fstype for m in mounts_at(Path(scratch_volume(svc, "waiter")["mount_path"]))] == [
        "ext4"
    ]
    with svc.open_log() as log:
        bodies = [
            type(e.body).__name__ for e in log.read_after(0) if e.stream == pod_stream("uid-waiter")
        ]
    assert bodies[:2] == ["PodPending", "PodAdded"]
    stop_pod(svc, "waiter")


def test_without_a_csidriver_object_an_inline_volume_is_refused(
    world: tuple[ServeProcess, DriverProcess],
) -> None:
    svc, drv = world
    apply(svc, inline_pod("early"))
    why = 'volume mode "Ephemeral" not supported by driver csi.volfsm.dev (no CSIDriver object)'

    def refused() -> dict[str, Any] | None:
        vol = scratch_volume(svc, "early")
        error = vol.get("last_error") or {}
        return vol if error.get("message") == why else None

    vol = until("the lifecycle refusal", refused)
    assert vol["state"] == "Unmounted" and vol["last_error"]["code"] == "LifecycleModeNotSupported"
    assert drv.calls("NodePublishVolume", event="start") == []  # refused before any call


def test_with_the_object_it_mounts_with_pod_info_and_fs_group(
    world: tuple[ServeProcess, DriverProcess],
) -> None:
    svc, drv = world
    apply(svc, CSI_DRIVER)
    code, out, err = cli(svc, "wait", "pod", "default/early", "--for", "mounted", "--timeout", "60")
    assert code == 0, out + err
    [call] = drv.calls("NodePublishVolume", event="start")
    assert call["pod_info"] == {
        "csi.storage.k8s.io/ephemeral": "true",
        "csi.storage.k8s.io/pod.name": "early",
        "csi.storage.k8s.io/pod.namespace": "default",
        "csi.storage.k8s.io/pod.uid": "uid-early",
        "csi.storage.k8s.io/serviceAccount.name": "builder",
    }
    assert "app" in call["context_keys"] and "size" in call["context_keys"]
    assert drv.calls("NodeStageVolume", event="start") == []  # inline: never staged
    path = Path(scratch_volume(svc, "early")["mount_path"])
    assert [m.fstype for m in mounts_at(path)] == ["ext4"]
    st = path.stat()
    assert st.st_gid == FS_GROUP and st.st_mode & stat.S_ISGID  # fsGroupPolicy File
    run_as_member(path, USER, FS_GROUP, "by-user", "sub")
    with svc.open_log() as log:
        [mounted] = [
            e.body
            for e in log.read_after(0)
            if isinstance(e.body, VolumeMounted) and e.body.pod_uid == "uid-early"
        ]
    assert mounted.ownership.startswith(f"fsGroup {FS_GROUP}: ")


def test_requires_republish_publishes_again(world: tuple[ServeProcess, DriverProcess]) -> None:
    svc, drv = world
    assert len(drv.calls("NodePublishVolume")) == 1  # no republish without the field
    apply(svc, {**CSI_DRIVER, "spec": {**CSI_DRIVER["spec"], "requiresRepublish": True}})
    until("two republishes", lambda: len(drv.codes("NodePublishVolume")) >= 3)
    assert set(drv.codes("NodePublishVolume")) == {"OK"}
    assert scratch_volume(svc, "early")["state"] == "Mounted"


def test_deleting_the_pod_deletes_the_inline_volume(
    world: tuple[ServeProcess, DriverProcess],
) -> None:
    svc, drv = world
    handle = drv.calls("NodePublishVolume")[0]["volume_id"]
    assert drv.volume_record(handle)["ephemeral"] is True
    code, _, err = cli(svc, "delete", "pod", "default/early")
    assert code == 0, err
    code, out, err = cli(
        svc, "wait", "pod", "default/early", "--for", "unmounted", "--timeout", "60"
    )
    assert code == 0, out + err
    assert drv.codes("NodeUnpublishVolume", handle) == ["OK"]
    assert not drv.image(handle).exists()


def claim_pod(name: str, *, read_only: bool) -> dict[str, Any]:
    claim = {"claimName": "shared-claim", "readOnly": read_only}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "securityContext": {"fsGroup": FS_GROUP, "fsGroupChangePolicy": "OnRootMismatch"},
            "volumes": [{"name": "data", "persistentVolumeClaim": claim}],
        },
    }


def mounted_record(svc: ServeProcess, uid: str) -> VolumeMounted:
    with svc.open_log() as log:
        found = [
            e.body
            for e in log.read_after(0)
            if isinstance(e.body, VolumeMounted) and e.body.pod_uid == uid
        ]
    return found[-1]


def run_pod(svc: ServeProcess, pod: dict[str, Any]) -> Path:
    apply(svc, pod)
    name = pod["metadata"]["name"]
    code, out, err = cli(
        svc, "wait", "pod", f"default/{name}", "--for", "mounted", "--timeout", "60"
    )
    assert code == 0, out + err
    return Path(scratch_volume(svc, name)["mount_path"])


def stop_pod(svc: ServeProcess, name: str) -> None:
    assert cli(svc, "delete", "pod", f"default/{name}")[0] == 0
    code, out, err = cli(
        svc, "wait", "pod", f"default/{name}", "--for", "unmounted", "--timeout", "60"
    )
    assert code == 0, out + err


def test_on_root_mismatch_and_read_only_on_a_claim(
    world: tuple[ServeProcess, DriverProcess],
) -> None:
    svc, drv = world
    create_volume(drv.clients(), "shared-vol", 64 * MIB)
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "shared-pv"},
        "spec": {
            "capacity": {"storage": "64Mi"},
            "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": DRIVER, "volumeHandle": "shared-vol", "fsType": "ext4"},
            "claimRef": {"namespace": "default", "name": "shared-claim"},
        },
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "shared-claim", "namespace": "default"},
        "spec": {"volumeName": "shared-pv", "accessModes": ["ReadWriteOnce"]},
        "status": {"phase": "Bound"},
    }
    apply(svc, volume)
    apply(svc, claim)
    read_only = run_pod(svc, claim_pod("reader", read_only=True))
    assert mounted_record(svc, "uid-reader").ownership == ""  # read-only: left alone
    assert read_only.stat().st_gid == 0
    stop_pod(svc, "reader")
    first = run_pod(svc, claim_pod("first", read_only=False))
    assert mounted_record(svc, "uid-first").ownership.startswith(f"fsGroup {FS_GROUP}: ")
    assert first.stat().st_gid == FS_GROUP
    stop_pod(svc, "first")
    run_pod(svc, claim_pod("second", read_only=False))
    skipped = mounted_record(svc, "uid-second")
    assert "not applied (OnRootMismatch: the root already matches)" in skipped.ownership
    stop_pod(svc, "second")
