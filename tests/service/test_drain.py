"""SIGTERM drain of a `volfsm serve` process.

An operation in flight when SIGTERM arrives either finishes within the
grace period (recorded as succeeded) or is cancelled and recorded as such;
either way the relay flushes, the log is closed cleanly and the exit code
is 0.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from events.log import EventLog
from events.types import OperationFailed, OperationSucceeded
from projections.validate import validate
from tests.helpers.csidriver import MIB, DriverProcess, create_volume
from tests.service.conftest import MakeServe
from tests.service.helpers import (
    EXAMPLES,
    NODE,
    ServeProcess,
    SyncNats,
    expected_stream,
    read_stream,
)
from volfsm.bus import NatsServer
from volfsm.desired.loader import load_objects


def start_mount_and_wait_until_running(svc: ServeProcess) -> None:
    """Apply the CSI example pod and return once its volume_mount is running."""
    nc = SyncNats(svc.url)
    try:
        body = json.dumps({"objects": load_objects(EXAMPLES / "csi")}).encode()
        assert json.loads(nc.request(f"volfsm.{NODE}.cmd.apply", body))["ok"] is True
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            reply = json.loads(nc.request(f"volfsm.{NODE}.cmd.get", b'{"what": "pods"}'))
            vols = [v for p in reply["items"] for v in p["volumes"]]
            ops = [v.get("last_operation") or {} for v in vols]
            if any(o.get("operation") == "volume_mount" and o["status"] == "running" for o in ops):
                return
            time.sleep(0.02)
        raise AssertionError(f"volume_mount never ran: {reply}")
    finally:
        nc.close()


def outcomes(log: EventLog, operation: str) -> list[OperationSucceeded | OperationFailed]:
    """How each `operation` ended, in log order."""
    return [
        env.body
        for env in log.read_after(0)
        if isinstance(env.body, OperationSucceeded | OperationFailed)
        and env.body.operation == operation
    ]


def assert_closed_cleanly(svc: ServeProcess, url: str) -> None:
    """The log validates, is unlocked, the relay flushed it all and the stream holds it."""
    path = svc.data_dir / "volfsm.db"
    writer = EventLog(path, node=NODE)  # raises LogLockedError if the service still held it
    writer.close()
    log = EventLog(path, readonly=True)
    try:
        report = validate(log.read_after(0))
        assert report.ok, str(report.violation)
        assert log.get_cursor("relay:VOLFSM") == log.last_seq()
        want = expected_stream(log)
    finally:
        log.close()
    assert read_stream(url) == want
    messages = [line.get("message", "") for line in svc.log_lines()]
    assert "SIGTERM: draining" in messages
    assert any(m.startswith("event log closed at seq") for m in messages)
    assert messages[-1] == "volfsm serve stopped"


def _driver_with_volume(drv: DriverProcess) -> None:
    create_volume(drv.clients(), "demo-vol-1", 64 * MIB)


def test_sigterm_lets_a_running_operation_finish_then_exits_0(
    nats_server: NatsServer, csi_driver: DriverProcess, make_serve: MakeServe
) -> None:
    # Arrange: NodePublishVolume takes 1.5 s
    _driver_with_volume(csi_driver)
    csi_driver.set_faults(
        [{"rpc": "NodePublishVolume", "action": "delay", "seconds": 1.5, "times": 1}]
    )
    svc = make_serve(
        nats_url=nats_server.url,
        args=["--csi", f"csi.volfsm.dev={csi_driver.endpoint}", "--drain-grace", "30"],
    ).start()
    start_mount_and_wait_until_running(svc)

    # Act
    code = svc.stop(signal.SIGTERM)

    # Assert
    assert code == 0, svc.stderr_tail()
    log = svc.open_log()
    try:
        ends = outcomes(log, "volume_mount")
        types = [env.type for env in log.read_after(0)]
    finally:
        log.close()
    assert [type(b).__name__ for b in ends] == ["OperationSucceeded"]
    assert "VolumeMounted" in types
    assert_closed_cleanly(svc, nats_server.url)


def test_sigterm_cancels_what_outlasts_the_grace_and_records_it(
    tmp_path: Path, nats_server: NatsServer, csi_driver: DriverProcess, make_serve: MakeServe
) -> None:
    # Arrange: NodePublishVolume hangs
    _driver_with_volume(csi_driver)
    csi_driver.set_faults([{"rpc": "NodePublishVolume", "action": "hang", "seconds": 60}])
    svc = make_serve(
        nats_url=nats_server.url,
        args=["--csi", f"csi.volfsm.dev={csi_driver.endpoint}", "--drain-grace", "0.5"],
    ).start()
    start_mount_and_wait_until_running(svc)

    # Act
    code = svc.stop(signal.SIGINT)

    # Assert: the mount is recorded as cancelled (not final), and the rest is clean
    assert code == 0, svc.stderr_tail()
    log = svc.open_log()
    try:
        ends = outcomes(log, "volume_mount")
    finally:
        log.close()
    assert len(ends) == 1 and isinstance(ends[0], OperationFailed)
    assert ends[0].code == "Canceled" and ends[0].final is False
    csi_driver.clear_faults()
    messages = [line.get("message", "") for line in svc.log_lines()]
    assert "SIGINT: draining" in messages
    assert messages[-1] == "volfsm serve stopped"


def processes_using(path: Path) -> list[int]:
    """Pids of processes whose command line mentions `path` (scoped to this test's dirs)."""
    needle = str(path).encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            pids.append(int(proc.name))
    return pids


def test_ctrl_c_to_the_whole_process_group_drains_into_the_embedded_stream(
    csi_driver: DriverProcess, make_serve: MakeServe
) -> None:
    # Arrange: serve with its embedded nats-server, started as a shell job (its own
    # process group); NodePublishVolume takes 1.5 s, so the mount's outcome is
    # recorded after Ctrl-C and must still reach the stream.
    _driver_with_volume(csi_driver)
    csi_driver.set_faults(
        [{"rpc": "NodePublishVolume", "action": "delay", "seconds": 1.5, "times": 1}]
    )
    svc = make_serve(
        own_group=True,
        args=["--csi", f"csi.volfsm.dev={csi_driver.endpoint}", "--drain-grace", "30"],
    ).start()
    assert svc.proc is not None
    store = svc.data_dir / "nats"
    [embedded] = processes_using(store)
    assert os.getpgid(embedded) != os.getpgid(svc.proc.pid)
    start_mount_and_wait_until_running(svc)

    # Act: what Ctrl-C in a terminal does: SIGINT to every process of the group
    os.killpg(svc.proc.pid, signal.SIGINT)
    code = svc.proc.wait(60)

    # Assert: drained, the embedded server stopped with it, every event in its stream
    assert code == 0, svc.stderr_tail()
    assert processes_using(store) == []
    log = svc.open_log()
    try:
        types = [env.type for env in log.read_after(0)]
        assert log.get_cursor("relay:VOLFSM") == log.last_seq()
        want = expected_stream(log)
    finally:
        log.close()
    assert "VolumeMounted" in types  # recorded after Ctrl-C, by the finishing mount
    messages = [line.get("message", "") for line in svc.log_lines()]
    assert "SIGINT: draining" in messages
    assert not any("not yet in the stream" in m for m in messages), svc.stderr_tail()
    assert messages[-1] == "volfsm serve stopped"
    with NatsServer(store) as again:  # the embedded server's store, read back
        assert read_stream(again.url) == want


def test_the_embedded_server_in_its_own_session_still_dies_with_a_killed_service(
    make_serve: MakeServe,
) -> None:
    svc = make_serve(own_group=True).start()
    assert svc.proc is not None
    store = svc.data_dir / "nats"
    [embedded] = processes_using(store)
    assert os.getsid(embedded) == embedded  # a session of its own

    svc.kill()  # SIGKILL: no drain, no stop() of the server

    deadline = time.monotonic() + 30
    while processes_using(store):
        assert time.monotonic() < deadline, "the embedded nats-server outlived its service"
        time.sleep(0.05)
