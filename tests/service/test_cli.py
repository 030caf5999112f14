"""`volfsm apply | delete | get | wait | serve`: argument errors, refusals, failing mounts."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tests.helpers.csidriver import DriverProcess
from tests.service.conftest import MakeServe
from tests.service.helpers import EXAMPLES
from volfsm.cli import app


def run(runner: CliRunner, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def test_argument_errors_exit_2(runner: CliRunner, tmp_path: Path) -> None:
    where = ["--nats", "nats://127.0.0.1:1"]
    code, _, err = run(runner, "delete", "pod", *where)
    assert code == 2 and "give the pod: NAMESPACE/NAME or its uid" in err
    code, _, err = run(runner, "delete", "pod", "a/b", "--uid", "u", *where)
    assert code == 2
    code, _, err = run(runner, "delete", "pod", "a/b/c", *where)
    assert code == 2 and "expected NAMESPACE/NAME" in err
    code, _, err = run(runner, "get", "nodes", *where)
    assert code == 2 and "expected pods or volumes" in err
    code, _, err = run(runner, "apply", "-f", str(tmp_path / "missing.yaml"), *where)
    assert code == 2 and "no such file or directory" in err
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    code, _, err = run(runner, "apply", "-f", str(empty), *where)
    assert code == 2 and "no objects in" in err
    code, _, err = run(runner, "wait", "pod", "a/b", "--for", "ready", *where)
    assert code == 2
    code, _, err = run(runner, "get", "pods", *where, "--nats-user", "u")
    assert code == 2 and "--nats-password is required" in err


def test_serve_refuses_bad_settings_before_starting(runner: CliRunner, tmp_path: Path) -> None:
    base = ["serve", "--data-dir", str(tmp_path / "d"), "--node", "n1"]
    code, _, err = run(runner, *base, "--csi-timeout", "-1")
    assert code == 2 and "--csi-timeout (from the command line): expected float > 0" in err
    code, _, err = run(runner, *base, env={"VOLFSM_CSI": "driver-without-endpoint"})
    assert code == 2 and "--csi (from env VOLFSM_CSI): expected NAME=unix:///PATH.sock" in err
    conf = tmp_path / "serve.toml"
    conf.write_text("reconcile_period = 0\n")
    code, _, err = run(runner, *base, "--config", str(conf))
    assert code == 2 and f"--reconcile-period (from {conf} key reconcile_period)" in err
    assert not (tmp_path / "d").exists()


def test_invalid_objects_and_unknown_pods_are_refused(
    runner: CliRunner, make_serve: MakeServe, tmp_path: Path
) -> None:
    svc = make_serve().start()
    env = {"VOLFSM_NATS": svc.url, "VOLFSM_NODE": "n1"}
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: default, uid: '../x'}\n"
        "spec: {volumes: []}\n"
    )
    code, _, err = run(runner, "apply", "-f", str(bad), env=env)
    assert code == 1
    assert "node n1: InvalidObject: Pod default/p: metadata.uid" in err
    code, _, err = run(runner, "delete", "pod", "default/ghost", env=env)
    assert code == 2
    assert err == "volfsm: error: no pod default/ghost on node n1; pods it has: none\n"
    code, _, err = run(
        runner, "wait", "pod", "default/ghost", "--for", "mounted", "--timeout", "0.3", env=env
    )
    assert code == 1
    assert "pod default/ghost not mounted after 0.3s: the node does not know this pod" in err
    code, out, _ = run(runner, "wait", "pod", "ghost", "--for", "unmounted", env=env)
    assert code == 0 and out == "pod/default/ghost unmounted\n"
    code, out, _ = run(runner, "get", "volumes", env=env)
    assert code == 0 and out.startswith("node n1, seq 0, publish lag 0 (NATS connected)\n")
    assert "(none)" in out


def test_a_failing_mount_shows_its_error_and_next_retry(
    runner: CliRunner, csi_driver: DriverProcess, make_serve: MakeServe
) -> None:
    # The driver has no volume demo-vol-1: NodeStageVolume fails with NOT_FOUND, retried
    svc = make_serve(args=["--csi", f"csi.volfsm.dev={csi_driver.endpoint}"]).start()
    where = ["--data-dir", str(svc.data_dir)]
    code, _, err = run(runner, "apply", "-f", str(EXAMPLES / "csi"), *where)
    assert code == 0, err

    code, _, err = run(
        runner, "wait", "pod", "default/web", "--for", "mounted", "--timeout", "2", *where
    )
    assert code == 1
    assert "pod default/web not mounted after 2s: volume data is" in err
    assert "last error" in err and "NotFound" in err

    code, out, _ = run(runner, "get", "pods", "-o", "json", *where)
    [pod] = json.loads(out)["items"]
    [vol] = pod["volumes"]
    assert pod["phase"] == "Pending" and vol["state"] != "Mounted"
    assert vol["last_error"]["operation"] == "volume_mount"
    assert vol["last_error"]["code"] == "NotFound"
    assert vol["last_error"]["final"] is not None
    assert isinstance(vol["next_retry_us"], int) or vol["last_operation"]["status"] == "running"
    code, out, _ = run(runner, "get", "pods", *where)
    assert "LAST ERROR" in out and "NEXT RETRY" in out and "Pending" in out
