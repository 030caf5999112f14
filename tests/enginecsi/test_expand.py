"""Online expansion: the PV grows while a pod has the volume mounted; the filesystem follows."""

from __future__ import annotations

import os
from pathlib import Path

from events.streams import device_stream
from events.types import DesiredSizeChanged, VolumeResized
from tests.enginecsi.conftest import Stack
from tests.enginecsi.helpers import (
    assert_nothing_left,
    bodies,
    claimed_volume,
    delete_and_wait,
    eventually,
    only_loop,
    pod,
    pv,
    started,
    succeeded,
    volume_id,
)
from tests.helpers.csidriver import create_volume

MIB = 1 << 20


def fs_bytes(path: Path) -> int:
    """Size of the filesystem mounted at path, as a pod sees it."""
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


async def test_pv_growth_expands_the_mounted_filesystem(stack: Stack) -> None:
    drv, engine, log, layout = stack.driver, stack.engine, stack.log, stack.layout
    assert drv is not None
    create_volume(drv.clients(), "grow", 32 * MIB)
    await engine.apply([*claimed_volume("pv-grow", "grow", size="32Mi"), pod("pod-a", "pv-grow")])
    await engine.wait_pod("pod-a", "mounted", timeout=120)
    target = layout.csi_publish_path("pod-a", "pv-grow")
    before = fs_bytes(target)
    assert 16 * MIB < before <= 32 * MIB
    (target / "kept.txt").write_text("still here after the resize")

    result = await engine.apply([pv("pv-grow", "grow", size="96Mi")])
    assert [env.type for env in result.events] == ["DesiredSizeChanged", "ObjectApplied"]
    vid = volume_id("grow")
    await eventually(
        lambda: engine.asw.devices[vid].size_bytes == 96 * MIB, "the volume recorded as resized"
    )
    await engine.settle(timeout=60)

    after = fs_bytes(target)
    assert after > before + 48 * MIB and after <= 96 * MIB, (before, after)
    assert fs_bytes(layout.csi_staging_path("csi.volfsm.dev", "grow")) == after
    assert (target / "kept.txt").read_text() == "still here after the resize"
    assert drv.codes("NodeExpandVolume", "grow") == ["OK"]
    assert len(started(log, "volume_fs_resize")) == 1
    assert len(succeeded(log, "volume_fs_resize")) == 1
    assert [b.size_bytes for b in bodies(log, VolumeResized, device_stream(vid))] == [
        32 * MIB,
        96 * MIB,
    ]
    assert [b.size_bytes for b in bodies(log, DesiredSizeChanged)] == [96 * MIB]
    assert drv.image("grow").stat().st_size == 96 * MIB
    loop = only_loop(drv, "grow")
    assert int(Path(f"/sys/class/block/{os.path.basename(loop)}/size").read_text()) * 512 == (
        96 * MIB
    )

    await delete_and_wait(engine, ["pod-a"], ["grow"])
    assert_nothing_left(drv, layout, ["grow"])
