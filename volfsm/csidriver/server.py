"""The gRPC server: a thread pool serving Identity, Controller and Node on a unix socket."""

from __future__ import annotations

import os
import signal
import socket
import stat
import threading
from concurrent import futures
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
from loguru import logger

from volfsm.csi.v1 import csi_pb2_grpc
from volfsm.csidriver.config import Settings
from volfsm.csidriver.controller import ControllerService
from volfsm.csidriver.faults import FaultInjector
from volfsm.csidriver.identity import IdentityService, missing_tools
from volfsm.csidriver.journal import CallJournal
from volfsm.csidriver.locks import VolumeLocks
from volfsm.csidriver.node import NodeService
from volfsm.csidriver.rpc import CallRunner
from volfsm.csidriver.state import StateStore
from volfsm.csidriver.volumes import Volumes

STOP_GRACE_S = 2.0


class EndpointError(ValueError):
    """The --endpoint is not a usable unix socket address."""


def socket_path(endpoint: str) -> Path:
    """The filesystem path of a ``unix:///abs/path.sock`` endpoint."""
    prefix = "unix://"
    if not endpoint.startswith(prefix):
        raise EndpointError(f"endpoint must look like unix:///path/to/csi.sock, got {endpoint!r}")
    path = endpoint[len(prefix) :]
    if not os.path.isabs(path):
        raise EndpointError(f"endpoint path must be absolute, got {endpoint!r}")
    return Path(path)


def _remove_stale_socket(path: Path) -> None:
    """Remove a socket left by a driver that died; one a process still listens on is not
    ours to take (another driver, or this one started twice): refused, left as it is."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise EndpointError(f"{path} exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(os.fspath(path))
        except (ConnectionRefusedError, FileNotFoundError):
            pass  # nobody listens: a stale socket
        except OSError as err:
            raise EndpointError(f"{path}: cannot tell whether it is in use ({err}); kept") from err
        else:
            raise EndpointError(f"{path} is in use: another process listens on it; kept")
    path.unlink(missing_ok=True)


class Driver:
    """The running driver: services wired to a gRPC server."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stopping = threading.Event()
        store = StateStore(settings.state_dir)
        self.volumes = Volumes(store, settings.default_volume_bytes)
        faults = FaultInjector(
            settings.faults_file, settings.state_dir / "faults-fired.json", self.stopping
        )
        runner = CallRunner(VolumeLocks(), faults, CallJournal(settings.call_log))
        self.identity = IdentityService(settings, runner)
        self.controller = ControllerService(settings, runner, self.volumes)
        self.node = NodeService(settings, runner, self.volumes)
        self._server: Any = None

    def start(self) -> None:
        """Rediscover volumes, bind the socket and start serving."""
        missing = missing_tools()
        if missing:
            logger.warning("missing tools, Probe will fail: {}", ", ".join(missing))
        self.volumes.rediscover()
        path = socket_path(self.settings.endpoint)
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_socket(path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.settings.workers))
        csi_pb2_grpc.add_IdentityServicer_to_server(self.identity, server)
        csi_pb2_grpc.add_ControllerServicer_to_server(self.controller, server)
        csi_pb2_grpc.add_NodeServicer_to_server(self.node, server)
        try:
            bound = server.add_insecure_port(f"unix://{path}")
        except RuntimeError as err:
            raise EndpointError(f"cannot listen on {path}: {err}") from err
        if not bound:
            raise EndpointError(f"cannot listen on {path}")
        server.start()
        self._server = server
        logger.info(
            "volfsm CSI driver {} serving on {} (node {}, state {})",
            self.settings.name,
            self.settings.endpoint,
            self.settings.node_id,
            self.settings.state_dir,
        )

    def stop(self) -> None:
        """Stop serving (cancel hung calls) and remove the socket."""
        self.stopping.set()
        if self._server is not None:
            self._server.stop(STOP_GRACE_S).wait()
            self._server = None
        socket_path(self.settings.endpoint).unlink(missing_ok=True)
        logger.info("volfsm CSI driver stopped")


def serve(settings: Settings) -> None:
    """Run the driver until SIGTERM or SIGINT."""
    driver = Driver(settings)
    driver.start()
    done = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("signal {} received, stopping", signal.Signals(signum).name)
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    done.wait()
    driver.stop()
