"""`volfsm demo`: a realistic, valid, deterministic sample log; never clobbers a log by accident."""

from __future__ import annotations

import random
from pathlib import Path

from typer.testing import CliRunner

from events.log import EventLog
from events.tables import OPERATION_EVENTS
from events.types import PodAdded
from projections.asw import fold
from projections.validate import validate
from tests.cli.conftest import DEMO_END_US, DEMO_SEED
from volfsm.cli import app
from volfsm.cli.demolog import build_scenario, write_demo

END = "2024-05-01T03:10:00Z"


def _export(runner: CliRunner, data_dir: Path) -> str:
    result = runner.invoke(app, ["export", "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_demo_writes_a_valid_history_of_a_few_minutes_ending_at_end(
    runner: CliRunner, tmp_path: Path
) -> None:
    result = runner.invoke(
        app, ["demo", "--data-dir", str(tmp_path / "d"), "--seed", "1", "--end", END]
    )
    assert result.exit_code == 0, result.output
    assert f"to {tmp_path / 'd' / 'volfsm.db'}" in result.stdout
    assert "..2024-05-01T03:10:00.000Z" in result.stdout.replace(" ", "")
    with EventLog(tmp_path / "d" / "volfsm.db", readonly=True) as log:
        envs = list(log.read_after(0))
        assert log.node == "demo-node"
    assert validate(envs).ok
    span_s = (envs[-1].ts - envs[0].ts) / 1e6
    assert 120 < span_s < 600
    assert envs[-1].ts == DEMO_END_US
    types = {e.type for e in envs}
    assert {
        "PodPending",
        "ObjectApplied",
        "PodAdded",
        "PodRemoved",
        "DesiredSizeChanged",
        "DeviceAttached",
        "DeviceMounted",
        "DeviceMountUncertain",
        "DeviceUnmounted",
        "DeviceDetached",
        "VolumeResized",
        "VolumeMounted",
        "VolumeMountUncertain",
        "VolumeUnmounted",
    } | OPERATION_EVENTS == types
    # The log ends with a publish retry in flight.
    assert envs[-1].type == "OperationStarted"
    asw = fold(envs)
    states = sorted(pv.state for pv in asw.podvols.values())
    assert states.count("Mounted") == 3 and states.count("Uncertain") == 1


def test_same_seed_and_end_give_the_same_log(runner: CliRunner, tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_demo(tmp_path / name / "volfsm.db", seed=DEMO_SEED, end_us=DEMO_END_US)
    assert _export(runner, tmp_path / "a") == _export(runner, tmp_path / "b")
    write_demo(tmp_path / "c" / "volfsm.db", seed=DEMO_SEED + 1, end_us=DEMO_END_US)
    assert _export(runner, tmp_path / "c") != _export(runner, tmp_path / "a")


def test_scenario_has_the_backoffs_of_the_kubelet() -> None:
    steps = build_scenario(random.Random(0))
    failures = [b for s in steps for b in s.bodies if type(b).__name__ == "OperationFailed"]
    assert [(f.operation, f.backoff_s, f.final) for f in failures] == [  # type: ignore[attr-defined]
        ("mount_device", 0.5, False),
        ("mount_device", 1.0, False),
        ("unmount_device", 0.5, False),
        ("volume_mount", 0.5, False),
    ]


def test_demo_refuses_a_non_empty_log_unless_forced(runner: CliRunner, tmp_path: Path) -> None:
    args = ["demo", "--data-dir", str(tmp_path), "--seed", "3", "--end", END]
    assert runner.invoke(app, args).exit_code == 0
    first = _export(runner, tmp_path)
    result = runner.invoke(app, [*args[:-4], "--seed", "4"])
    assert result.exit_code == 2
    assert str(tmp_path / "volfsm.db") in result.stderr and "--force" in result.stderr
    assert _export(runner, tmp_path) == first
    result = runner.invoke(app, [*args[:-4], "--seed", "4", "--force", "--end", END])
    assert result.exit_code == 0, result.output
    replaced = _export(runner, tmp_path)
    assert replaced != first
    assert len(replaced.splitlines()) == len(first.splitlines())


def test_demo_never_touches_a_foreign_file_even_with_force(
    runner: CliRunner, tmp_path: Path
) -> None:
    path = tmp_path / "precious.db"
    path.write_text("my data\n" * 50)
    result = runner.invoke(app, ["demo", "--db", str(path), "--force"])
    assert result.exit_code == 2
    assert str(path) in result.stderr and "not a volfsm event log" in result.stderr
    assert path.read_text() == "my data\n" * 50


def test_demo_never_replaces_a_log_a_service_wrote_even_with_force(
    runner: CliRunner, tmp_path: Path
) -> None:
    # A service's log: its node's events and the relay's cursor (what `volfsm serve` leaves)
    path = tmp_path / "volfsm.db"
    with EventLog(path, node="node-1") as log:
        log.append("pod/p", 0, [PodAdded(pod_uid="p", namespace="shop", name="web-0")])
        log.set_cursor("relay:VOLFSM", 1)
    before = path.read_bytes()
    for extra in ([], ["--force"], ["--force", "--node", "node-1"]):
        result = runner.invoke(app, ["demo", "--data-dir", str(tmp_path), *extra])
        assert result.exit_code == 2
        [line] = result.stderr.splitlines()
        assert str(path) in line and "node node-1" in line and "not even with --force" in line
        assert "volfsm demo --data-dir /tmp/volfsm-demo" in line
    assert path.read_bytes() == before
