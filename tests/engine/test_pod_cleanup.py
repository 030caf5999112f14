"""A deleted pod, once its volumes are unmounted and its dir removed, is forgotten: PodCleanedUp.

The ASW of a long-running node must hold what is on the node, not every pod
it ever ran: the reconciler records `PodCleanedUp` after it removed the pod
dir, and every fold (live, at start, offline) drops the pod's Unmounted
entries and the index its spec.
"""

from __future__ import annotations

import os
from pathlib import Path

from events.log import EventLog
from events.streams import pod_stream
from events.types import PodCleanedUp
from projections.asw import fold
from volfsm.cli import app
from volfsm.desired.resolve import inline_csi_volume_id
from volfsm.node.layout import RootLayout
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.emptydir import EmptyDirPlugin
from volfsm.plugins.scripted import ScriptedPlugin, final

from .conftest import EngineFactory
from .helpers import eventually
from .objects import (
    DRIVER,
    claim_volume,
    empty_dir_volume,
    inline_csi_volume,
    pod,
    pv_set,
    volume_id_of,
)

V1 = volume_id_of("v1")


def cleaned_up(log: EventLog, uid: str) -> list[PodCleanedUp]:
    return [e.body for e in log.read_stream(pod_stream(uid)) if isinstance(e.body, PodCleanedUp)]


async def test_a_deleted_pod_is_forgotten_once_its_dir_is_gone_and_stays_forgotten(
    make_engine: EngineFactory, plugin: ScriptedPlugin, event_log: EventLog, root: Path
) -> None:
    # Arrange: two pods mounted (one with two volumes)
    engine = await make_engine(plugin)
    await engine.apply(
        [*pv_set("v1"), *pv_set("v2"), pod("u1", claim_volume("data", "v1"),
         inline_csi_volume("scratch")), pod("u2", claim_volume("cache", "v2"))]
    )  # fmt: skip
    await engine.wait_pod("u1", "mounted", timeout=5)
    await engine.wait_pod("u2", "mounted", timeout=5)

    # Act: u1 goes
    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=5)
    await eventually(lambda: bool(cleaned_up(event_log, "u1")), "PodCleanedUp of u1")

    # Assert: recorded with its entries; the live state forgot them, u2 is untouched
    [body] = cleaned_up(event_log, "u1")
    assert body.volume_names == ("data", "scratch")
    assert not (root / "pods/u1").exists()
    assert [key for key in engine.asw.podvols if key[0] == "u1"] == []
    assert "u1" not in engine.index.removed_pods
    assert [p.uid for p in engine.pods()] == ["u2"]
    assert engine.asw.podvols[("u2", "cache")].state == "Mounted"
    # the fold of the log agrees (the fixture also checks the whole ASW at the end)
    assert [key for key in fold(event_log.read_after(0)).podvols if key[0] == "u1"] == []
    # the PV's device version is kept for a later attach; the pod's own volume's is not
    scratch = inline_csi_volume_id(DRIVER, "u1", "scratch")
    await eventually(lambda: V1 not in engine.asw.devices, "v1 detached")
    await eventually(lambda: scratch not in engine.asw.devices, "scratch detached")
    assert V1 in engine.index.detached_versions
    assert scratch not in engine.index.detached_versions

    # Act: restart on the same log
    await engine.stop(grace_s=1.0)
    again = await make_engine(plugin)

    # Assert: nothing of u1 is rebuilt, nothing queued for it, u2 still Mounted
    assert [key for key in again.asw.podvols if key[0] == "u1"] == []
    assert "u1" not in again.index.removed_pods
    assert [p.uid for p in again.pods()] == ["u2"]
    assert again.asw.podvols[("u2", "cache")].state == "Mounted"
    await again.settle()
    assert len(cleaned_up(event_log, "u1")) == 1

    # Act / Assert: the same pod applied again mounts again from scratch
    await again.apply([pod("u1", inline_csi_volume("scratch"))])
    await again.wait_pod("u1", "mounted", timeout=5)


async def test_a_pod_whose_dir_cannot_be_removed_is_not_forgotten(
    make_engine: EngineFactory, plugin: ScriptedPlugin, event_log: EventLog, root: Path
) -> None:
    # Arrange: a pod mounted, then a file nobody knows in its dir
    engine = await make_engine(plugin)
    await engine.apply([pod("u1", inline_csi_volume("scratch"))])
    await engine.wait_pod("u1", "mounted", timeout=5)
    stray = root / "pods/u1/volumes/kubernetes.io~foo/bar/stray.bin"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"x")

    # Act
    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=5)
    await eventually(lambda: "u1" in engine.reconciler.pod_dir_failures, "the dir failure")

    # Assert: no PodCleanedUp; the log still says the pod needs cleaning up
    assert cleaned_up(event_log, "u1") == []
    stray.unlink()
    stray.parent.rmdir()
    stray.parent.parent.rmdir()


async def test_files_volfsm_did_not_create_keep_a_deleted_pods_dir(
    make_engine: EngineFactory, event_log: EventLog, root: Path
) -> None:
    # Arrange: a pod with emptyDirs volfsm created (data in them), and beside them files
    # someone else wrote into the pod dir
    catalog = PluginCatalog()
    catalog.register(EmptyDirPlugin(RootLayout(root)))
    engine = await make_engine(catalog=catalog)
    volumes = (empty_dir_volume("disk"), empty_dir_volume("mem", medium="Memory"))
    await engine.apply([pod("u1", *volumes)])
    await engine.wait_pod("u1", "mounted", timeout=10)
    pod_dir = root / "pods/u1"
    (pod_dir / "volumes/kubernetes.io~empty-dir/disk/data").write_bytes(b"emptyDir data")
    hosts, log_file = pod_dir / "etc-hosts", pod_dir / "containers/c1/0.log"
    log_file.parent.mkdir(parents=True)
    hosts.write_bytes(b"127.0.0.1 localhost\n")
    log_file.write_bytes(b"\x00container log\n")

    # Act
    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=10)
    await eventually(lambda: "u1" in engine.reconciler.pod_dir_failures, "the pod dir stays")

    # Assert: the volumes (volfsm's) are gone with their data; the two files are not
    assert hosts.read_bytes() == b"127.0.0.1 localhost\n"
    assert log_file.read_bytes() == b"\x00container log\n"
    assert sorted(os.listdir(pod_dir)) == ["containers", "etc-hosts"]
    assert os.listdir(pod_dir / "containers") == ["c1"]
    assert engine.reconciler.pod_dir_failures["u1"] == (
        f"kept: {hosts}: a file volfsm did not create;"
        f" kept: {log_file}: a file volfsm did not create"
    )
    assert cleaned_up(event_log, "u1") == []


async def test_the_story_says_what_was_forgotten(
    make_engine: EngineFactory, plugin: ScriptedPlugin, event_log: EventLog
) -> None:
    from typer.testing import CliRunner

    engine = await make_engine(plugin)
    plugin.script("set_up", final("NotFound", "no such volume"))
    await engine.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await eventually(lambda: plugin.calls("set_up") >= 1, "the failed publish")
    await engine.delete_pod(uid="u1")
    await eventually(lambda: bool(cleaned_up(event_log, "u1")), "PodCleanedUp of u1")

    result = CliRunner().invoke(app, ["replay", "--db", str(event_log.path)])

    assert result.exit_code == 0, result.output
    assert (
        "pod default/pod-u1: pod cleaned up: volumes unmounted, pod dir removed; forgets data"
        in result.stdout
    )
