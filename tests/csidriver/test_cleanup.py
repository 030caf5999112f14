"""The cleanup helpers undo what a test that failed halfway left behind."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.csidriver import (
    DriverProcess,
    cleanup_under,
    create_volume,
    leftovers_under,
    loops_of,
    publish_volume,
    stage_volume,
)


def test_cleanup_under_removes_mounts_loops_and_drivers(tmp_path: Path) -> None:
    work = tmp_path / "abandoned"
    work.mkdir()
    drv = DriverProcess(work)
    try:
        drv.start()
        csi = drv.clients()
        create_volume(csi, "left")
        stage, pods = work / "stage", work / "pod"
        stage.mkdir()
        pods.mkdir()
        stage_volume(csi, "left", str(stage))
        publish_volume(csi, "left", str(stage), str(pods / "mount"))
        # As if the test died here: driver running, volume staged and published.
        before = leftovers_under(work)
        assert len(before.mounts) == 2 and len(before.loops) == 1
        assert drv.proc is not None and before.pids == [drv.proc.pid]

        found = cleanup_under(work)
        assert found.mounts == before.mounts and found.loops == before.loops
        assert leftovers_under(work).empty
        assert not drv.alive() and loops_of(drv.image("left")) == []
    finally:
        drv.close()
        cleanup_under(work)
