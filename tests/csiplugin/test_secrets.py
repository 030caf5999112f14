"""`csi_secret` fields reach the driver and never a log line."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from loguru import logger

from tests.csiplugin.conftest import MakePlugin
from tests.csiplugin.helpers import leftovers, new_volume, request, source
from tests.csiplugin.hostile import HostileDriver
from tests.helpers.csidriver import DriverProcess
from volfsm.csi.v1 import csi_pb2
from volfsm.node.layout import RootLayout
from volfsm.plugins.base import ErrorClass, PluginError
from volfsm.plugins.csi.client import CsiClient
from volfsm.plugins.csi.redact import REDACTED, redacted

STAGE_SECRET = "stage-pw-7f3a9c"
PUBLISH_SECRET = "publish-pw-b21e04"
SECRETS = {
    "ns/stage-creds": {"password": STAGE_SECRET, "user": "admin"},
    "ns/publish-creds": {"token": PUBLISH_SECRET},
}


def lookup(ref: str) -> dict[str, str]:
    return SECRETS[ref]


@pytest.fixture
def captured() -> Iterator[list[str]]:
    """Every loguru record at TRACE and above, formatted with its extras."""
    lines: list[str] = []
    sink = logger.add(
        lambda m: lines.append(str(m) + repr(m.record["extra"])), level="TRACE", format="{message}"
    )
    yield lines
    logger.remove(sink)


def secret_source(handle: str, driver: str = "csi.volfsm.dev") -> Any:
    return source(
        handle,
        driver,
        node_stage_secret_ref="ns/stage-creds",
        node_publish_secret_ref="ns/publish-creds",
    )


def test_redact_strips_every_secret_field() -> None:
    cap = csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(fs_type="ext4"),
        access_mode=csi_pb2.VolumeCapability.AccessMode(
            mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_MULTI_WRITER
        ),
    )
    messages = [
        csi_pb2.NodeStageVolumeRequest(
            volume_id="v", volume_capability=cap, secrets={"pw": STAGE_SECRET}
        ),
        csi_pb2.NodePublishVolumeRequest(
            volume_id="v", target_path="/t", secrets={"pw": STAGE_SECRET}, volume_context={"a": "b"}
        ),
        csi_pb2.NodeExpandVolumeRequest(volume_id="v", secrets={"pw": STAGE_SECRET}),
    ]
    for msg in messages:
        shown = redacted(msg)
        assert shown["secrets"] == REDACTED
        assert STAGE_SECRET not in repr(shown)
        assert shown["volume_id"] == "v"
    stage = redacted(messages[0])
    assert stage["volume_capability"]["access_mode"]["mode"] == "SINGLE_NODE_MULTI_WRITER"
    assert redacted(messages[1])["volume_context"] == {"a": "b"}
    # Secret fields are found from the proto options, in every message that has one.
    secret_fields = {
        (m.name, f.name)
        for m in csi_pb2.DESCRIPTOR.message_types_by_name.values()
        for f in m.fields
        if f.GetOptions().Extensions[csi_pb2.csi_secret]  # type: ignore[index]
    }
    assert {
        ("NodeStageVolumeRequest", "secrets"),
        ("NodePublishVolumeRequest", "secrets"),
        ("NodeExpandVolumeRequest", "secrets"),
    } <= secret_fields


async def test_client_debug_log_of_a_request_with_secrets(
    driver: DriverProcess, captured: list[str]
) -> None:
    client = CsiClient(driver.endpoint, timeout_s=10)
    try:
        with pytest.raises(PluginError):  # unknown volume: NOT_FOUND, but the request is logged
            await client.stage(
                csi_pb2.NodeStageVolumeRequest(
                    volume_id="no-such-volume",
                    staging_target_path="/tmp/nowhere",
                    secrets={"password": STAGE_SECRET},
                )
            )
    finally:
        await client.close()
    text = "\n".join(captured)
    assert "csi call NodeStageVolume" in text and REDACTED in text
    assert STAGE_SECRET not in text


async def test_real_calls_carry_secrets_and_logs_never_show_them(
    driver: DriverProcess, make_plugin: MakePlugin, layout: RootLayout, captured: list[str]
) -> None:
    plugin = await make_plugin(driver.endpoint, secrets=lookup)
    handle = new_volume(driver, "vol-secret")
    src = secret_source(handle)
    dev_req = request(plugin, handle, src=src)
    pod_req = request(plugin, handle, src=src, pod_uid="pod-a")
    await plugin.mount_device(dev_req)
    await plugin.set_up(pod_req)
    await plugin.expand(pod_req, 48 << 20)
    await plugin.tear_down(pod_req)
    await plugin.unmount_device(dev_req)
    text = "\n".join(captured)
    assert text.count(REDACTED) >= 2
    for secret in (STAGE_SECRET, PUBLISH_SECRET):
        assert secret not in text
        assert secret not in driver.log_text()
    assert leftovers(layout) == []


async def test_secrets_reach_the_driver(
    hostile: HostileDriver, make_plugin: MakePlugin, captured: list[str]
) -> None:
    plugin = await make_plugin(hostile.endpoint, secrets=lookup)
    src = secret_source("h")
    await plugin.mount_device(request(plugin, "h", src=src))
    await plugin.set_up(request(plugin, "h", src=src, pod_uid="pod-a"))
    assert dict(hostile.requests("NodeStageVolume")[0].secrets) == SECRETS["ns/stage-creds"]
    assert dict(hostile.requests("NodePublishVolume")[0].secrets) == SECRETS["ns/publish-creds"]
    text = "\n".join(captured)
    assert STAGE_SECRET not in text and PUBLISH_SECRET not in text


async def test_without_a_lookup_no_secrets_are_sent_and_it_says_so_once(
    hostile: HostileDriver, make_plugin: MakePlugin, captured: list[str]
) -> None:
    plugin = await make_plugin(hostile.endpoint)
    src = secret_source("h")
    await plugin.mount_device(request(plugin, "h", src=src))
    await plugin.unmount_device(request(plugin, "h", src=src))
    await plugin.mount_device(request(plugin, "h", src=src))
    assert all(not r.secrets for r in hostile.requests("NodeStageVolume"))
    warnings = [line for line in captured if "secret ns/stage-creds is referenced" in line]
    assert len(warnings) == 1
    assert "reads no Kubernetes Secrets" in warnings[0]
    await plugin.unmount_device(request(plugin, "h", src=src))


async def test_a_failing_lookup_does_not_leak_and_calls_nothing(
    hostile: HostileDriver, make_plugin: MakePlugin, captured: list[str]
) -> None:
    def broken(ref: str) -> dict[str, str]:
        raise KeyError(f"{ref} has password {STAGE_SECRET}")

    plugin = await make_plugin(hostile.endpoint, secrets=broken)
    req = request(plugin, "h", src=secret_source("h"))
    with pytest.raises(PluginError) as err:
        await plugin.mount_device(req)
    assert err.value.code == "SecretUnavailable"
    assert err.value.error_class is ErrorClass.TRANSIENT
    assert STAGE_SECRET not in str(err.value) and STAGE_SECRET not in "\n".join(captured)
    assert hostile.requests("NodeStageVolume") == []
    await plugin.unmount_device(req)
