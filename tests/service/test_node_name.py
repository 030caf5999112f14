"""`volfsm apply` of a pod bound to another node: refused by the running service, nothing done."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from events.types import PodAdded
from tests.helpers.csidriver import MIB, DriverProcess, create_volume
from tests.service.conftest import MakeServe
from volfsm.cli import app

OBJECTS = """\
apiVersion: v1
kind: PersistentVolume
metadata: {name: far-pv}
spec:
  capacity: {storage: 32Mi}
  accessModes: [ReadWriteOnce]
  csi: {driver: csi.volfsm.dev, volumeHandle: far-vol, fsType: ext4}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: far, namespace: default}
spec: {volumeName: far-pv}
---
apiVersion: v1
kind: Pod
metadata: {name: far, namespace: default, uid: 0b5e1c9a-0000-4000-8000-00000000fa12}
spec:
  nodeName: n2
  volumes: [{name: data, persistentVolumeClaim: {claimName: far}}]
"""


def test_apply_of_a_pod_for_another_node_fails_with_one_line_and_publishes_nothing(
    runner: CliRunner, csi_driver: DriverProcess, make_serve: MakeServe, tmp_path: Path
) -> None:
    create_volume(csi_driver.clients(), "far-vol", 32 * MIB)
    svc = make_serve(args=["--csi", f"csi.volfsm.dev={csi_driver.endpoint}"]).start()
    manifest = tmp_path / "far.yaml"
    manifest.write_text(OBJECTS)

    result = runner.invoke(app, ["apply", "-f", str(manifest), "--data-dir", str(svc.data_dir)])

    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        "volfsm: error: node n1: InvalidObject: "
        'Pod default/far: spec.nodeName: "n2" is not this node ("n1")\n'
    )
    assert svc.stop() == 0
    log = svc.open_log()
    try:
        assert [e for e in log.read_after(0) if isinstance(e.body, PodAdded)] == []
    finally:
        log.close()
    assert csi_driver.calls("NodeStageVolume") == []
    assert csi_driver.calls("NodePublishVolume") == []
