"""Pods that wait for their claims, end to end through a real `volfsm serve`.

A pod applied before its claim (a generic ephemeral volume's `<pod>-<volume>`,
or a plain persistentVolumeClaim) is accepted as pending, as the kubelet's
populator keeps it: `get`, `wait` and `explain` say what it waits for, and
an apply of the claim and its PV mounts it without applying the pod again,
also after a restart. A claim owned by another pod is refused; a pending pod
can be deleted. hostPath PVs keep it lean: nothing is mounted under the root
dir. One service for the module.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.service.helpers import ServeProcess, cli, unmount_under


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, Path]]:
    """A running service, and a dir for manifests and host paths."""
    tmp = tmp_path_factory.mktemp("pending")
    svc = ServeProcess(tmp / "svc")
    svc.workdir.mkdir()
    try:
        svc.start()
        yield svc, tmp
    finally:
        svc.kill()
        unmount_under(tmp)


def apply(svc: ServeProcess, tmp: Path, name: str, *objects: dict[str, Any]) -> tuple[int, str]:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    code, out, err = cli(svc, "apply", "-f", str(path))
    return code, out + err


def ephemeral_pod(name: str) -> dict[str, Any]:
    template = {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {}}}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox"}],
            "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": template}}],
        },
    }


def claim_and_pv(pod: str, host: Path, owner: str = "") -> list[dict[str, Any]]:
    """The claim `<pod>-scratch` controlled by the pod (or `owner`), bound to a hostPath PV."""
    claim_name = f"{pod}-scratch"
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"pv-{pod}"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": str(host / pod), "type": "DirectoryOrCreate"},
            "claimRef": {"namespace": "default", "name": claim_name},
        },
    }
    owner_ref = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": pod,
        "uid": owner or f"uid-{pod}",
        "controller": True,
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim_name, "namespace": "default", "ownerReferences": [owner_ref]},
        "spec": {"volumeName": f"pv-{pod}", "accessModes": ["ReadWriteOnce"]},
        "status": {"phase": "Bound"},
    }
    return [volume, claim]


def pod_status(svc: ServeProcess, name: str) -> dict[str, Any]:
    code, out, err = cli(svc, "get", "pods", f"default/{name}", "-o", "json")
    assert code == 0, err
    [pod] = json.loads(out)["items"]
    assert isinstance(pod, dict)
    return pod


def restart(svc: ServeProcess, sig: int) -> None:
    svc.stop(sig)
    svc.start()


def waits_for_its_claim(svc: ServeProcess, name: str) -> None:
    """The pod is desired, Pending, and its volume waits for the claim `<name>-scratch`."""
    pod = pod_status(svc, name)
    assert (pod["desired"], pod["phase"]) == (True, "Pending")
    [vol] = [v for v in pod["volumes"] if v["name"] == "scratch"]  # and the token volume
    assert {v["state"] for v in pod["volumes"]} == {"Unmounted"}
    assert vol["waiting"].startswith(f"PersistentVolumeClaim default/{name}-scratch: not found yet")


def test_a_pod_before_its_claim_waits_then_mounts(world: tuple[ServeProcess, Path]) -> None:
    svc, tmp = world
    code, text = apply(svc, tmp, "web", ephemeral_pod("web"))
    assert code == 0, text
    assert text.startswith(
        "pod/default/web created (uid uid-web); accepted, waiting: scratch: "
        "PersistentVolumeClaim default/web-scratch: not found yet; the ephemeral volume "
        "controller makes it from volumeClaimTemplate"
    ), text
    waits_for_its_claim(svc, "web")
    code, out, _ = cli(svc, "get", "pods", "default/web")
    assert "default/web scratch waiting: PersistentVolumeClaim default/web-scratch" in out
    code, _, err = cli(svc, "wait", "pod", "default/web", "--for", "mounted", "--timeout", "0.3")
    assert code == 1
    assert "volume scratch is Unmounted; waiting: PersistentVolumeClaim default/web" in err
    code, out, err = cli(svc, "explain", "pod", "default/web")
    assert code == 0, err
    assert "(pending: nothing is mounted until every volume resolves)" in out
    assert "  - volume scratch: PersistentVolumeClaim default/web-scratch: not found yet" in out

    code, text = apply(svc, tmp, "web-claim", *claim_and_pv("web", tmp))
    assert code == 0, text
    assert "pod/default/web no longer waiting (uid uid-web)" in text.splitlines()
    code, out, err = cli(svc, "wait", "pod", "default/web", "--for", "mounted", "--timeout", "30")
    assert code == 0, err
    [vol] = [v for v in pod_status(svc, "web")["volumes"] if v["name"] == "scratch"]
    assert (vol["claim"], vol["mount_path"]) == ("web-scratch", str(tmp / "web"))
    assert (tmp / "web").is_dir()


def test_a_claim_owned_by_another_pod_is_refused(world: tuple[ServeProcess, Path]) -> None:
    svc, tmp = world
    objects = [*claim_and_pv("other", tmp, owner="uid-someone-else"), ephemeral_pod("other")]
    code, text = apply(svc, tmp, "other", *objects)
    assert code == 1
    assert (
        "PVC default/other-scratch was not created for pod default/other (pod is not owner)"
    ) in text
    code, _, err = cli(svc, "get", "pods", "default/other")
    assert code == 2 and "no pod default/other" in err


def test_a_pending_pod_survives_restarts_then_mounts(world: tuple[ServeProcess, Path]) -> None:
    svc, tmp = world
    code, text = apply(svc, tmp, "late", ephemeral_pod("late"))
    assert code == 0 and "accepted, waiting: scratch: " in text, text
    restart(svc, signal.SIGTERM)  # a final snapshot holds the pending pod
    waits_for_its_claim(svc, "late")
    restart(svc, signal.SIGKILL)  # the log's fold holds it
    waits_for_its_claim(svc, "late")
    code, text = apply(svc, tmp, "late-claim", *claim_and_pv("late", tmp))
    assert code == 0 and "pod/default/late no longer waiting (uid uid-late)" in text, text
    code, _, err = cli(svc, "wait", "pod", "default/late", "--for", "mounted", "--timeout", "30")
    assert code == 0, err


def test_a_pending_pod_is_deleted(world: tuple[ServeProcess, Path]) -> None:
    svc, tmp = world
    code, text = apply(svc, tmp, "gone", ephemeral_pod("gone"))
    assert code == 0, text
    code, out, err = cli(svc, "delete", "pod", "default/gone")
    assert (code, out) == (0, "pod/default/gone deleted\n"), err
    code, _, err = cli(svc, "wait", "pod", "default/gone", "--for", "unmounted", "--timeout", "30")
    assert code == 0, err
    code, text = apply(svc, tmp, "gone-claim", *claim_and_pv("gone", tmp))
    assert code == 0 and "gone no longer waiting" not in text, text
    assert not (tmp / "gone").exists()  # no pod uses its PV: nothing made the host path
    code, out, err = cli(svc, "validate")
    assert code == 0, out + err
