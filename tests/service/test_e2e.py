"""End to end: `volfsm serve` + the CLI + a real nats-server + volfsm's CSI driver.

Apply the examples (an emptyDir pod, and a PV/PVC/Pod of csi.volfsm.dev),
wait until mounted, check the mounts, delete, wait until unmounted; the
JetStream stream then holds exactly the local log, in order.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from typer.testing import CliRunner

from projections.validate import validate
from tests.helpers.csidriver import MIB, DriverProcess, create_volume, mounts_at
from tests.service.conftest import MakeServe
from tests.service.helpers import EXAMPLES, expected_stream, read_stream
from volfsm.bus import NatsServer
from volfsm.cli import app
from volfsm.desired.resolve import csi_volume_id
from volfsm.node import mounts
from volfsm.node.layout import RootLayout

SCRATCH_UID = "6f1c2a4e-0000-4000-8000-00000000e001"
WEB_UID = "6f1c2a4e-0000-4000-8000-00000000c51a"


def cli(runner: CliRunner, *args: str) -> str:
    """Run the CLI; assert exit 0; its stdout."""
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, f"{args}: exit {result.exit_code}\n{result.output}"
    return result.stdout


def test_apply_mount_delete_unmount_and_stream_equals_log(
    runner: CliRunner,
    nats_server: NatsServer,
    csi_driver: DriverProcess,
    make_serve: MakeServe,
) -> None:
    # Arrange: a volume in the driver, the service with the driver registered
    create_volume(csi_driver.clients(), "demo-vol-1", 64 * MIB)
    svc = make_serve(
        nats_url=nats_server.url, args=["--csi", f"csi.volfsm.dev={csi_driver.endpoint}"]
    ).start()
    where = ["--data-dir", str(svc.data_dir)]

    # Act: apply both examples, wait until mounted
    out = cli(runner, "apply", "-f", str(EXAMPLES), "-f", str(EXAMPLES / "csi"), *where)
    assert "pod/default/scratch created" in out
    assert "persistentvolume/demo-pv created" in out
    assert "pod/default/web created" in out
    for pod in ("default/scratch", "default/web"):
        assert f"pod/{pod} mounted" in cli(
            runner, "wait", "pod", pod, "--for", "mounted", "--timeout", "60", *where
        )

    # Assert: the mounts are real
    layout = RootLayout(svc.root_dir)
    # kubelet names a PV-backed publish dir after the PV, not the pod's volume name
    web_mount = layout.pod_volume_dir(WEB_UID, "kubernetes.io~csi", "demo-pv") / "mount"
    assert [m.fstype for m in mounts_at(web_mount)] == ["ext4"]
    tmp_dir = layout.pod_volume_dir(SCRATCH_UID, "kubernetes.io~empty-dir", "tmp")
    assert [m.fstype for m in mounts_at(tmp_dir)] == ["tmpfs"]
    pods = json.loads(cli(runner, "get", "pods", "-o", "json", *where))
    assert pods["ok"] is True and pods["node"] == "n1"
    assert sorted((p["name"], p["phase"]) for p in pods["items"]) == [
        ("scratch", "Mounted"),
        ("web", "Mounted"),
    ]
    [web] = [p for p in pods["items"] if p["name"] == "web"]
    assert web["volumes"][0]["mount_path"] == str(web_mount)
    volumes = json.loads(cli(runner, "get", "volumes", "-o", "json", *where))
    by_id = {v["volume_id"]: v for v in volumes["items"]}
    csi_vol = by_id[csi_volume_id("csi.volfsm.dev", "demo-vol-1")]
    assert csi_vol["state"] == "DeviceGloballyMounted"
    table = cli(runner, "get", "pods", *where)
    assert "default/web" in table and "volume_mount succeeded" in table

    # Act: delete both, wait until unmounted
    for pod in ("default/scratch", "default/web"):
        assert f"pod/{pod} deleted" in cli(runner, "delete", "pod", pod, *where)
    for pod in ("default/scratch", "default/web"):
        assert f"pod/{pod} unmounted" in cli(
            runner, "wait", "pod", pod, "--for", "unmounted", "--timeout", "60", *where
        )

    # Assert: the pods' mounts are gone at once; the staging mount once the device is unstaged
    assert not mounts_at(web_mount) and not mounts_at(tmp_dir)
    deadline = time.monotonic() + 60
    while any(
        v["state"] != "Detached"
        for v in json.loads(cli(runner, "get", "volumes", "-o", "json", *where))["items"]
    ):
        assert time.monotonic() < deadline, "volumes not torn down"
        time.sleep(0.05)
    assert mounts.mounts_under(svc.root_dir) == []

    # Assert: clean exit, the stream holds exactly the log
    assert svc.stop() == 0
    log = svc.open_log()
    try:
        report = validate(log.read_after(0))
        assert report.ok, str(report.violation)
        want = expected_stream(log)
        types = [json.loads(e.data)["type"] for e in want]
    finally:
        log.close()
    assert {"PodAdded", "DeviceMounted", "VolumeMounted", "VolumeUnmounted", "PodRemoved"} <= set(
        types
    )
    assert read_stream(nats_server.url) == want

    # The service logged one flat JSON object per line, events with stream, seq, operation
    lines = svc.log_lines()
    assert len(lines) == len(svc.stderr_text().splitlines())
    assert all({"time", "level", "message", "node"} <= set(line) for line in lines)
    mounted = [line for line in lines if line.get("operation") == "volume_mount"]
    assert mounted and all(isinstance(line["seq"], int) for line in mounted)
    assert any(line["stream"] == f"podvol/{WEB_UID}/data" for line in mounted)


def test_embedded_nats_serves_commands_and_events_and_stops_with_the_service(
    runner: CliRunner, make_serve: MakeServe
) -> None:
    # Arrange: no --nats: the service starts its own JetStream server
    svc = make_serve().start()
    url = svc.url
    assert url.startswith("nats://127.0.0.1:")
    assert (svc.data_dir / "nats").is_dir()
    where = ["--data-dir", str(svc.data_dir)]

    # Act
    cli(runner, "apply", "-f", str(EXAMPLES / "emptydir-pod.yaml"), *where)
    cli(runner, "wait", "pod", "scratch", "--for", "mounted", "--timeout", "60", *where)
    cli(runner, "delete", "pod", "--uid", SCRATCH_UID, *where)
    cli(runner, "wait", "pod", "scratch", "--for", "unmounted", "--timeout", "60", *where)
    reply = json.loads(cli(runner, "get", "pods", "-o", "json", *where))
    assert reply["publish_lag"] is not None
    log = svc.open_log()
    try:
        last = log.last_seq()
    finally:
        log.close()
    in_stream = read_stream(url)

    # Assert: events flowed; after the stop the server and nats.url are gone
    assert len(in_stream) >= last - reply["publish_lag"]
    assert svc.stop() == 0
    assert not (svc.data_dir / "nats.url").exists()
    host, port = url.removeprefix("nats://").split(":")
    with socket.socket() as sock:
        assert sock.connect_ex((host, int(port))) != 0


def test_cli_says_clearly_when_no_service_is_there(runner: CliRunner, tmp_path: Path) -> None:
    # No nats.url in the data dir
    result = runner.invoke(app, ["get", "pods", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "no NATS URL" in result.stderr and "nats.url" in result.stderr

    # A URL where nothing listens
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = runner.invoke(app, ["get", "pods", "--nats", f"nats://127.0.0.1:{port}"])
    assert result.exit_code == 1
    assert "cannot reach NATS" in result.stderr


def test_cli_says_clearly_when_nats_runs_but_the_node_does_not(
    runner: CliRunner, nats_server: NatsServer
) -> None:
    result = runner.invoke(app, ["get", "pods", "--nats", nats_server.url, "--node", "nobody-here"])
    assert result.exit_code == 1
    assert "no volfsm service for node 'nobody-here'" in result.stderr
