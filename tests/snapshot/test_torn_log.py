"""A log cut in the middle of a transaction opens at the last commit before the cut.

The log is SQLite in WAL mode: a commit appends frames to `<log>-wal`, the
last one marked as a commit frame, each checksummed over the ones before
it. A copy taken while a large append is being written, or a WAL cut by a
full disk or a crash, has a torn last transaction; SQLite's recovery reads
frames only up to the last intact commit frame. These tests build such
files from a real log (WAL cut at frame boundaries and mid-frame, a
flipped byte in the last transaction, copies taken during a live 60,000
event append) and check that each opens with exactly a committed prefix:
gap-free seqs, every stream's versions in order, a legal story, the
engine's fold working, and the next append continuing right after it.
"""

from __future__ import annotations

import shutil
import struct
import threading
import time
from pathlib import Path

import pytest

from events import log as log_module
from events.log import ANY_VERSION, EventLog
from events.streams import device_stream, pod_stream, podvol_stream
from events.types import (
    Body,
    DesiredVolume,
    DeviceAttached,
    DeviceMounted,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    VolumeMounted,
    VolumeSource,
)
from projections.validate import validate
from tests.events.helpers import assert_valid_log
from volfsm.engine.snapshot import fold_log

from .histories import StepClock, fresh_parts, state_view

WAL_HEADER = 32
FRAME_HEADER = 24
BIG = 3000
"""Operation pairs in the large append (6,000 events, one transaction)."""


def mounted_pod(log: EventLog, i: int) -> None:
    """The legal events of one pod whose volume gets mounted."""
    uid, vid = f"u{i}", f"v{i}"
    source = VolumeSource(plugin="kubernetes.io/csi", driver="torn.volfsm.io")
    vol = DesiredVolume(name="data", volume_id=vid, source=source)
    steps: list[tuple[str, list[Body]]] = [
        (pod_stream(uid), [PodAdded(pod_uid=uid, namespace="ns", name=uid, volumes=(vol,))]),
        (
            podvol_stream(uid, "data"),
            [OperationStarted(op_id=f"m{i}", operation="volume_mount", volume_id=vid)],
        ),
        (device_stream(vid), [DeviceAttached(volume_id=vid, plugin="csi")]),
        (device_stream(vid), [DeviceMounted(volume_id=vid, device_mount_path=f"/s/{vid}")]),
        (
            podvol_stream(uid, "data"),
            [
                VolumeMounted(volume_id=vid, pod_uid=uid, volume_name="data", mount_path="/m"),
                OperationSucceeded(op_id=f"m{i}", operation="volume_mount"),
            ],
        ),
    ]
    for stream, bodies in steps:
        log.append(stream, ANY_VERSION, bodies)


def big_bodies(tag: str, pairs: int = BIG) -> list[Body]:
    out: list[Body] = []
    for k in range(pairs):
        op = f"{tag}-{k}"
        out.append(OperationStarted(op_id=op, operation="noop", volume_id="big"))
        out.append(OperationSucceeded(op_id=op, operation="noop"))
    return out


def wal_frames(wal: bytes, start: int) -> tuple[int, list[tuple[int, bool]]]:
    """(page size, [(offset, is commit frame)]) of the frames from byte `start` on."""
    page_size = struct.unpack(">I", wal[8:12])[0]
    size = FRAME_HEADER + page_size
    frames = []
    offset = max(start, WAL_HEADER)
    while offset + size <= len(wal):
        commit = struct.unpack(">I", wal[offset + 4 : offset + 8])[0] != 0
        frames.append((offset, commit))
        offset += size
    return page_size, frames


def check_prefix(path: Path, expect_last: int) -> None:
    """The copy opens at `expect_last`, tells a legal story, folds, and appends after it."""
    with EventLog(path, readonly=True) as ro:
        assert ro.last_seq() == expect_last
    with EventLog(path, node="n1") as log:
        assert log.last_seq() == expect_last
        rows = assert_valid_log(path)
        assert len(rows) == expect_last
        report = validate(log.read_after(0))
        assert report.ok, str(report.violation)
        assert report.events == expect_last
        for stream in ("device/big", pod_stream("u0")):
            assert [e.version for e in log.read_stream(stream)] == list(
                range(1, log.stream_version(stream) + 1)
            )
        parts = fresh_parts()
        assert fold_log(log, *parts)[0] == expect_last
        view = state_view(parts)
        assert len(view["podvols"]) == 20
        env = log.append(
            "device/after", 0, [OperationStarted(op_id="x", operation="n", volume_id="a")]
        )
        assert env[0].seq == expect_last + 1
    assert_valid_log(path)


@pytest.fixture
def torn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, bytes, bytes, int, int]:
    """A log's main file and WAL right after a large append, and where that append starts.

    Returns (dir, main file bytes, WAL bytes, WAL offset before the append,
    last seq before the append).
    """
    path = tmp_path / "volfsm.db"
    with EventLog(path, node="n1", clock=StepClock()) as log:
        for i in range(20):
            mounted_pod(log, i)
        log.append("device/big", ANY_VERSION, big_bodies("a", 10))
    # Closed: everything checkpointed into the main file. Now one large append, copied
    # before anything else touches the WAL: the writer's idle index flush is held off, so
    # a slow test thread cannot let it commit between the append and the copy.
    monkeypatch.setattr(log_module, "_INDEX_IDLE_S", 3600.0)
    log = EventLog(path, node="n1", clock=StepClock())
    try:
        committed = log.last_seq()
        wal_path = Path(f"{path}-wal")
        before = wal_path.stat().st_size if wal_path.exists() else 0
        log.append("device/big", ANY_VERSION, big_bodies("b"))
        after = wal_path.stat().st_size
        main = path.read_bytes()
        wal = wal_path.read_bytes()[:after]
    finally:
        log.close()
    return tmp_path, main, wal, before, committed


def _copy(base: Path, name: str, main: bytes, wal: bytes) -> Path:
    d = base / name
    d.mkdir()
    p = d / "volfsm.db"
    p.write_bytes(main)
    Path(f"{p}-wal").write_bytes(wal)
    return p


def test_the_whole_wal_holds_the_large_append(torn: tuple[Path, bytes, bytes, int, int]) -> None:
    base, main, wal, before, committed = torn
    _, frames = wal_frames(wal, before)
    assert frames and frames[-1][1], "the large append ends in a commit frame"
    assert [c for _, c in frames].count(True) == 1
    check_prefix(_copy(base, "whole", main, wal), committed + 2 * BIG)


@pytest.mark.parametrize(
    "where", ["first-frame", "one-frame", "half", "before-commit", "mid-frame"]
)
def test_a_wal_cut_inside_the_last_transaction_opens_at_the_commit_before(
    torn: tuple[Path, bytes, bytes, int, int], where: str
) -> None:
    base, main, wal, before, committed = torn
    page_size, frames = wal_frames(wal, before)
    assert len(frames) > 4, "the large append spans several frames"
    assert [c for _, c in frames].count(True) == 1 and frames[-1][1]
    cut = {
        "first-frame": frames[0][0],
        "one-frame": frames[1][0],
        "half": frames[len(frames) // 2][0],
        "before-commit": frames[-1][0],
        "mid-frame": frames[-1][0] + FRAME_HEADER + page_size // 2,
    }[where]
    check_prefix(_copy(base, where, main, wal[:cut]), committed)


def test_a_damaged_frame_in_the_last_transaction_drops_that_transaction(
    torn: tuple[Path, bytes, bytes, int, int],
) -> None:
    base, main, wal, before, committed = torn
    _, frames = wal_frames(wal, before)
    damaged = bytearray(wal)
    damaged[frames[len(frames) // 2][0] + FRAME_HEADER + 100] ^= 0xFF  # page data: checksum fails
    check_prefix(_copy(base, "flipped", main, bytes(damaged)), committed)


def test_copies_taken_during_a_live_large_append_open_at_a_commit(tmp_path: Path) -> None:
    """Copy main file + WAL again and again while 60,000 events are being committed."""
    path = tmp_path / "volfsm.db"
    with EventLog(path, node="n1", clock=StepClock()) as log:
        for i in range(20):
            mounted_pod(log, i)
        log.append("device/big", ANY_VERSION, big_bodies("a", 10))
    log = EventLog(path, node="n1", clock=StepClock())
    committed = log.last_seq()
    done = threading.Event()

    def append() -> None:
        try:
            log.append("device/big", ANY_VERSION, big_bodies("live", 30_000))
        finally:
            done.set()

    copies: list[Path] = []
    writer = threading.Thread(target=append)
    writer.start()
    try:
        while (not done.is_set() or not copies) and len(copies) < 100:
            d = tmp_path / f"copy{len(copies)}"
            d.mkdir()
            wal = Path(f"{path}-wal")
            wal_bytes = wal.read_bytes() if wal.exists() else b""
            shutil.copyfile(path, d / "volfsm.db")
            Path(f"{d / 'volfsm.db'}-wal").write_bytes(wal_bytes)
            copies.append(d / "volfsm.db")
            time.sleep(0.005)
    finally:
        writer.join()
        log.close()
    for copy in copies:
        with EventLog(copy, readonly=True) as ro:
            last = ro.last_seq()
        assert last in (committed, committed + 60_000), f"{copy}: seq {last}"
        check_prefix(copy, last)
