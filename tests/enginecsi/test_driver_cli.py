"""`volfsm-csi-driver create-volume / expand-volume / delete-volume`: volumes from the shell.

The commands run as a user would run them (a separate process, on the
driver's socket); the volume they create is then mounted through the
engine, grown with expand-volume plus a bigger PV, and deleted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.enginecsi.conftest import Stack
from tests.enginecsi.helpers import (
    assert_nothing_left,
    claimed_volume,
    delete_and_wait,
    eventually,
    pod,
    pv,
    volume_id,
)
from tests.helpers.csidriver import REPO_ROOT, DriverProcess

MIB = 1 << 20


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `volfsm-csi-driver ARGS` (the console script's `main`) and capture its output."""
    full_env = {k: v for k, v in os.environ.items() if k != "CSI_ENDPOINT"}
    full_env.update(PYTHONPATH=str(REPO_ROOT), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "volfsm.csidriver", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=full_env,
        cwd=REPO_ROOT,
        check=False,
    )


def test_create_expand_delete_and_their_output(driver: DriverProcess) -> None:
    ep = driver.endpoint
    made = cli("create-volume", "cli-vol", "--size", "48Mi", "--endpoint", ep)
    assert made.returncode == 0, made.stderr
    assert made.stdout == "cli-vol\n"  # the volume id alone: VOL=$(volfsm-csi-driver ...)
    assert f"volume cli-vol ready ({48 * MIB} bytes)" in made.stderr
    assert driver.image("cli-vol").stat().st_size == 48 * MIB

    again = cli("create-volume", "cli-vol", "--size", "48Mi", "--endpoint", ep, "--json")
    assert again.returncode == 0, again.stderr  # idempotent by name
    assert json.loads(again.stdout) == {"volume_id": "cli-vol", "capacity_bytes": 48 * MIB}

    grown = cli("expand-volume", "cli-vol", "--size", "64Mi", "--json", env={"CSI_ENDPOINT": ep})
    assert grown.returncode == 0, grown.stderr
    assert json.loads(grown.stdout) == {
        "volume_id": "cli-vol",
        "capacity_bytes": 64 * MIB,
        "node_expansion_required": False,  # not formatted yet: nothing to grow on a node
    }
    block = cli("create-volume", "raw-vol", "--block", "--endpoint", ep)
    assert block.returncode == 0 and block.stdout == "raw-vol\n", block.stderr
    assert driver.image("raw-vol").stat().st_size == 64 * MIB  # the driver's default size

    for vid in ("cli-vol", "raw-vol", "cli-vol"):  # deleting twice is fine
        gone = cli("delete-volume", vid, "--endpoint", ep)
        assert gone.returncode == 0, gone.stderr
        assert gone.stdout == "" and f"volume {vid} deleted" in gone.stderr
        assert not driver.image(vid).exists()
    assert driver.codes("CreateVolume") == ["OK"] * 3
    assert driver.codes("DeleteVolume") == ["OK"] * 3


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["create-volume", "v", "--size", "1.5Gi"], 2, "'1.5Gi' is not a size"),
        (["create-volume", "v", "--size", "0"], 2, "must be above 0"),
        (["create-volume", "v", "--size=-1Gi"], 2, "'-1Gi' is not a size"),
        (["expand-volume", "v"], 2, "--size"),
        (["create-volume", "bad name"], 1, "the driver answered INVALID_ARGUMENT: name 'bad name'"),
        (["expand-volume", "nope", "--size", "1Gi"], 1, "NOT_FOUND: volume 'nope' does not exist"),
    ],
)
def test_bad_requests_get_clear_errors(
    driver: DriverProcess, args: list[str], code: int, message: str
) -> None:
    done = cli(*args, "--endpoint", driver.endpoint)
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("volfsm-csi-driver ")


def test_unreachable_driver_and_missing_endpoint(tmp_path: Path) -> None:
    nowhere = f"unix://{tmp_path}/none.sock"
    done = cli("create-volume", "v", "--endpoint", nowhere, "--wait", "0.2")
    assert done.returncode == 1
    assert f"cannot reach the CSI driver: {tmp_path}/none.sock does not exist" in done.stderr
    assert "is volfsm-csi-driver running" in done.stderr
    (tmp_path / "plain").write_text("")
    done = cli("delete-volume", "v", "--endpoint", f"unix://{tmp_path}/plain", "--wait", "0")
    assert done.returncode == 1 and "exists but is not a socket" in done.stderr
    done = cli("delete-volume", "v")
    assert done.returncode == 2 and "--endpoint (or CSI_ENDPOINT) is required" in done.stderr
    done = cli("delete-volume", "v", "--endpoint", "tcp://127.0.0.1:1")
    assert done.returncode == 2 and "unix:///path/to/csi.sock" in done.stderr


async def test_cli_volume_mounted_grown_and_deleted_through_the_engine(stack: Stack) -> None:
    """What a user does: create the volume, apply PV/PVC/Pod, grow it, delete everything."""
    drv, engine, layout = stack.driver, stack.engine, stack.layout
    assert drv is not None
    ep = drv.endpoint
    made = cli("create-volume", "user-vol", "--size", "32Mi", "--endpoint", ep)
    assert made.returncode == 0, made.stderr
    handle = made.stdout.strip()
    await engine.apply([*claimed_volume("pv-user", handle, size="32Mi"), pod("web", "pv-user")])
    await engine.wait_pod("web", "mounted", timeout=120)
    target = layout.csi_publish_path("web", "pv-user")

    busy = cli("delete-volume", handle, "--endpoint", ep)
    assert busy.returncode == 1
    assert "FAILED_PRECONDITION" in busy.stderr and "in use" in busy.stderr

    # The external resizer's part, then the PV's new size: the engine asks the node.
    grown = cli("expand-volume", handle, "--size", "80Mi", "--endpoint", ep)
    assert grown.returncode == 0 and grown.stdout == f"{80 * MIB}\n", grown.stderr
    await engine.apply([pv("pv-user", handle, size="80Mi")])
    vid = volume_id(handle)
    await eventually(lambda: engine.asw.devices[vid].size_bytes == 80 * MIB, "resized")
    st = os.statvfs(target)
    assert st.f_blocks * st.f_frsize > 64 * MIB

    await delete_and_wait(engine, ["web"], [handle])
    assert_nothing_left(drv, layout, [handle])
    gone = cli("delete-volume", handle, "--endpoint", ep)
    assert gone.returncode == 0, gone.stderr
    assert not drv.image(handle).exists()
