"""The recorded incident (tests/data/incident.db), a CLI runner and the golden-file check."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from volfsm.cli import app

DATA = Path(__file__).resolve().parent.parent / "data"
INCIDENT = DATA / "incident.db"


@pytest.fixture
def incident(tmp_path: Path) -> Path:
    """A private copy of the incident log (readers never touch the committed file)."""
    copy = tmp_path / "incident.db"
    shutil.copyfile(INCIDENT, copy)
    return copy


@pytest.fixture
def runner() -> CliRunner:
    """A Typer test runner (stdout and stderr kept apart; not a terminal)."""
    return CliRunner()


def run_ok(runner: CliRunner, args: list[str]) -> str:
    """Run `volfsm ARGS`; its stdout (fails the test on a non-zero exit)."""
    result = runner.invoke(app, args)
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.stdout}\n{result.stderr}"
    return result.stdout
