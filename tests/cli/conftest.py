"""A demo log shared by the CLI tests, and a runner for the `volfsm` app."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from volfsm.cli.demolog import DemoResult, write_demo

DEMO_END_US = 1_714_533_000_000_000  # 2024-05-01T03:10:00Z
DEMO_SEED = 7


@pytest.fixture(scope="session")
def demo_log(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    """The demo history, deterministic (fixed seed and end time), written once."""
    data_dir = tmp_path_factory.mktemp("demo")
    return write_demo(data_dir / "volfsm.db", seed=DEMO_SEED, end_us=DEMO_END_US)


@pytest.fixture
def runner() -> CliRunner:
    """A Typer test runner (stdout and stderr kept apart)."""
    return CliRunner()


def data_dir_args(demo: DemoResult) -> list[str]:
    """`--data-dir` pointing at the demo log."""
    return ["--data-dir", str(Path(demo.path).parent)]
