"""Fixtures: a running driver per test, its gRPC clients, and cleanup that always runs.

The driver fixtures and the leftover checks are shared with the other CSI
suites (tests/helpers/csidriver.py): every driver a test starts is stopped
when it ends and everything under its tmp_path is unmounted and detached,
even if it failed; a test that passed but left a mount, loop device or
driver process behind fails in teardown; the session ends with a final check.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import csidriver as shared
from tests.helpers.csidriver import CsiClients, DriverProcess, StartDriver

__all__ = ["StartDriver"]

pytest_runtest_makereport = shared.remember_reports
_nothing_left_behind = shared.nothing_left_behind
janitor = shared.janitor_fixture
start_driver = shared.start_driver_fixture


@pytest.fixture
def driver(start_driver: StartDriver) -> DriverProcess:
    """A driver with default options."""
    return start_driver()


@pytest.fixture
def csi(driver: DriverProcess) -> CsiClients:
    """gRPC clients of the default driver."""
    return driver.clients()


@pytest.fixture
def staging(tmp_path: Path) -> Callable[[str], str]:
    """Create (as the CO does) and return a staging directory for a volume."""

    def make(volume_id: str) -> str:
        path = tmp_path / "staging" / volume_id
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    return make


@pytest.fixture
def target(tmp_path: Path) -> Callable[[str], str]:
    """A target path whose parent exists (as the CO makes sure); the driver creates it."""

    def make(name: str) -> str:
        parent = tmp_path / "pods" / name
        parent.mkdir(parents=True, exist_ok=True)
        return str(parent / "mount")

    return make
