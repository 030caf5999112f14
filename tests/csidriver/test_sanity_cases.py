"""csi-sanity (kubernetes-csi/csi-test, pkg/sanity) mirrored against volfsm's CSI driver.

csi-sanity is a Go binary that no package index this machine reaches offers
(PyPI, npm, Debian; the Go proxy and github.com do not resolve), so this module
makes its requests, with the same fields, against one real driver process and
expects the codes and results it expects. Each test names the csi-sanity case
it mirrors ("Group / case"); after each one the test's volumes are cleaned up
as csi-sanity's Resources.Cleanup does it (NodeUnpublish of <target>/target
and NodeUnstage of the staging dir, each OK or NOT_FOUND, then DeleteVolume,
which must succeed), and nothing may stay mounted under the test's dirs.
csi-sanity's defaults are used: 10 GiB test volumes (sparse files here),
expansion by 1 GiB, idempotent count 10, its fake ids (``fake-vol-id-…``).

What the driver advertises (asserted below, so a change shows up here):
plugin CONTROLLER_SERVICE and VolumeExpansion ONLINE; controller
CREATE_DELETE_VOLUME and EXPAND_VOLUME; node STAGE_UNSTAGE_VOLUME,
GET_VOLUME_STATS, EXPAND_VOLUME and VOLUME_CONDITION.

Groups that apply (all their cases are here): Identity Service
(GetPluginCapabilities, Probe, GetPluginInfo); Controller Service:
ControllerGetCapabilities, CreateVolume (minus the cases below), DeleteVolume,
ValidateVolumeCapabilities; ExpandVolume [Controller Server]; Node Service:
NodeGetCapabilities, NodeGetInfo, NodePublishVolume, NodeUnpublishVolume,
NodeStageVolume, NodeUnstageVolume, NodeGetVolumeStats, NodeExpandVolume,
"should work" and "should be idempotent".

Groups and cases csi-sanity skips for this driver (capability not advertised),
so not generated here: GetCapacity (GET_CAPACITY); ListVolumes (LIST_VOLUMES);
ControllerPublishVolume, ControllerUnpublishVolume and "volume lifecycle"
(PUBLISH_UNPUBLISH_VOLUME); ListSnapshots, CreateSnapshot, DeleteSnapshot and
CreateVolume from a snapshot (CREATE_DELETE_SNAPSHOT / LIST_SNAPSHOTS);
CreateVolume from a volume (CLONE_VOLUME); ModifyVolume and CreateVolume with
mutable parameters (MODIFY_VOLUME); the group controller's VolumeGroupSnapshot
cases (GROUP_CONTROLLER_SERVICE); NodeGetInfo's topology check
(VOLUME_ACCESSIBILITY_CONSTRAINTS).

The last three tests are volfsm's own, beyond csi-sanity.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.helpers import csidriver as shared
from tests.helpers.csidriver import (
    CsiClients,
    DriverProcess,
    block_capability,
    create_volume,
    mount_capability,
)
from volfsm.csi.v1 import csi_pb2

GIB = 1 << 30
TEST_VOLUME_SIZE = 10 * GIB
EXPAND_SIZE = TEST_VOLUME_SIZE + GIB
IDEMPOTENT_COUNT = 10
MAX_NAME_LENGTH = 128
SUFFIX = "-" + secrets.token_hex(4).upper() + "-" + secrets.token_hex(4).upper()

OK = grpc.StatusCode.OK
NOT_FOUND = grpc.StatusCode.NOT_FOUND
INVALID = grpc.StatusCode.INVALID_ARGUMENT
ALREADY_EXISTS = grpc.StatusCode.ALREADY_EXISTS
Mode = csi_pb2.VolumeCapability.AccessMode.Mode
PluginService = csi_pb2.PluginCapability.Service.Type
Expansion = csi_pb2.PluginCapability.VolumeExpansion.Type
ControllerRpc = csi_pb2.ControllerServiceCapability.RPC.Type
NodeRpc = csi_pb2.NodeServiceCapability.RPC.Type

KNOWN_SERVICES = {
    "CONTROLLER_SERVICE",
    "VOLUME_ACCESSIBILITY_CONSTRAINTS",
    "GROUP_CONTROLLER_SERVICE",
}
KNOWN_CONTROLLER_RPCS = set(ControllerRpc.keys()) - {"UNKNOWN"}
KNOWN_NODE_RPCS = set(NodeRpc.keys())


def unique(prefix: str) -> str:
    """csi-sanity's UniqueString: the prefix and one random suffix per run."""
    return prefix + SUFFIX


def fake_volume_id() -> str:
    """csi-sanity's default generator of a valid volume id that does not exist."""
    return "fake-vol-id-" + secrets.token_hex(5)


def sanity_capability() -> Any:
    """csi-sanity's TestVolumeCapabilityWithAccessType: mount, SINGLE_NODE_WRITER."""
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=Mode.SINGLE_NODE_WRITER),
    )


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    """The status code a call ends with (OK when it succeeds)."""
    try:
        call()
    except grpc.RpcError as err:
        return err.code()
    return OK


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def sanity_driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DriverProcess]:
    """One driver (default options) for the whole module; cleaned up whatever happens."""
    workdir = tmp_path_factory.mktemp("sanity-driver")
    driver = DriverProcess(workdir)
    try:
        driver.start()
        yield driver
    finally:
        driver.close()
        shared.cleanup_under(workdir)
    assert shared.leftovers_under(workdir).empty


@dataclass
class Sanity:
    """What a csi-sanity case works with: clients, its two dirs, the volumes it made."""

    csi: CsiClients
    target_path: str
    staging_path: str
    created: list[str] = field(default_factory=list)

    @property
    def target(self) -> str:
        """NodePublishVolume's target_path: an entry of the target dir, made by the driver."""
        return self.target_path + "/target"

    def create(self, request: Any) -> Any:
        """CreateVolume; a created volume is remembered for cleanup."""
        response = self.csi.controller.CreateVolume(request, timeout=60)
        self.created.append(response.volume.volume_id)
        return response

    def must_create(self, name: str, required: int = TEST_VOLUME_SIZE, limit: int = 0) -> Any:
        """CreateVolume with one SINGLE_NODE_WRITER mount capability; the Volume."""
        volume = self.create(
            csi_pb2.CreateVolumeRequest(
                name=name,
                volume_capabilities=[sanity_capability()],
                capacity_range=csi_pb2.CapacityRange(required_bytes=required, limit_bytes=limit),
            )
        ).volume
        assert volume.volume_id
        return volume

    def stage(self, volume_id: str) -> None:
        """NodeStageVolume as csi-sanity sends it."""
        self.csi.node.NodeStageVolume(
            csi_pb2.NodeStageVolumeRequest(
                volume_id=volume_id,
                volume_capability=sanity_capability(),
                staging_target_path=self.staging_path,
            ),
            timeout=60,
        )

    def publish(self, volume_id: str) -> None:
        """NodePublishVolume of the staged volume at <target dir>/target."""
        self.csi.node.NodePublishVolume(
            csi_pb2.NodePublishVolumeRequest(
                volume_id=volume_id,
                target_path=self.target,
                staging_target_path=self.staging_path,
                volume_capability=sanity_capability(),
            ),
            timeout=60,
        )

    def cleanup(self) -> list[str]:
        """csi-sanity's Resources.Cleanup, last volume first; what went wrong."""
        problems = []
        for volume_id in reversed(self.created):
            unpublish = csi_pb2.NodeUnpublishVolumeRequest(
                volume_id=volume_id, target_path=self.target
            )
            unstage = csi_pb2.NodeUnstageVolumeRequest(
                volume_id=volume_id, staging_target_path=self.staging_path
            )
            delete = csi_pb2.DeleteVolumeRequest(volume_id=volume_id)
            node, controller = self.csi.node, self.csi.controller
            for call, request, allowed in (
                (node.NodeUnpublishVolume, unpublish, {OK, NOT_FOUND}),
                (node.NodeUnstageVolume, unstage, {OK, NOT_FOUND}),
                (controller.DeleteVolume, delete, {OK}),
            ):
                code = code_of(partial(call, request, timeout=60))
                if code not in allowed:
                    problems.append(f"{type(request).__name__} of {volume_id}: {code.name}")
        self.created.clear()
        return problems


@pytest.fixture
def sc(
    request: pytest.FixtureRequest, sanity_driver: DriverProcess, tmp_path: Path
) -> Iterator[Sanity]:
    """A csi-sanity test context: fresh target and staging dirs (csi-sanity makes both)."""
    target_dir = tmp_path / "csi-mount"
    staging_dir = tmp_path / "csi-staging"
    target_dir.mkdir()
    staging_dir.mkdir()
    context = Sanity(sanity_driver.clients(), str(target_dir), str(staging_dir))
    try:
        yield context
    finally:
        problems = context.cleanup()
        context.csi.close()
        shared.check_clean(request.node, tmp_path)
        assert not problems, f"csi-sanity's cleanup failed: {problems}"


@pytest.fixture
def csi(sc: Sanity) -> CsiClients:
    """The module driver's clients (for volfsm's own cases at the end)."""
    return sc.csi


# ---------------------------------------------------------------- the driver's capabilities


def test_the_driver_advertises_what_this_module_covers(sc: Sanity) -> None:
    plugin = sc.csi.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
    services = {
        PluginService.Name(c.service.type) for c in plugin.capabilities if c.HasField("service")
    }
    expansion = {
        Expansion.Name(c.volume_expansion.type)
        for c in plugin.capabilities
        if c.HasField("volume_expansion")
    }
    controller = sc.csi.controller.ControllerGetCapabilities(
        csi_pb2.ControllerGetCapabilitiesRequest()
    )
    node = sc.csi.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest())
    assert services == {"CONTROLLER_SERVICE"} and expansion == {"ONLINE"}
    assert {ControllerRpc.Name(c.rpc.type) for c in controller.capabilities} == {
        "CREATE_DELETE_VOLUME",
        "EXPAND_VOLUME",
    }
    assert {NodeRpc.Name(c.rpc.type) for c in node.capabilities} == {
        "STAGE_UNSTAGE_VOLUME",
        "GET_VOLUME_STATS",
        "EXPAND_VOLUME",
        "VOLUME_CONDITION",
    }


# ---------------------------------------------------------------- Identity Service


def test_identity_get_plugin_capabilities_returns_appropriate_capabilities(sc: Sanity) -> None:
    reply = sc.csi.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
    for cap in reply.capabilities:
        kind = cap.WhichOneof("type")
        assert kind in ("service", "volume_expansion"), f"unknown capability {cap}"
        if kind == "service":
            assert PluginService.Name(cap.service.type) in KNOWN_SERVICES
        else:
            assert Expansion.Name(cap.volume_expansion.type) in {"ONLINE", "OFFLINE"}


def test_identity_probe_returns_appropriate_information(sc: Sanity) -> None:
    reply = sc.csi.identity.Probe(csi_pb2.ProbeRequest())
    assert reply is not None  # OK (csi-sanity also accepts FAILED_PRECONDITION)


def test_identity_get_plugin_info_returns_appropriate_information(sc: Sanity) -> None:
    name = sc.csi.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest()).name
    assert 0 < len(name) <= 63
    assert re.fullmatch(r"[a-zA-Z][A-Za-z0-9\\._-]{0,61}[a-zA-Z]", name)


# ---------------------------------------------------------------- capabilities and node info


def test_controller_get_capabilities_returns_appropriate_capabilities(sc: Sanity) -> None:
    reply = sc.csi.controller.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest())
    assert reply.capabilities
    for cap in reply.capabilities:
        assert cap.HasField("rpc") and ControllerRpc.Name(cap.rpc.type) in KNOWN_CONTROLLER_RPCS


def test_node_get_capabilities_returns_appropriate_capabilities(sc: Sanity) -> None:
    reply = sc.csi.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest())
    for cap in reply.capabilities:
        assert cap.HasField("rpc") and NodeRpc.Name(cap.rpc.type) in KNOWN_NODE_RPCS


def test_node_get_info_returns_appropriate_values(sc: Sanity) -> None:
    info = sc.csi.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest())
    assert info.node_id and info.max_volumes_per_node >= 0


# ------------------------------------------------ missing fields and unknown volumes

Request = Callable[[Sanity], tuple[str, Any]]
"""Builds (RPC name, request) for one csi-sanity case; may create a volume first."""


def _volume(sc: Sanity, prefix: str) -> str:
    return str(sc.must_create(unique(prefix)).volume_id)


MISSING_FIELD_CASES: dict[str, Request] = {
    "CreateVolume / no name": lambda sc: ("CreateVolume", csi_pb2.CreateVolumeRequest()),
    "CreateVolume / no volume capabilities": lambda sc: (
        "CreateVolume",
        csi_pb2.CreateVolumeRequest(name=unique("sanity-controller-create-no-volume-capabilities")),
    ),
    "DeleteVolume / no volume id": lambda sc: ("DeleteVolume", csi_pb2.DeleteVolumeRequest()),
    "ValidateVolumeCapabilities / no volume id": lambda sc: (
        "ValidateVolumeCapabilities",
        csi_pb2.ValidateVolumeCapabilitiesRequest(),
    ),
    "ValidateVolumeCapabilities / no volume capabilities": lambda sc: (
        "ValidateVolumeCapabilities",
        csi_pb2.ValidateVolumeCapabilitiesRequest(
            volume_id=_volume(sc, "sanity-controller-validate-nocaps")
        ),
    ),
    "ExpandVolume / no volume id": lambda sc: (
        "ControllerExpandVolume",
        csi_pb2.ControllerExpandVolumeRequest(
            capacity_range=csi_pb2.CapacityRange(required_bytes=EXPAND_SIZE)
        ),
    ),
    "ExpandVolume / no capacity range": lambda sc: (
        "ControllerExpandVolume",
        csi_pb2.ControllerExpandVolumeRequest(),
    ),
    "NodePublishVolume / no volume id": lambda sc: (
        "NodePublishVolume",
        csi_pb2.NodePublishVolumeRequest(),
    ),
    "NodePublishVolume / no target path": lambda sc: (
        "NodePublishVolume",
        csi_pb2.NodePublishVolumeRequest(volume_id=fake_volume_id()),
    ),
    "NodePublishVolume / no volume capability": lambda sc: (
        "NodePublishVolume",
        csi_pb2.NodePublishVolumeRequest(volume_id=fake_volume_id(), target_path=sc.target),
    ),
    "NodeUnpublishVolume / no volume id": lambda sc: (
        "NodeUnpublishVolume",
        csi_pb2.NodeUnpublishVolumeRequest(),
    ),
    "NodeUnpublishVolume / no target path": lambda sc: (
        "NodeUnpublishVolume",
        csi_pb2.NodeUnpublishVolumeRequest(volume_id=fake_volume_id()),
    ),
    "NodeStageVolume / no volume id": lambda sc: (
        "NodeStageVolume",
        csi_pb2.NodeStageVolumeRequest(
            staging_target_path=sc.staging_path,
            volume_capability=sanity_capability(),
            publish_context={"device": "/dev/mock"},
        ),
    ),
    "NodeStageVolume / no staging target path": lambda sc: (
        "NodeStageVolume",
        csi_pb2.NodeStageVolumeRequest(
            volume_id=fake_volume_id(),
            volume_capability=sanity_capability(),
            publish_context={"device": "/dev/mock"},
        ),
    ),
    "NodeStageVolume / no volume capability": lambda sc: (
        "NodeStageVolume",
        csi_pb2.NodeStageVolumeRequest(
            volume_id=_volume(sc, "sanity-node-stage-nocaps"),
            staging_target_path=sc.staging_path,
            publish_context={"device": "/dev/mock"},
        ),
    ),
    "NodeUnstageVolume / no volume id": lambda sc: (
        "NodeUnstageVolume",
        csi_pb2.NodeUnstageVolumeRequest(staging_target_path=sc.staging_path),
    ),
    "NodeUnstageVolume / no staging target path": lambda sc: (
        "NodeUnstageVolume",
        csi_pb2.NodeUnstageVolumeRequest(volume_id=fake_volume_id()),
    ),
    "NodeGetVolumeStats / no volume id": lambda sc: (
        "NodeGetVolumeStats",
        csi_pb2.NodeGetVolumeStatsRequest(volume_path="some/path"),
    ),
    "NodeGetVolumeStats / no volume path": lambda sc: (
        "NodeGetVolumeStats",
        csi_pb2.NodeGetVolumeStatsRequest(volume_id=fake_volume_id()),
    ),
    "NodeExpandVolume / no volume id": lambda sc: (
        "NodeExpandVolume",
        csi_pb2.NodeExpandVolumeRequest(
            volume_path=sc.target_path, volume_capability=sanity_capability()
        ),
    ),
    "NodeExpandVolume / no volume path": lambda sc: (
        "NodeExpandVolume",
        csi_pb2.NodeExpandVolumeRequest(
            volume_id=_volume(sc, "sanity-node-expand-volume-valid-id"),
            volume_capability=sanity_capability(),
        ),
    ),
}

NOT_FOUND_CASES: dict[str, Request] = {
    "ValidateVolumeCapabilities / requested volume does not exist": lambda sc: (
        "ValidateVolumeCapabilities",
        csi_pb2.ValidateVolumeCapabilitiesRequest(
            volume_id=fake_volume_id(), volume_capabilities=[sanity_capability()]
        ),
    ),
    "NodeGetVolumeStats / volume is not found": lambda sc: (
        "NodeGetVolumeStats",
        csi_pb2.NodeGetVolumeStatsRequest(volume_id=fake_volume_id(), volume_path="some/path"),
    ),
    "NodeExpandVolume / volume is not found": lambda sc: (
        "NodeExpandVolume",
        csi_pb2.NodeExpandVolumeRequest(volume_id=fake_volume_id(), volume_path="some/path"),
    ),
}


def _send(sc: Sanity, rpc: str, request: Any) -> grpc.StatusCode:
    service = sc.csi.node if rpc.startswith("Node") else sc.csi.controller
    return code_of(lambda: getattr(service, rpc)(request, timeout=60))


@pytest.mark.parametrize("case", MISSING_FIELD_CASES.values(), ids=MISSING_FIELD_CASES.keys())
def test_a_request_without_a_required_field_is_invalid_argument(sc: Sanity, case: Request) -> None:
    rpc, request = case(sc)
    assert _send(sc, rpc, request) == INVALID


@pytest.mark.parametrize("case", NOT_FOUND_CASES.values(), ids=NOT_FOUND_CASES.keys())
def test_a_volume_that_does_not_exist_is_not_found(sc: Sanity, case: Request) -> None:
    rpc, request = case(sc)
    assert _send(sc, rpc, request) == NOT_FOUND


# ---------------------------------------------------------------- CreateVolume / DeleteVolume


def test_create_volume_returns_appropriate_values_single_node_writer_no_capacity(
    sc: Sanity,
) -> None:
    sc.must_create(unique("sanity-controller-create-single-no-capacity"))


def test_create_volume_returns_appropriate_values_single_node_writer_with_capacity(
    sc: Sanity,
) -> None:
    volume = sc.must_create(unique("sanity-controller-create-single-with-capacity"))
    assert volume.capacity_bytes == 0 or volume.capacity_bytes >= TEST_VOLUME_SIZE


def test_create_volume_with_an_existing_name_and_the_same_capacity_succeeds(sc: Sanity) -> None:
    name = unique("sanity-controller-create-twice")
    first, second = sc.must_create(name), sc.must_create(name)
    for volume in (first, second):
        assert volume.capacity_bytes == 0 or volume.capacity_bytes >= TEST_VOLUME_SIZE
    assert first.volume_id == second.volume_id


def test_create_volume_with_an_existing_name_and_another_capacity_is_already_exists(
    sc: Sanity,
) -> None:
    name = unique("sanity-controller-create-twice-different")
    sc.must_create(name, TEST_VOLUME_SIZE, TEST_VOLUME_SIZE)
    again = csi_pb2.CreateVolumeRequest(
        name=name,
        volume_capabilities=[sanity_capability()],
        capacity_range=csi_pb2.CapacityRange(
            required_bytes=2 * TEST_VOLUME_SIZE, limit_bytes=2 * TEST_VOLUME_SIZE
        ),
    )
    assert code_of(lambda: sc.create(again)) == ALREADY_EXISTS


def test_create_volume_with_a_maximum_length_name_succeeds(sc: Sanity) -> None:
    prefix = unique("sanity-controller-create-maxlen") + "-"
    name = prefix + secrets.token_hex(MAX_NAME_LENGTH)[: MAX_NAME_LENGTH - len(prefix)]
    assert len(name) == MAX_NAME_LENGTH
    volume = sc.must_create(name)
    assert volume.capacity_bytes == 0 or volume.capacity_bytes >= TEST_VOLUME_SIZE


def test_delete_volume_of_an_invalid_volume_id_succeeds(sc: Sanity) -> None:
    sc.csi.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id="fake-vol-id"))


def test_delete_volume_returns_appropriate_values(sc: Sanity) -> None:
    volume = sc.must_create(unique("sanity-controller-create-appropriate"))
    sc.csi.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id))
    sc.created.remove(volume.volume_id)  # as csi-sanity's DeleteVolume wrapper unregisters it


# ------------------------------------------------ ValidateVolumeCapabilities, expansion


def test_validate_volume_capabilities_returns_appropriate_values(sc: Sanity) -> None:
    volume = sc.must_create(unique("sanity-controller-validate"))
    reply = sc.csi.controller.ValidateVolumeCapabilities(
        csi_pb2.ValidateVolumeCapabilitiesRequest(
            volume_id=volume.volume_id, volume_capabilities=[sanity_capability()]
        )
    )
    if reply.HasField("confirmed"):
        assert reply.confirmed.volume_capabilities


def test_controller_expand_volume_works(sc: Sanity) -> None:
    volume = sc.must_create(unique("sanity-expand-volume"))
    reply = sc.csi.controller.ControllerExpandVolume(
        csi_pb2.ControllerExpandVolumeRequest(
            volume_id=volume.volume_id,
            capacity_range=csi_pb2.CapacityRange(required_bytes=EXPAND_SIZE),
            volume_capability=sanity_capability(),
        ),
        timeout=60,
    )
    assert reply.capacity_bytes == EXPAND_SIZE


def test_node_expand_volume_works_after_node_publish(sc: Sanity) -> None:
    volume = sc.must_create(unique("sanity-node-expand-volume"))
    grown = sc.csi.controller.ControllerExpandVolume(
        csi_pb2.ControllerExpandVolumeRequest(
            volume_id=volume.volume_id,
            capacity_range=csi_pb2.CapacityRange(required_bytes=EXPAND_SIZE),
        ),
        timeout=60,
    )
    assert grown.capacity_bytes == EXPAND_SIZE
    sc.stage(volume.volume_id)
    sc.publish(volume.volume_id)
    sc.csi.node.NodeExpandVolume(
        csi_pb2.NodeExpandVolumeRequest(
            volume_id=volume.volume_id,
            volume_path=sc.target,
            capacity_range=csi_pb2.CapacityRange(required_bytes=EXPAND_SIZE),
        ),
        timeout=60,
    )


# ---------------------------------------------------------------- node cases on a published volume


def test_node_unpublish_volume_removes_the_target_path(sc: Sanity) -> None:
    volume = sc.must_create(unique("sanity-node-unpublish-volume"))
    sc.stage(volume.volume_id)
    sc.publish(volume.volume_id)
    assert os.path.lexists(sc.target)
    sc.csi.node.NodeUnpublishVolume(
        csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume.volume_id, target_path=sc.target)
    )
    assert not os.path.lexists(sc.target)


def test_node_get_volume_stats_of_a_volume_not_at_the_path_is_not_found(sc: Sanity) -> None:
    volume = sc.must_create(unique("sanity-node-get-volume-stats"))
    sc.stage(volume.volume_id)
    sc.publish(volume.volume_id)
    request = csi_pb2.NodeGetVolumeStatsRequest(volume_id=volume.volume_id, volume_path="some/path")
    assert code_of(lambda: sc.csi.node.NodeGetVolumeStats(request)) == NOT_FOUND


@pytest.mark.parametrize(
    "count", [1, IDEMPOTENT_COUNT], ids=["should work", "should be idempotent"]
)
def test_node_service_stage_publish_and_stats(sc: Sanity, count: int) -> None:
    """csi-sanity's runControllerTest: NodeGetInfo, create, `count` stages and publishes, stats."""
    assert sc.csi.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest()).node_id
    volume = sc.must_create(unique(f"sanity-node-full-{count}"))
    for _ in range(count):
        sc.stage(volume.volume_id)
    for _ in range(count):
        sc.publish(volume.volume_id)
    stats = sc.csi.node.NodeGetVolumeStats(
        csi_pb2.NodeGetVolumeStatsRequest(volume_id=volume.volume_id, volume_path=sc.target)
    )
    assert stats.usage


# ---------------------------------------------------------------- volfsm's own, beyond csi-sanity


def validate(csi: CsiClients, volume_id: str, *caps: Any) -> Any:
    request = csi_pb2.ValidateVolumeCapabilitiesRequest(
        volume_id=volume_id, volume_capabilities=list(caps), parameters={"p": "1"}
    )
    return csi.controller.ValidateVolumeCapabilities(request, timeout=10)


def test_validate_volume_capabilities_follows_the_error_table(sc: Sanity, csi: CsiClients) -> None:
    sc.created.append(create_volume(csi, "vvc").volume_id)
    no_id = csi_pb2.ValidateVolumeCapabilitiesRequest(volume_capabilities=[mount_capability()])
    assert code_of(lambda: csi.controller.ValidateVolumeCapabilities(no_id, timeout=10)) == INVALID
    assert code_of(lambda: validate(csi, "vvc")) == INVALID  # no capabilities
    assert code_of(lambda: validate(csi, "ghost", mount_capability())) == NOT_FOUND


def test_validate_volume_capabilities_confirms_what_is_supported(
    sc: Sanity, csi: CsiClients
) -> None:
    sc.created.append(create_volume(csi, "vvc-ok").volume_id)
    reply = validate(csi, "vvc-ok", mount_capability(), block_capability())
    assert reply.HasField("confirmed")
    assert len(reply.confirmed.volume_capabilities) == 2
    assert dict(reply.confirmed.parameters) == {"p": "1"}
    unknown = csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=Mode.UNKNOWN),
    )
    refused = validate(csi, "vvc-ok", unknown)
    assert not refused.HasField("confirmed") and refused.message


def test_node_expand_of_an_unknown_volume_is_not_found_before_the_path_is_checked(
    sc: Sanity, csi: CsiClients
) -> None:
    # csi-sanity: "should fail when volume is not found" sends a relative "some-path"
    request = csi_pb2.NodeExpandVolumeRequest(volume_id="ghost", volume_path="some-path")
    assert code_of(lambda: csi.node.NodeExpandVolume(request, timeout=10)) == NOT_FOUND
    sc.created.append(create_volume(csi, "nev").volume_id)
    no_path = csi_pb2.NodeExpandVolumeRequest(volume_id="nev")
    assert code_of(lambda: csi.node.NodeExpandVolume(no_path, timeout=10)) == INVALID
