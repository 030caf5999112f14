"""Identity service, capabilities and node info."""

from __future__ import annotations

from tests.csidriver.conftest import StartDriver
from tests.helpers.csidriver import CsiClients
from volfsm.csi.v1 import csi_pb2

NodeRPC = csi_pb2.NodeServiceCapability.RPC
CtrlRPC = csi_pb2.ControllerServiceCapability.RPC


def _node_caps(csi: CsiClients) -> set[int]:
    resp = csi.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest(), timeout=5)
    return {c.rpc.type for c in resp.capabilities}


def test_plugin_info_probe_and_capabilities(csi: CsiClients) -> None:
    info = csi.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=5)
    assert info.name == "csi.volfsm.dev"
    assert info.vendor_version

    probe = csi.identity.Probe(csi_pb2.ProbeRequest(), timeout=5)
    assert probe.HasField("ready") and probe.ready.value

    caps = csi.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest(), timeout=5)
    services = {c.service.type for c in caps.capabilities if c.HasField("service")}
    expansion = {
        c.volume_expansion.type for c in caps.capabilities if c.HasField("volume_expansion")
    }
    assert csi_pb2.PluginCapability.Service.CONTROLLER_SERVICE in services
    assert csi_pb2.PluginCapability.VolumeExpansion.ONLINE in expansion

    ctrl = csi.controller.ControllerGetCapabilities(
        csi_pb2.ControllerGetCapabilitiesRequest(), timeout=5
    )
    assert {c.rpc.type for c in ctrl.capabilities} == {
        CtrlRPC.CREATE_DELETE_VOLUME,
        CtrlRPC.EXPAND_VOLUME,
    }


def test_node_capabilities_and_info(csi: CsiClients) -> None:
    assert _node_caps(csi) == {
        NodeRPC.STAGE_UNSTAGE_VOLUME,
        NodeRPC.GET_VOLUME_STATS,
        NodeRPC.EXPAND_VOLUME,
        NodeRPC.VOLUME_CONDITION,
    }
    info = csi.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=5)
    assert info.node_id == "node-1"
    assert info.max_volumes_per_node == 0


def test_flags_change_what_is_offered(start_driver: StartDriver) -> None:
    drv = start_driver(
        "--no-stage",
        "--single-node-multi-writer",
        "--volume-mount-group",
        "--max-volumes-per-node",
        "7",
        node_id="worker-9",
        name="test.csi.example",
    )
    csi = drv.clients()
    assert _node_caps(csi) == {
        NodeRPC.GET_VOLUME_STATS,
        NodeRPC.EXPAND_VOLUME,
        NodeRPC.VOLUME_CONDITION,
        NodeRPC.SINGLE_NODE_MULTI_WRITER,
        NodeRPC.VOLUME_MOUNT_GROUP,
    }
    info = csi.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=5)
    assert (info.node_id, info.max_volumes_per_node) == ("worker-9", 7)
    name = csi.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=5).name
    assert name == "test.csi.example"
