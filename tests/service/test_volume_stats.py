"""The kubelet's volume metrics and health, end to end: a real `volfsm serve`, volfsm's CSI
driver, a PVC-backed pod, `/metrics` read with prometheus_client's parser.

One service and one driver for the whole module; the tests run in order
(mount, health, unmount) as the steps of one story.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from events.types import VolumeConditionChanged, VolumeUsageChanged
from tests.helpers.csidriver import MIB, DriverProcess, cleanup_under, create_volume
from tests.helpers.prometheus import families, sample, samples, series
from tests.service.helpers import EXAMPLES, ServeProcess, cli, unmount_under, until

CLAIM = {"namespace": "default", "persistentvolumeclaim": "demo-claim"}
PERIOD = "300ms"
STATS = ("capacity_bytes", "available_bytes", "used_bytes", "inodes", "inodes_free", "inodes_used")


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, DriverProcess]]:
    """A driver holding demo-vol-1 and a service measuring every 300 ms; the pod applied."""
    tmp = tmp_path_factory.mktemp("volstats")
    drv = DriverProcess(tmp / "driver", node_id="n1")
    drv.workdir.mkdir()
    svc = ServeProcess(
        tmp / "svc",
        args=["--csi", f"csi.volfsm.dev={drv.endpoint}", "--volume-stats-agg-period", PERIOD],
    )
    svc.workdir.mkdir()
    try:
        drv.start()
        create_volume(drv.clients(), "demo-vol-1", 64 * MIB)
        svc.start()
        assert cli(svc, "apply", "-f", str(EXAMPLES / "csi"))[0] == 0
        code, _, err = cli(svc, "wait", "pod", "default/web", "--for", "mounted", "--timeout", "60")
        assert code == 0, err
        yield svc, drv
    finally:
        svc.kill()
        unmount_under(tmp)
        drv.close()
        cleanup_under(tmp)


def metrics(svc: ServeProcess) -> str:
    status, text = svc.http_get("/metrics")
    assert status == 200
    return text


def volume(svc: ServeProcess) -> dict[str, Any]:
    code, out, err = cli(svc, "get", "pods", "-o", "json")
    assert code == 0, err
    [pod] = json.loads(out)["items"]
    [vol] = pod["volumes"]
    return dict(vol)


def stats_of(text: str) -> dict[str, float]:
    found = samples(text)
    key = frozenset(CLAIM.items())
    return {
        name: found[(f"kubelet_volume_stats_{name}", key)]
        for name in STATS
        if (f"kubelet_volume_stats_{name}", key) in found
    }


def observations(svc: ServeProcess) -> list[Any]:
    with svc.open_log() as log:
        return [
            env.body
            for env in log.read_after(0)
            if isinstance(env.body, VolumeConditionChanged | VolumeUsageChanged)
        ]


def test_the_six_stats_match_statvfs_of_the_mount(
    story: tuple[ServeProcess, DriverProcess],
) -> None:
    svc, _ = story
    mount = volume(svc)["mount_path"]
    assert os.path.ismount(mount)
    found = until("the six kubelet_volume_stats_* series", lambda: stats_of(metrics(svc)))
    assert set(found) == set(STATS)
    st = os.statvfs(mount)
    block = st.f_frsize
    assert found["capacity_bytes"] == st.f_blocks * block
    assert abs(found["available_bytes"] - st.f_bavail * block) <= block
    assert abs(found["used_bytes"] - (st.f_blocks - st.f_bfree) * block) <= block
    assert found["inodes"] == st.f_files
    assert abs(found["inodes_free"] - st.f_ffree) <= 1
    assert abs(found["inodes_used"] - (st.f_files - st.f_ffree)) <= 1
    assert sample(metrics(svc), "kubelet_volume_stats_health_status_abnormal", **CLAIM) == 0
    vol = volume(svc)
    assert vol["claim"] == "demo-claim" and vol["capacity_bytes"] == found["capacity_bytes"]
    assert "abnormal" not in vol
    code, out, _ = cli(svc, "get", "pods")
    assert code == 0 and "USED" in out and "MiB" in out
    usage = [b for b in observations(svc) if isinstance(b, VolumeUsageChanged)]
    assert len(usage) == 1  # recorded once after the mount, not every period
    assert (usage[0].claim, usage[0].source) == ("demo-claim", "csi")


def test_an_abnormal_condition_shows_in_metrics_get_and_the_log_once(
    story: tuple[ServeProcess, DriverProcess],
) -> None:
    svc, drv = story
    message = "injected: the disk is on fire"
    drv.set_faults([{"rpc": "NodeGetVolumeStats", "action": "abnormal", "message": message}])
    until(
        "health_status_abnormal 1",
        lambda: sample(metrics(svc), "kubelet_volume_stats_health_status_abnormal", **CLAIM) == 1,
    )
    vol = volume(svc)
    assert vol["abnormal"] is True and vol["condition"] == message
    code, out, _ = cli(svc, "get", "pods")
    assert code == 0 and f"data is abnormal: {message}" in out
    time.sleep(1.0)  # a few more periods: still one event
    changes = [b for b in observations(svc) if isinstance(b, VolumeConditionChanged)]
    assert [(c.abnormal, c.message) for c in changes] == [(True, message)]
    assert (changes[0].namespace, changes[0].claim) == ("default", "demo-claim")

    drv.clear_faults()
    until(
        "health_status_abnormal 0",
        lambda: sample(metrics(svc), "kubelet_volume_stats_health_status_abnormal", **CLAIM) == 0,
    )
    changes = [b for b in observations(svc) if isinstance(b, VolumeConditionChanged)]
    assert [(c.abnormal, c.message) for c in changes] == [(True, message), (False, "")]
    code, out, _ = cli(svc, "history", "--pod", "default/web", "--type", "VolumeConditionChanged")
    assert code == 0 and out.count("VolumeConditionChanged") == 2
    code, out, _ = cli(svc, "validate")
    assert code == 0, out


_CLAIM_LABELS = ("namespace", "persistentvolumeclaim")
_CSI_LABELS = ("driver_name", "grpc_status_code", "method_name", "migrated")
KUBELET_SERIES = {
    *((f"kubelet_volume_stats_{name}", _CLAIM_LABELS) for name in STATS),
    ("kubelet_volume_stats_health_status_abnormal", _CLAIM_LABELS),
    ("kubelet_volume_metric_collection_duration_seconds_count", ("metric_source",)),
    ("csi_operations_seconds_count", _CSI_LABELS),
    ("csi_operations_seconds_bucket", tuple(sorted((*_CSI_LABELS, "le")))),
    ("volume_operation_total_seconds_count", ("operation_name", "plugin_name")),
    ("storage_operation_duration_seconds_count",
     ("migrated", "operation_name", "status", "volume_plugin")),
    ("volume_manager_total_volumes", ("plugin_name", "state")),
    ("reconstruct_volume_operations_total", ()),
    ("reconstruct_volume_operations_errors_total", ()),
    ("force_cleaned_failed_volume_operations_total", ()),
    ("force_cleaned_failed_volume_operation_errors_total", ()),
}  # fmt: skip


def test_every_kubelet_metric_after_a_mount_and_unmount(
    story: tuple[ServeProcess, DriverProcess],
) -> None:
    svc, _ = story
    mounted = metrics(svc)
    assert series(mounted) >= KUBELET_SERIES
    assert families(mounted)["volfsm_transitions"] == "counter"  # the volfsm_* ones stay
    assert (
        sample(
            mounted, "csi_operations_seconds_count", driver_name="csi.volfsm.dev",
            method_name="/csi.v1.Node/NodePublishVolume", grpc_status_code="OK", migrated="false",
        )
        == 1
    )  # fmt: skip

    assert cli(svc, "delete", "pod", "default/web")[0] == 0
    code, _, err = cli(svc, "wait", "pod", "default/web", "--for", "unmounted", "--timeout", "60")
    assert code == 0, err
    after = metrics(svc)
    stats = {s for s in series(after) if s[0].startswith("kubelet_volume_stats_")}
    assert stats == set()  # kubelet too drops the series of a volume no longer mounted
    gone = {s for s in KUBELET_SERIES if s[0].startswith("kubelet_volume_stats_")}
    gone.add(("volume_manager_total_volumes", ("plugin_name", "state")))  # nothing mounted
    assert KUBELET_SERIES - series(after) == gone
    for name in ("kubelet_volume_stats_used_bytes", "csi_operations_seconds"):
        assert name in families(after)
    unpublish = {
        "driver_name": "csi.volfsm.dev",
        "method_name": "/csi.v1.Node/NodeUnpublishVolume",
        "grpc_status_code": "OK",
        "migrated": "false",
    }
    assert sample(after, "csi_operations_seconds_count", **unpublish) == 1
    e2e = {"plugin_name": "kubernetes.io/csi:csi.volfsm.dev", "operation_name": "volume_unmount"}
    assert sample(after, "volume_operation_total_seconds_count", **e2e) == 1
    assert sample(after, "reconstruct_volume_operations_total") == 0


LIMITED = {"namespace": "default", "pod": "limited", "volume": "scratch"}
EXCEEDED = 'Usage of EmptyDir volume "scratch" exceeds the limit "1Mi".'


def limited_volume(svc: ServeProcess) -> dict[str, Any]:
    code, out, err = cli(svc, "get", "pods", "-o", "json")
    assert code == 0, err
    [pod] = [p for p in json.loads(out)["items"] if p["name"] == "limited"]
    [vol] = pod["volumes"]
    return dict(vol)


def exceeded(svc: ServeProcess) -> float | None:
    """volfsm_emptydir_size_limit_exceeded of the limited pod's volume (None: no series)."""
    key = ("volfsm_emptydir_size_limit_exceeded", frozenset(LIMITED.items()))
    return samples(metrics(svc)).get(key)


def limit_changes(svc: ServeProcess) -> list[tuple[bool, str]]:
    return [
        (b.abnormal, b.message)
        for b in observations(svc)
        if isinstance(b, VolumeConditionChanged) and b.volume_name == "scratch"
    ]


def test_an_emptydir_over_its_size_limit_is_reported_and_clears(
    story: tuple[ServeProcess, DriverProcess], tmp_path: Any
) -> None:
    svc, _ = story
    manifest = tmp_path / "limited.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {namespace: default, name: limited}\n"
        "spec:\n  volumes:\n  - name: scratch\n    emptyDir: {sizeLimit: 1Mi}\n"
    )
    assert cli(svc, "apply", "-f", str(manifest))[0] == 0
    code, _, err = cli(svc, "wait", "pod", "default/limited", "--for", "mounted", "--timeout", "60")
    assert code == 0, err
    until(
        "the limit gauge reads 0",
        lambda: exceeded(svc) == 0,
    )
    assert sample(metrics(svc), "volfsm_emptydir_size_limit_bytes", **LIMITED) == MIB
    assert limit_changes(svc) == []  # under the limit from the start: nothing recorded

    data = os.path.join(limited_volume(svc)["mount_path"], "blob")
    with open(data, "wb") as out:  # through the pod's path, as a container would write
        out.write(b"\xa5" * (2 * MIB))
        out.flush()
        os.fsync(out.fileno())
    until(
        "the limit gauge reads 1",
        lambda: exceeded(svc) == 1,
    )
    assert sample(metrics(svc), "volfsm_emptydir_used_bytes", **LIMITED) >= 2 * MIB
    vol = limited_volume(svc)
    assert vol["abnormal"] is True and vol["condition"] == EXCEEDED
    code, out, _ = cli(svc, "get", "pods")
    assert code == 0 and f"scratch is abnormal: {EXCEEDED}" in out
    assert limit_changes(svc) == [(True, EXCEEDED)]
    assert os.path.getsize(data) == 2 * MIB  # reported, never deleted

    os.unlink(data)
    until(
        "the limit gauge reads 0 again",
        lambda: exceeded(svc) == 0,
    )
    assert limit_changes(svc) == [(True, EXCEEDED), (False, "")]
    assert "abnormal" not in limited_volume(svc)
    code, out, _ = cli(svc, "validate")
    assert code == 0, out

    assert cli(svc, "delete", "pod", "default/limited")[0] == 0
    code, _, err = cli(
        svc, "wait", "pod", "default/limited", "--for", "unmounted", "--timeout", "60"
    )
    assert code == 0, err
    until(
        "the emptyDir series gone",
        lambda: not [s for s in series(metrics(svc)) if s[0].startswith("volfsm_emptydir_")],
    )
