"""Fault points: spec parsing, matching by qualifier and operation, counting, the kill itself."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from volfsm import faultpoints
from volfsm.faultpoints import ENV_VAR, FaultSpecError

REPO_ROOT = Path(__file__).resolve().parents[2]


class Killed(Exception):
    """What the patched os.kill raises instead of killing pytest."""


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Patch the kill: record the signal and raise `Killed`; disarm after the test."""
    seen: list[int] = []

    def fake_kill(pid: int, sig: int) -> None:
        assert pid == os.getpid()
        seen.append(sig)
        raise Killed

    monkeypatch.setattr(os, "kill", fake_kill)  # the module calls os.kill
    try:
        yield seen
    finally:
        faultpoints.configure(None)


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("spec", "point", "qualifiers", "remaining", "delay"),
    [
        ("driver.before", "driver.before", (), 1, faultpoints.DEFAULT_IN_FLIGHT_S),
        ("driver.before/mount_device@3", "driver.before", ("mountdevice",), 3, 0.2),
        ("append.after/Volume_Unmount/Operation-Succeeded", "append.after",
         ("volumeunmount", "operationsucceeded"), 1, 0.2),
        ("driver.during/set_up@2+0.5", "driver.during", ("setup",), 2, 0.5),
        ("driver.during+0", "driver.during", (), 1, 0.0),
        (" relay.before_cursor@7 ", "relay.before_cursor", (), 7, 0.2),
    ],
)  # fmt: skip
def test_specs_parse_into_point_qualifiers_count_and_delay(
    spec: str, point: str, qualifiers: tuple[str, ...], remaining: int, delay: float
) -> None:
    armed = faultpoints.parse(spec)
    assert (armed.point, armed.qualifiers, armed.remaining, armed.in_flight_s) == (
        point,
        qualifiers,
        remaining,
        delay,
    )


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("driver.nowhere", "unknown fault point 'driver.nowhere'"),
        ("driver.before@x", "count 'x'"),
        ("driver.before@0", "must be 1 or more"),
        ("driver.before+1", "applies only to driver.during"),
        ("driver.during+soon", "delay 'soon'"),
        ("driver.during+-1", "must be 0 or more seconds"),
        ("driver.before@1@2", "not a number"),
    ],
)
def test_bad_specs_are_refused_naming_the_problem(spec: str, says: str) -> None:
    with pytest.raises(FaultSpecError, match=says.replace("+", r"\+")):
        faultpoints.parse(spec)


def test_every_point_is_known_and_disarmed_by_default() -> None:
    assert faultpoints.armed() is None
    for point in faultpoints.FAULT_POINTS:
        assert faultpoints.parse(point).point == point


# ------------------------------------------------------------------ matching


def test_disarmed_hits_do_nothing_and_in_flight_returns_the_call_itself(kills: list[int]) -> None:
    for point in faultpoints.FAULT_POINTS:
        faultpoints.hit(point, "MountDevice")
    marker = object()

    async def call() -> object:
        return marker

    coro = call()
    assert faultpoints.in_flight("driver.during", lambda: coro) is coro
    assert asyncio.run(coro) is marker
    assert kills == []


def test_the_nth_matching_hit_kills_and_others_do_not_count(kills: list[int]) -> None:
    faultpoints.configure("driver.before/mount_device@2")
    faultpoints.hit("driver.after", "MountDevice")  # another point
    faultpoints.hit("driver.before", "SetUp")  # another qualifier
    faultpoints.hit("driver.before", "MountDevice")  # first match
    assert kills == []
    with pytest.raises(Killed):
        faultpoints.hit("driver.before", "MountDevice")
    assert kills == [signal.SIGKILL]


async def test_qualifiers_match_the_running_operation_and_its_plugin(kills: list[int]) -> None:
    faultpoints.configure("driver.after/empty-dir/tear_down")

    async def op(name: str, plugin: str, call: str) -> bool:
        faultpoints.operation(name, plugin)
        try:
            faultpoints.hit("driver.after", call)
        except Killed:
            return True
        return False

    csi = "kubernetes.io/csi:csi.volfsm.dev"
    empty_dir = "kubernetes.io/empty-dir"
    killed = await asyncio.gather(
        asyncio.create_task(op("volume_unmount", csi, "TearDown")),
        asyncio.create_task(op("volume_mount", empty_dir, "SetUp")),
        asyncio.create_task(op("volume_unmount", empty_dir, "TearDown")),
    )
    assert list(killed) == [False, False, True]
    assert kills == [signal.SIGKILL]


async def test_operation_names_qualify_append_hits(kills: list[int]) -> None:
    faultpoints.configure("append.after/unmount_device/OperationSucceeded")

    async def op(name: str) -> bool:
        faultpoints.operation(name, "kubernetes.io/csi:csi.volfsm.dev")
        try:
            faultpoints.hit("append.after", "OperationSucceeded")
        except Killed:
            return True
        return False

    assert await asyncio.create_task(op("volume_unmount")) is False
    assert await asyncio.create_task(op("unmount_device")) is True


async def test_in_flight_kills_while_the_call_is_pending(kills: list[int]) -> None:
    faultpoints.configure("driver.during/mount_device+0.05")
    done = asyncio.Event()

    async def slow() -> str:
        await asyncio.sleep(5)
        done.set()
        return "staged"

    with pytest.raises(Killed):
        await faultpoints.in_flight("driver.during", slow, "MountDevice")
    assert kills == [signal.SIGKILL] and not done.is_set()


async def test_in_flight_kills_as_a_quick_call_returns_naming_pod_and_volume(
    kills: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    faultpoints.configure("driver.during+5")

    async def quick() -> str:
        return "published"

    async def op() -> None:
        faultpoints.operation("volume_mount", "kubernetes.io/empty-dir", "uid-1", "vol-1")
        await faultpoints.in_flight("driver.during", quick, "SetUp")

    with pytest.raises(Killed):
        await asyncio.create_task(op())
    assert capsys.readouterr().err == (
        "volfsm: fault point driver.during volume_mount/kubernetes.io/empty-dir/SetUp"
        " (call returned) [pod=uid-1 volume=vol-1]: SIGKILL\n"
    )


# ------------------------------------------------------------------ the real thing


def run_python(code: str, spec: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with VOLFSM_FAULT_POINT=spec."""
    env = {**os.environ, ENV_VAR: spec, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_the_env_var_arms_a_real_sigkill_with_a_line_on_stderr() -> None:
    code = (
        "from volfsm import faultpoints\n"
        "faultpoints.hit('driver.before', 'SetUp')\n"
        "print('survived one', flush=True)\n"
        "faultpoints.hit('driver.before', 'SetUp')\n"
        "print('survived two', flush=True)\n"
    )
    done = run_python(code, "driver.before/set_up@2")
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == "survived one\n"
    assert done.stderr.endswith("volfsm: fault point driver.before SetUp: SIGKILL\n")


def test_a_bad_env_spec_leaves_the_process_disarmed_and_says_why() -> None:
    code = (
        "from volfsm import faultpoints\n"
        "print(faultpoints.armed(), faultpoints.ENV_ERROR, sep='|')\n"
        "faultpoints.hit('driver.before', 'SetUp')\n"
        "print('survived', flush=True)\n"
    )
    done = run_python(code, "driver.before@many")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "None|fault point count 'many' in 'driver.before@many' is not a number\nsurvived\n"
    )


def test_serve_fault_point_option_kills_the_real_service_at_its_point(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOLFSM_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "volfsm.cli", "serve", "--data-dir", str(tmp_path),
         "--fault-point", "reconstruct.start", "--log-format", "text"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert "fault point armed: this process SIGKILLs itself at reconstruct.start" in done.stderr
    assert done.stderr.endswith("volfsm: fault point reconstruct.start : SIGKILL\n")
    assert (tmp_path / "volfsm.db").exists()
