"""The engine's side of the contract: the VolumeRequest it builds for the CSI plugin.

The plugin names a volume's directories by `spec_name` (the PV name, or
the pod's volume name for an inline volume, as kubelet's spec.Name()) and
must know inline volumes (`ephemeral`: never staged). This checks that
`OperationGenerator._request` fills both, for pod- and device-level calls.
"""

from __future__ import annotations

from typing import Any, cast

from events.types import DesiredVolume
from projections.asw import Asw
from tests.csiplugin.helpers import source
from volfsm.engine.operations import OperationGenerator
from volfsm.node.layout import RootLayout
from volfsm.plugins.base import BLOCK
from volfsm.plugins.csi.plugin import CsiPlugin


def generator(layout: RootLayout) -> OperationGenerator:
    unused = cast(Any, None)  # _request needs only the layout and the ASW
    return OperationGenerator(
        handler=unused,
        asw=Asw(),
        sizes=unused,
        holders=unused,
        plugins=unused,
        layout=layout,
        executor=unused,
        wait_for_attach_timeout=1.0,
    )


def test_requests_carry_the_spec_name_and_the_lifecycle(layout: RootLayout) -> None:
    plugin = CsiPlugin("csi.volfsm.dev", "unix:///tmp/unused.sock", layout)
    gen = generator(layout)
    root = layout.root
    pv = DesiredVolume(
        name="data",
        volume_id="kubernetes.io/csi/csi.volfsm.dev^h1",
        source=source("h1"),
        pv_name="pv-one",
    )
    pod_req = gen._request(pv, plugin, "pod-a")
    dev_req = gen._request(pv, plugin)
    assert (pod_req.spec_name, pod_req.ephemeral) == ("pv-one", False)
    assert (dev_req.spec_name, dev_req.ephemeral) == ("pv-one", False)
    assert pod_req.mount_path == root / "pods/pod-a/volumes/kubernetes.io~csi/pv-one/mount"

    inline = DesiredVolume(
        name="scratch", volume_id="kubernetes.io/csi/csi.volfsm.dev^inline", source=source("csi-x")
    )
    inline_req = gen._request(inline, plugin, "pod-a")
    assert (inline_req.spec_name, inline_req.ephemeral) == ("scratch", True)
    assert inline_req.device_mount_path is None

    block = DesiredVolume(
        name="raw",
        volume_id="kubernetes.io/csi/csi.volfsm.dev^h2",
        source=source("h2"),
        pv_name="pv-raw",
        volume_mode=BLOCK,
    )
    for req in (gen._request(block, plugin, "pod-a"), gen._request(block, plugin)):
        assert req.spec_name == "pv-raw"
        assert req.device_mount_path == (
            root / "plugins/kubernetes.io/csi/volumeDevices/pv-raw/dev"
        )
