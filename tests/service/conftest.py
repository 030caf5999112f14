"""Fixtures: real nats-servers, `volfsm serve` subprocesses, CSI drivers; all cleaned up.

Whatever a test does, at its end every service it started is killed, every
mount under its tmp dir is unmounted and every CSI driver and loop device
it used is gone; at the end of the session no service may still run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.helpers.csidriver import DriverProcess, cleanup_under
from tests.service.helpers import ServeProcess, kill_all, unmount_under
from volfsm.bus import NatsServer

MakeServe = Callable[..., ServeProcess]
MakeServer = Callable[..., NatsServer]


@pytest.fixture(scope="session", autouse=True)
def _nothing_left() -> Iterator[None]:
    yield
    left = kill_all()
    assert not left, f"volfsm serve processes left running: {left}"


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[MakeServer]:
    """Start nats-servers under tmp_path; all stopped after the test."""
    made: list[NatsServer] = []

    def make(name: str = "nats", **kwargs: Any) -> NatsServer:
        srv = NatsServer(tmp_path / name, **kwargs)
        made.append(srv)
        return srv.start()

    yield make
    for srv in made:
        srv.stop()


@pytest.fixture
def nats_server(make_server: MakeServer) -> NatsServer:
    """One plain JetStream server."""
    return make_server()


@pytest.fixture
def make_serve(tmp_path: Path) -> Iterator[MakeServe]:
    """Build `volfsm serve` processes under tmp_path (not started); all killed after."""
    made: list[ServeProcess] = []

    def make(name: str = "svc", **kwargs: Any) -> ServeProcess:
        workdir = tmp_path / name
        workdir.mkdir(exist_ok=True)
        proc = ServeProcess(workdir, **kwargs)
        made.append(proc)
        return proc

    yield make
    for proc in made:
        proc.kill()
    unmount_under(tmp_path)


@pytest.fixture
def csi_driver(tmp_path: Path) -> Iterator[DriverProcess]:
    """volfsm's CSI driver (csi.volfsm.dev), running; stopped and cleaned up after."""
    drv = DriverProcess(tmp_path / "driver", node_id="n1")
    drv.workdir.mkdir()
    try:
        yield drv.start()
    finally:
        drv.close()
        cleanup_under(tmp_path)


@pytest.fixture
def runner() -> CliRunner:
    """A Typer test runner."""
    return CliRunner()
