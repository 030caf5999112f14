"""The suite's fixtures clean up after failing tests: proved on a small failing suite.

A pytest run in a subprocess uses this directory's fixtures on tests that
fail with a pod mounted, fail while a NodeStageVolume hangs in the driver,
and pass while leaving a staged volume behind. Afterwards nothing may be
left under that run's temp dir: no mount, no loop device, no driver
process, no socket dir; and the leaky passing test must have been reported
as an error.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.enginecsi.helpers import loops_backed_under, mounts_under
from tests.helpers.csidriver import REPO_ROOT, driver_pids_under

INNER_CONFTEST = """
from tests.enginecsi import conftest as outer

pytest_runtest_makereport = outer.pytest_runtest_makereport
_nothing_left_behind = outer._nothing_left_behind
janitor = outer.janitor
start_driver = outer.start_driver
driver = outer.driver
make_stack = outer.make_stack
stack = outer.stack
"""

INNER_TESTS = """
import asyncio
from pathlib import Path

from tests.enginecsi.helpers import claimed_volume, pod, eventually, failed
from tests.helpers.csidriver import create_volume, stage_volume

MIB = 1 << 20


async def test_fails_with_a_pod_mounted(stack):
    create_volume(stack.driver.clients(), "v1", 32 * MIB)
    await stack.engine.apply([*claimed_volume("pv1", "v1"), pod("p1", "pv1")])
    await stack.engine.wait_pod("p1", "mounted", timeout=120)
    Path("{record}").write_text(stack.driver.socket_dir.as_posix())
    raise AssertionError("failing with a volume mounted")


async def test_fails_while_the_driver_hangs(driver, make_stack):
    create_volume(driver.clients(), "v2", 32 * MIB)
    driver.set_faults([{{"rpc": "NodeStageVolume", "action": "hang", "when": "after"}}])
    stack = await make_stack(driver, csi_timeout=600)
    await stack.engine.apply([*claimed_volume("pv2", "v2", mode="Block"), pod("p2", "pv2")])
    await eventually(lambda: driver.calls("NodeStageVolume", event="start"), "stage called")
    await asyncio.sleep(0.2)
    raise AssertionError("failing with a stage in flight")


def test_passes_but_leaves_a_staged_volume(driver, tmp_path):
    clients = driver.clients()
    create_volume(clients, "v3", 32 * MIB)
    staging = tmp_path / "by-hand"
    staging.mkdir()
    stage_volume(clients, "v3", str(staging))
"""


def test_failing_tests_leave_nothing_behind(tmp_path: Path) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    record = tmp_path / "socket-dir.txt"
    (inner / "conftest.py").write_text(INNER_CONFTEST)
    (inner / "test_inner.py").write_text(INNER_TESTS.format(record=record))
    basetemp = tmp_path / "basetemp"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(REPO_ROOT / "pyproject.toml"),
            "--rootdir",
            str(inner),
            "--basetemp",
            str(basetemp),
            str(inner / "test_inner.py"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=REPO_ROOT,
        check=False,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    assert re.search(r"\b2 failed, 1 passed, 1 error\b", summary), done.stdout[-4000:]
    assert "the test left mounts, loop devices or drivers behind" in done.stdout
    assert "failing with a volume mounted" in done.stdout
    assert "failing with a stage in flight" in done.stdout
    assert mounts_under(basetemp) == []
    assert loops_backed_under(basetemp) == []
    assert driver_pids_under(basetemp) == []
    assert record.exists() and not Path(record.read_text()).exists()  # socket dir removed
