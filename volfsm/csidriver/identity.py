"""The CSI Identity service: name, capabilities, readiness."""

from __future__ import annotations

import os
import shutil
from importlib import metadata
from typing import Any

from google.protobuf import wrappers_pb2

from volfsm.csi.v1 import csi_pb2
from volfsm.csidriver.cmd import TOOLS
from volfsm.csidriver.config import Settings
from volfsm.csidriver.errors import failed_precondition
from volfsm.csidriver.rpc import CallRunner

Service = csi_pb2.PluginCapability.Service
Expansion = csi_pb2.PluginCapability.VolumeExpansion


def vendor_version() -> str:
    """volfsm's version, or 0.0.0 when it is not installed as a distribution."""
    try:
        return metadata.version("volfsm")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def missing_tools() -> list[str]:
    """Storage tools the driver needs that are not on PATH."""
    return [tool for tool in TOOLS if shutil.which(tool) is None]


class IdentityService:
    """Servicer for /csi.v1.Identity."""

    def __init__(self, settings: Settings, runner: CallRunner) -> None:
        self._settings = settings
        self._runner = runner

    def GetPluginInfo(self, request: Any, context: Any) -> Any:
        """Driver name and version."""
        return self._runner.run(
            "GetPluginInfo",
            request,
            context,
            lambda: csi_pb2.GetPluginInfoResponse(
                name=self._settings.name, vendor_version=vendor_version()
            ),
        )

    def GetPluginCapabilities(self, request: Any, context: Any) -> Any:
        """A controller service, and online volume expansion."""
        caps = [
            csi_pb2.PluginCapability(service=Service(type=Service.CONTROLLER_SERVICE)),
            csi_pb2.PluginCapability(volume_expansion=Expansion(type=Expansion.ONLINE)),
        ]
        return self._runner.run(
            "GetPluginCapabilities",
            request,
            context,
            lambda: csi_pb2.GetPluginCapabilitiesResponse(capabilities=caps),
        )

    def Probe(self, request: Any, context: Any) -> Any:
        """Ready when the tools are there and the state dir is writable."""
        return self._runner.run("Probe", request, context, self._probe)

    def _probe(self) -> Any:
        missing = missing_tools()
        if missing:
            raise failed_precondition(f"missing tools: {', '.join(missing)}")
        if not os.access(self._settings.state_dir, os.W_OK):
            raise failed_precondition(f"state dir {self._settings.state_dir} is not writable")
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=True))
