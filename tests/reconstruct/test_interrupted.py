"""Operations the process died in: exactly their entry becomes Uncertain, and the start is answered.

The first test kills a real engine process (fault point) while an emptyDir
tmpfs SetUp returns; the others write the log a crash would leave.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from events.log import EventLog
from events.streams import device_stream, podvol_stream
from events.types import (
    DesiredVolume,
    DeviceAttached,
    DeviceMounted,
    OperationFailed,
    OperationStarted,
    PodAdded,
    VolumeMounted,
    VolumeSource,
)
from tests.engine.helpers import eventually
from tests.engine.objects import empty_dir_volume, pod
from volfsm.cli import app
from volfsm.desired.resolve import csi_volume_id
from volfsm.engine.handler import CommandHandler
from volfsm.engine.reconstruct import INTERRUPTED
from volfsm.node import mounts
from volfsm.plugins.scripted import ScriptedPlugin, final, hang

from .conftest import GATED, NODE, Node

REPO = Path(__file__).resolve().parents[2]
EMPTY = "kubernetes.io~empty-dir"


def crash_engine(node: Node, objects: list[dict[str, object]], fault: str) -> str:
    """Run tests.reconstruct.crashing until the fault point kills it; its stderr."""
    spec = node.tmp_path / "objects.json"
    spec.write_text(json.dumps(objects))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOLFSM_")}
    env.update(VOLFSM_FAULT_POINT=fault, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.reconstruct.crashing",
            str(node.root),
            str(node.db),
            str(spec),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -9, f"not killed ({done.returncode}):\n{done.stderr[-3000:]}"
    return done.stderr


def mount_started(
    node: Node, scripted: ScriptedPlugin, *, staged: bool = False
) -> tuple[EventLog, CommandHandler, str, str]:
    """A log where pod u1's CSI volume "data" has a volume_mount started (no outcome).

    (log, its handler, volume id, pod-volume stream); the log is left open to add to.
    """
    vid = csi_volume_id(scripted.driver, "h1")
    log = EventLog(node.db, node=NODE)
    handler = CommandHandler(log)
    source = VolumeSource(plugin="kubernetes.io/csi", driver=scripted.driver, volume_handle="h1")
    volume = DesiredVolume(name="data", volume_id=vid, source=source, pv_name="pv1")
    added = PodAdded(pod_uid="u1", namespace="default", name="p", volumes=(volume,))
    handler.record("pod/u1", [added])
    if staged:
        plugin = f"kubernetes.io/csi:{scripted.driver}"
        handler.fire(device_stream(vid), "attach", DeviceAttached(volume_id=vid, plugin=plugin))
        handler.fire(device_stream(vid), "mount_device", DeviceMounted(volume_id=vid))
    stream = podvol_stream("u1", "data")
    started = OperationStarted(op_id="op-1", operation="volume_mount", volume_id=vid, pod_uid="u1")
    handler.record(stream, [started])
    return log, handler, vid, stream


def start_seq(log: EventLog, stream: str) -> tuple[int, str]:
    """(seq, op_id) of the last OperationStarted on a stream."""
    [env] = [e for e in log.read_stream(stream) if isinstance(e.body, OperationStarted)][-1:]
    assert isinstance(env.body, OperationStarted)
    return env.seq, env.body.op_id


async def test_a_mount_killed_mid_setup_is_uncertain_with_its_reason_then_mounted_again(
    node: Node,
) -> None:
    # Arrange: the process dies while the tmpfs SetUp returns (mounted, nothing recorded)
    objects = [pod("u1", empty_dir_volume("mem", medium="Memory"))]
    stderr = crash_engine(node, objects, "driver.during/SetUp/empty-dir")
    assert "fault point driver.during" in stderr
    volume_dir = node.layout.pod_volume_dir("u1", EMPTY, "mem")
    assert mounts.find_mount(volume_dir) is not None
    stream = podvol_stream("u1", "mem")

    # Act: start again
    engine = await node.start(GATED)

    # Assert: exactly that pod-volume is Uncertain, naming the operation and its seq
    assert node.log is not None
    seq, op_id = start_seq(node.log, stream)
    pv = engine.asw.podvols[("u1", "mem")]
    assert pv.state == "Uncertain" and pv.reconstructed  # a final error keeps it Uncertain
    assert pv.reason == f"interrupted: volume_mount started at seq {seq} has no outcome"
    after = [e.body for e in node.log.read_stream(stream) if e.seq > seq]
    assert [type(b).__name__ for b in after[:2]] == ["VolumeMountUncertain", "OperationFailed"]
    outcome = after[1]
    assert isinstance(outcome, OperationFailed)
    assert (outcome.op_id, outcome.code, outcome.final) == (op_id, INTERRUPTED, False)
    assert outcome.backoff_s == 0.0
    report = engine.reconstruction
    assert report is not None and report.interrupted == [
        f"{stream}: volume_mount started at seq {seq}"
    ]
    assert len(report.uncertain) == 1 and report.reconstructed == 0  # the log knew the entry

    # Assert: still desired, so it is mounted again, on the same tmpfs (not a second one)
    await engine.wait_pod("u1", "mounted", timeout=30)
    assert [m.fstype for m in mounts.mounts_under(volume_dir)] == ["tmpfs"]

    # Assert: the replay of the log tells the story
    result = CliRunner().invoke(app, ["replay", "--db", str(node.db)])
    assert result.exit_code == 0, result.output
    assert f"Unmounted -> Uncertain: interrupted: volume_mount started at seq {seq}" in (
        result.stdout
    )
    assert f"volume_mount failed after 0.000s (op {op_id}): {INTERRUPTED}" in result.stdout
    explained = CliRunner().invoke(app, ["explain", "pod", "default/pod-u1", "--db", str(node.db)])
    assert explained.exit_code == 0, explained.output
    assert f"volume_mount failed in 0.000s: {INTERRUPTED}: volfsm stopped while" in (
        explained.stdout
    )


async def test_an_interrupted_unstage_marks_the_device_and_an_interrupted_resize_nothing(
    node: Node, scripted: ScriptedPlugin
) -> None:
    # Arrange: a staged device with an unstage in flight; another with a resize in flight
    staged, grown = csi_volume_id(scripted.driver, "h1"), csi_volume_id(scripted.driver, "h2")
    log = EventLog(node.db, node=NODE)
    handler = CommandHandler(log)
    for vid in (staged, grown):
        plugin = f"kubernetes.io/csi:{scripted.driver}"
        handler.fire(device_stream(vid), "attach", DeviceAttached(volume_id=vid, plugin=plugin))
        handler.fire(device_stream(vid), "mount_device", DeviceMounted(volume_id=vid))
    for vid, operation in ((staged, "unmount_device"), (grown, "volume_fs_resize")):
        started = OperationStarted(op_id=f"op-{operation}", operation=operation, volume_id=vid)
        handler.record(device_stream(vid), [started])
    log.close()

    # Act
    engine = await node.start(GATED, scripted=scripted)

    # Assert: the unstage's device is Uncertain; the resize changed no mount state
    assert node.log is not None
    seq, _ = start_seq(node.log, device_stream(staged))
    dev = engine.asw.devices[staged]
    assert dev.state == "Uncertain"
    assert dev.reason == f"interrupted: unmount_device started at seq {seq} has no outcome"
    assert engine.asw.devices[grown].state == "DeviceGloballyMounted"
    for vid in (staged, grown):
        last = node.log.read_stream(device_stream(vid))[-1].body
        assert isinstance(last, OperationFailed) and last.code == INTERRUPTED
    last = node.log.read_stream(device_stream(grown))[-1].body
    assert isinstance(last, OperationFailed)
    assert "changes no mount state" in last.message
    assert engine.asw.devices[grown].last_operation is not None
    assert engine.asw.devices[grown].last_operation.status == "failed"


async def test_an_operation_whose_transition_was_recorded_keeps_its_state(
    node: Node, scripted: ScriptedPlugin
) -> None:
    # Arrange: the mount's VolumeMounted is in the log, its OperationSucceeded is not
    log, handler, vid, stream = mount_started(node, scripted)
    mounted = VolumeMounted(volume_id=vid, pod_uid="u1", volume_name="data")
    handler.fire(stream, "mount", mounted)
    log.close()

    # Act
    engine = await node.start(GATED, scripted=scripted)

    # Assert: still Mounted; the outcome says the transition stands
    assert engine.asw.podvols[("u1", "data")].state == "Mounted"
    assert node.log is not None
    last = node.log.read_stream(stream)[-1].body
    assert isinstance(last, OperationFailed) and last.code == INTERRUPTED
    assert "VolumeMounted" in last.message and "stands" in last.message
    assert engine.reconstruction is not None and engine.reconstruction.uncertain == []
    await eventually(lambda: engine.reconciler.passes > 3, "passes")


async def test_an_interrupted_publish_stays_uncertain_on_a_final_error_and_is_unpublished(
    node: Node, scripted: ScriptedPlugin
) -> None:
    # Arrange: a staged volume whose NodePublish was running when the process died (the
    # publish may have mounted); the retry after the restart fails with a final error,
    # the one after that waits on a gate
    log, _, vid, stream = mount_started(node, scripted, staged=True)
    log.close()
    gate = asyncio.Event()
    scripted.script("set_up", final("FailedPrecondition", "refused after the crash"), hang(gate))

    # Act: start; the retry fails for good, the next one is held
    engine = await node.start(GATED, scripted=scripted)
    await eventually(lambda: scripted.calls("set_up") == 2, "the second publish after the crash")

    # Assert: the final error left the entry Uncertain (the kubelet's rule for reconstructed
    # volumes), not Unmounted: an Unmounted entry would never be unpublished
    pv = engine.asw.podvols[("u1", "data")]
    assert (pv.state, pv.reconstructed) == ("Uncertain", True)
    assert node.log is not None
    types = [e.type for e in node.log.read_stream(stream)]
    assert "VolumeUnmounted" not in types
    failed = [e.body for e in node.log.read_stream(stream) if isinstance(e.body, OperationFailed)]
    assert [(f.code, f.final) for f in failed] == [
        (INTERRUPTED, False),
        ("FailedPrecondition", True),
    ]

    # Act: let the publish finish, then the pod goes
    gate.set()
    await engine.wait_pod("u1", "mounted", timeout=30)
    await engine.apply([], complete=True)
    await engine.wait_pod("u1", "unmounted", timeout=30)

    # Assert: it was unpublished
    assert scripted.calls("tear_down", volume_id=vid, pod_uid="u1") == 1


async def test_a_reconstruction_killed_halfway_finishes_on_the_next_start(node: Node) -> None:
    # Arrange: two tmpfs pods on the node, the log lost; a start dies after its first mark
    first = await node.start()
    await first.apply([pod(uid, empty_dir_volume("mem", medium="Memory")) for uid in "ab"])
    for uid in "ab":
        await first.wait_pod(uid, "mounted", timeout=30)
    await node.stop()
    node.lose_log()
    crash_engine(node, [], "reconstruct.mid")

    # Act
    engine = await node.start(GATED)

    # Assert: the rest is marked, nothing twice; both entries Uncertain, reconstructed
    assert engine.reconstruction is not None and len(engine.reconstruction.uncertain) == 1
    assert node.log is not None
    for uid in "ab":
        pv = engine.asw.podvols[(uid, "mem")]
        assert (pv.state, pv.reconstructed) == ("Uncertain", True)
        types = [e.type for e in node.log.read_stream(podvol_stream(uid, "mem"))]
        assert types == ["VolumeMountUncertain"]

    # Assert: and it converges like any reconstruction
    await engine.apply([pod("a", empty_dir_volume("mem", medium="Memory"))], complete=True)
    await engine.wait_pod("a", "mounted", timeout=30)
    await engine.wait_pod("b", "unmounted", timeout=30)
    assert mounts.find_mount(node.layout.pod_volume_dir("b", EMPTY, "mem")) is None
