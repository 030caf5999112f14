"""Fixtures: a running driver per test, its gRPC clients, and cleanup that always runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.csidriver import (
    CsiClients,
    DriverProcess,
    cleanup_under,
    leftovers_under,
    live_drivers,
    stop_all_drivers,
)

StartDriver = Callable[..., DriverProcess]


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Final check of the session: no driver process, mount or loop device is left."""
    yield
    base = tmp_path_factory.getbasetemp()
    stray = live_drivers()
    stop_all_drivers()
    found = cleanup_under(base)
    assert not stray, f"driver processes left running: {stray}"
    assert found.empty, f"left behind under {base}: {found}"
    assert leftovers_under(base).empty


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember each phase's outcome on the item, for the cleanup fixture."""
    report = yield
    setattr(item, f"_csidriver_{report.when}", report)
    return report


@pytest.fixture
def start_driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StartDriver]:
    """Start drivers with their state under tmp_path; all stopped and cleaned up after.

    Cleanup always runs. A test that passed but left a mount, loop device or
    driver process behind fails in teardown.
    """
    started: list[DriverProcess] = []

    def start(*extra_args: str, workdir: Path | None = None, **kwargs: Any) -> DriverProcess:
        drv = DriverProcess(workdir or tmp_path, extra_args=extra_args, **kwargs)
        started.append(drv)
        return drv.start()

    yield start
    for drv in started:
        drv.close()
    found = cleanup_under(tmp_path)
    assert leftovers_under(tmp_path).empty, f"cleanup failed under {tmp_path}"
    call_report = getattr(request.node, "_csidriver_call", None)
    if call_report is not None and call_report.passed:
        assert found.empty, f"the test left mounts or loop devices behind: {found}"


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
