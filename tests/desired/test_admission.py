"""ServiceAccount admission at apply, as kube-apiserver's plugin does it (unit)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from events.types import PodAdded, VolumeSource
from tests.desired.builders import Recorder
from volfsm.desired import DesiredStateOfWorld
from volfsm.desired.admission import (
    NAME_ALPHABET,
    PUBLISHED_BY,
    TOKEN_MOUNT_PATH,
    Admission,
    admit_pod,
    api_access_name,
    token_volume_source,
)

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
TOKEN_MOUNT = {"name": "", "readOnly": True, "mountPath": TOKEN_MOUNT_PATH}


def docs_pod(name: str = "web", uid: str = "uid-web", **spec: Any) -> dict[str, Any]:
    """A pod as the documentation writes it: containers, no volumes."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}], **spec},
    }


def mounts(pod: dict[str, Any], key: str = "containers") -> list[list[dict[str, Any]]]:
    return [c.get("volumeMounts", []) for c in pod["spec"][key]]


def token_mount(volume: str) -> dict[str, Any]:
    return {**TOKEN_MOUNT, "name": volume}


def test_a_docs_pod_gets_the_default_account_and_the_api_servers_token_volume() -> None:
    pod = docs_pod()
    added = admit_pod(pod, None)
    assert added == api_access_name("uid-web")
    assert added.startswith("kube-api-access-") and len(added) == len("kube-api-access-") + 5
    assert set(added.removeprefix("kube-api-access-")) <= set(NAME_ALPHABET)
    assert pod["spec"]["serviceAccountName"] == "default"
    assert pod["spec"]["volumes"] == [{"name": added, "projected": token_volume_source()}]
    assert token_volume_source() == {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {
                "configMap": {
                    "name": "kube-root-ca.crt",
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }
            },
            {
                "downwardAPI": {
                    "items": [
                        {
                            "path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                        }
                    ]
                }
            },
        ],
    }
    assert mounts(pod) == [[token_mount(added)]]


def test_the_name_comes_from_the_uid_so_the_same_pod_is_admitted_the_same() -> None:
    first, again, other = docs_pod(), docs_pod(), docs_pod(uid="uid-other")
    assert admit_pod(first, None) == admit_pod(again, None) != admit_pod(other, None)
    assert first == again


@pytest.mark.parametrize(
    ("pod_flag", "account_flag", "mounted"),
    [
        (None, None, True),
        (False, None, False),
        (None, False, False),
        (True, False, True),  # the pod's word wins
        (False, True, False),
    ],
)
def test_automount_the_pods_flag_else_the_accounts_else_true(
    pod_flag: bool | None, account_flag: bool | None, mounted: bool
) -> None:
    spec = {} if pod_flag is None else {"automountServiceAccountToken": pod_flag}
    pod = docs_pod(serviceAccountName="build-robot", **spec)
    added = admit_pod(pod, account_flag)
    assert bool(added) is mounted
    assert ("volumes" in pod["spec"]) is mounted
    assert pod["spec"]["serviceAccountName"] == "build-robot"


def test_a_container_with_a_mount_at_the_path_keeps_it_and_the_others_get_the_volume() -> None:
    own = {"name": "my-token", "mountPath": TOKEN_MOUNT_PATH}
    pod = docs_pod(
        initContainers=[{"name": "init", "image": "busybox"}],
        volumes=[{"name": "my-token", "secret": {"secretName": "t"}}],
    )
    pod["spec"]["containers"][0]["volumeMounts"] = [own]
    added = admit_pod(pod, None)
    assert mounts(pod) == [[own]]
    assert mounts(pod, "initContainers") == [[token_mount(added)]]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["my-token", added]


def test_no_volume_when_every_container_has_a_mount_at_the_path() -> None:
    own = {"name": "my-token", "mountPath": TOKEN_MOUNT_PATH}
    pod = docs_pod(volumes=[{"name": "my-token", "secret": {"secretName": "t"}}])
    pod["spec"]["containers"][0]["volumeMounts"] = [own]
    before = copy.deepcopy(pod)
    assert admit_pod(pod, None) == ""
    assert pod["spec"] == {**before["spec"], "serviceAccountName": "default"}


def test_an_existing_kube_api_access_volume_is_reused_and_mounted_where_missing() -> None:
    dumped = {"name": "kube-api-access-q7mzt", "projected": token_volume_source()}
    pod = docs_pod(
        volumes=[{"name": "cache", "emptyDir": {}}, dumped],
        initContainers=[{"name": "init", "image": "busybox"}],
    )
    assert admit_pod(pod, None) == ""  # no volume added: it is there
    assert pod["spec"]["volumes"] == [{"name": "cache", "emptyDir": {}}, dumped]
    assert mounts(pod) == [[token_mount("kube-api-access-q7mzt")]]
    assert mounts(pod, "initContainers") == [[token_mount("kube-api-access-q7mzt")]]


def test_a_kubectl_dump_is_left_as_it_was() -> None:
    dumped = {"name": "kube-api-access-q7mzt", "projected": token_volume_source()}
    pod = docs_pod(serviceAccountName="default", volumes=[dumped])
    pod["spec"]["containers"][0]["volumeMounts"] = [token_mount("kube-api-access-q7mzt")]
    before = copy.deepcopy(pod)
    assert admit_pod(pod, None) == ""
    assert pod == before


def test_a_mirror_pod_is_left_alone() -> None:
    pod = docs_pod()
    pod["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    before = copy.deepcopy(pod)
    assert admit_pod(pod, None) == ""
    assert pod == before


def test_a_pod_without_containers_gets_only_its_account() -> None:
    pod = docs_pod()
    del pod["spec"]["containers"]
    assert admit_pod(pod, None) == ""
    assert pod["spec"] == {"serviceAccountName": "default"}


def test_the_deprecated_service_account_field_names_the_account() -> None:
    pod = docs_pod(serviceAccount="legacy")
    admit_pod(pod, None)
    assert pod["spec"]["serviceAccountName"] == "legacy"


# ------------------------------------------------------------ through planning


def serve_all(source: VolumeSource, volume_mode: str) -> str | None:
    return None


@pytest.fixture
def rec() -> Recorder:
    dsw = DesiredStateOfWorld(serve_all)
    dsw.admission = Admission(PEM, "--root-ca-file ca.pem")
    return Recorder(dsw)


def pod_volumes(rec: Recorder, uid: str) -> list[str]:
    added = rec.dsw.pods[uid]
    assert isinstance(added, PodAdded)
    return sorted(v.name for v in added.volumes)


def test_a_pod_applied_without_uid_twice_is_the_same_pod(rec: Recorder) -> None:
    pod = docs_pod()
    del pod["metadata"]["uid"]
    first = rec.apply(pod)
    (uid,) = first.pod_uids
    name = api_access_name(uid)
    assert pod_volumes(rec, uid) == [name]
    (line,) = [r for r in first.results if r.kind == "Pod"]
    assert name in line.note
    again = rec.apply(pod)
    assert again.changes == [] and again.pod_uids == {uid}


def test_the_namespace_gets_kube_root_ca_published_and_marked(rec: Recorder) -> None:
    plan = rec.apply(docs_pod())
    (published,) = [o for o in plan.objects if o.kind == "ConfigMap"]
    assert published.key == ("ConfigMap", "default", "kube-root-ca.crt")
    assert published.raw["data"] == {"ca.crt": PEM}
    assert published.raw["metadata"]["annotations"][PUBLISHED_BY] == "volfsm"
    (line,) = [r for r in plan.results if r.kind == "ConfigMap"]
    assert line.note == "published by volfsm from --root-ca-file ca.pem"


def test_an_applied_kube_root_ca_in_the_same_apply_wins(rec: Recorder) -> None:
    own = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kube-root-ca.crt"},
        "data": {"ca.crt": "the cluster's"},
    }
    plan = rec.apply(docs_pod(), own)
    (config_map,) = [o for o in plan.objects if o.kind == "ConfigMap"]
    assert config_map.raw["data"] == {"ca.crt": "the cluster's"}
    assert PUBLISHED_BY not in config_map.raw["metadata"].get("annotations", {})


def test_a_service_account_of_the_same_apply_says_whether_to_mount(rec: Recorder) -> None:
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "quiet"},
        "automountServiceAccountToken": False,
    }
    plan = rec.apply(docs_pod(serviceAccountName="quiet"), account)
    assert pod_volumes(rec, "uid-web") == []
    assert [o.kind for o in plan.objects] == ["Pod", "ServiceAccount"]  # nothing published


def test_an_unknown_account_is_accepted_and_mounted(rec: Recorder) -> None:
    rec.apply(docs_pod(serviceAccountName="build-robot"))
    assert pod_volumes(rec, "uid-web") == [api_access_name("uid-web")]


def test_without_admission_pods_are_applied_as_given() -> None:
    rec = Recorder(DesiredStateOfWorld(serve_all))
    plan = rec.apply(docs_pod())
    assert pod_volumes(rec, "uid-web") == []
    assert [o.kind for o in plan.objects] == ["Pod"]
    assert "serviceAccountName" not in plan.objects[0].raw["spec"]
