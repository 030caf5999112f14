"""The atomic writer on real dirs: layout, modes, path checks, readers during updates, SIGKILL."""

from __future__ import annotations

import os
import random
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.paths.atomicchild import expected, payload
from volfsm.node import atomicwriter
from volfsm.node.atomicwriter import (
    DATA_DIR,
    DATA_DIR_TMP,
    TS_DIR_RE,
    AtomicWriteError,
    AtomicWriter,
    DirReaper,
    FileProjection,
    read_payload,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def vol(tmp_path: Path) -> Path:
    target = tmp_path / "vol"
    target.mkdir()
    return target


@pytest.fixture
def strict_umask() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def _ts_dirs(target: Path) -> list[str]:
    return sorted(n for n in os.listdir(target) if TS_DIR_RE.match(n))


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_first_write_layout_and_exact_modes(vol: Path, strict_umask: None) -> None:
    result = AtomicWriter(vol).write(
        {
            "plain": FileProjection(b"one"),
            "secret": FileProjection(b"two", mode=0o400),
            "a/b/c": FileProjection(b"three", mode=0o755),
        }
    )
    assert result.written
    assert TS_DIR_RE.match(result.data_dir)
    assert os.readlink(vol / DATA_DIR) == result.data_dir
    assert sorted(os.listdir(vol)) == sorted([DATA_DIR, result.data_dir, "a", "plain", "secret"])
    assert {n: os.readlink(vol / n) for n in ("a", "plain", "secret")} == {
        "a": "..data/a",
        "plain": "..data/plain",
        "secret": "..data/secret",
    }
    assert (vol / "a" / "b" / "c").read_bytes() == b"three"
    assert _mode(vol / result.data_dir) == 0o755
    assert [_mode(vol / n) for n in ("plain", "secret", "a/b/c")] == [0o644, 0o400, 0o755]
    assert not (vol / result.data_dir / "a").is_symlink()


def test_unchanged_payload_writes_nothing_but_restores_symlinks(vol: Path) -> None:
    writer = AtomicWriter(vol)
    first = writer.write({"k": FileProjection(b"v")})
    (vol / "k").unlink()
    again = writer.write({"k": FileProjection(b"v")})
    assert not again.written
    assert again.data_dir == first.data_dir
    assert (vol / "k").read_bytes() == b"v"


def test_update_swaps_and_removes_old_dir_and_gone_keys(vol: Path) -> None:
    writer = AtomicWriter(vol)
    first = writer.write({"keep": FileProjection(b"1"), "gone": FileProjection(b"x")})
    second = writer.write({"keep": FileProjection(b"2"), "new/deep": FileProjection(b"n")})
    assert second.written and second.removed_paths == ["gone"]
    assert _ts_dirs(vol) == [second.data_dir] != [first.data_dir]
    assert sorted(os.listdir(vol)) == sorted([DATA_DIR, second.data_dir, "keep", "new"])
    assert read_payload(vol) == {"keep": b"2", "new/deep": b"n"}


def test_a_mount_inside_an_old_dir_keeps_the_dir_and_its_data(vol: Path, tmp_path: Path) -> None:
    """Someone bound their data into the old payload dir: the swap never deletes through it."""
    writer = AtomicWriter(vol)
    first = writer.write({"keep": FileProjection(b"1")})
    data = tmp_path / "their-data"
    data.mkdir()
    (data / "precious").write_bytes(b"theirs")
    inside = vol / first.data_dir / "bound"
    inside.mkdir()
    subprocess.run(["mount", "--bind", str(data), str(inside)], check=True)
    try:
        second = writer.write({"keep": FileProjection(b"2")})
        assert second.kept == [first.data_dir]
        assert (inside / "precious").read_bytes() == b"theirs"
        third = writer.write({"keep": FileProjection(b"3")})  # the sweep keeps it too
        assert first.data_dir not in third.swept and (vol / first.data_dir).is_dir()
        assert read_payload(vol) == {"keep": b"3"}
    finally:
        subprocess.run(["umount", str(inside)], check=True)
    assert (data / "precious").read_bytes() == b"theirs"
    assert first.data_dir in writer.write({"keep": FileProjection(b"4")}).swept


def test_empty_payload_empties_the_volume(vol: Path) -> None:
    writer = AtomicWriter(vol)
    writer.write({"k": FileProjection(b"v")})
    result = writer.write({})
    assert result.written and result.removed_paths == ["k"]
    assert sorted(os.listdir(vol)) == sorted([DATA_DIR, result.data_dir])


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "..", "../escape", "a/../../escape", "a/..", "..hidden", "", "x" * 256],
)
def test_bad_paths_are_refused_and_nothing_is_written(vol: Path, path: str) -> None:
    writer = AtomicWriter(vol, context="pod ns/p volume v")
    writer.write({"ok": FileProjection(b"old")})
    before = sorted(os.listdir(vol))
    with pytest.raises(AtomicWriteError, match=r"^pod ns/p volume v: invalid path"):
        writer.write({"ok": FileProjection(b"new"), path: FileProjection(b"evil")})
    assert sorted(os.listdir(vol)) == before
    assert (vol / "ok").read_bytes() == b"old"
    assert not (vol.parent / "escape").exists()


def test_every_bad_path_and_mode_is_named_at_once(vol: Path) -> None:
    with pytest.raises(AtomicWriteError) as caught:
        AtomicWriter(vol).write(
            {"/abs": FileProjection(b""), "m": FileProjection(b"", mode=0o1777)}
        )
    assert "'/abs'" in str(caught.value) and "0o1777" in str(caught.value)
    assert os.listdir(vol) == []


def test_long_path_is_refused(vol: Path) -> None:
    with pytest.raises(AtomicWriteError, match="longer than 4096"):
        AtomicWriter(vol).write({"/".join(["d" * 200] * 21): FileProjection(b"")})


def test_a_regular_file_in_the_way_is_not_replaced(vol: Path) -> None:
    (vol / "k").write_bytes(b"not ours")
    with pytest.raises(AtomicWriteError, match="not a symlink"):
        AtomicWriter(vol).write({"k": FileProjection(b"v")})
    assert (vol / "k").read_bytes() == b"not ours"


@pytest.mark.parametrize("reaped", [False, True], ids=["inline", "reaper"])
def test_readers_never_see_a_partial_or_mixed_payload(vol: Path, reaped: bool) -> None:
    reaper = DirReaper() if reaped else None
    writer = AtomicWriter(vol, retire=reaper.retire if reaper is not None else None)
    writer.write(payload(1))
    stop = threading.Event()
    seen: dict[str, int] = {"file": 0, "set": 0, "enoent": 0}
    bad: list[str] = []
    whole = {expected(1)["a"], expected(2)["a"]}
    sets = [expected(1), expected(2)]

    def reader() -> None:
        while not stop.is_set():
            try:
                data = (vol / "a").read_bytes()
                if data not in whole:
                    bad.append(f"partial file of {len(data)} bytes")
                seen["file"] += 1
                if read_payload(vol) not in sets:
                    bad.append("a mixed set of files")
                seen["set"] += 1
            except FileNotFoundError:
                seen["enoent"] += 1  # the lookup raced the old dir's removal: retry

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for version in range(2, 60):
            writer.write(payload(version % 2 + 1))
    finally:
        stop.set()
        thread.join()
    assert bad == []
    assert seen["file"] > 0 and seen["set"] > 0
    assert reaper is None or reaper.wait_idle(30)
    assert len(_ts_dirs(vol)) == 1


def test_a_reaper_removes_replaced_and_stale_dirs_later_never_the_current_one(vol: Path) -> None:
    """With a reaper the write only hands old dirs over; the reaper removes them afterwards."""
    reaper = DirReaper()
    writer = AtomicWriter(vol, retire=reaper.retire)
    first = writer.write({"k": FileProjection(b"1")})
    stale = vol / "..2026_01_01_00_00_00.crashleft"  # a crash's leftover, of the writer's pattern
    stale.mkdir()
    (stale / "k").write_bytes(b"0")
    other = vol / "..not_the_writers"
    other.mkdir()
    second = writer.write({"k": FileProjection(b"2")})
    assert second.swept == [stale.name] and second.kept == []
    reaper.retire(vol / second.data_dir)  # never the dir ..data points at
    assert reaper.wait_idle(30)
    assert _ts_dirs(vol) == [second.data_dir] != [first.data_dir]
    assert other.is_dir() and read_payload(vol) == {"k": b"2"}
    assert reaper.removed == 2


def test_a_reaper_keeps_a_replaced_dir_with_a_mount_inside(vol: Path, tmp_path: Path) -> None:
    reaper = DirReaper()
    writer = AtomicWriter(vol, retire=reaper.retire)
    first = writer.write({"keep": FileProjection(b"1")})
    data = tmp_path / "their-data"
    data.mkdir()
    (data / "precious").write_bytes(b"theirs")
    inside = vol / first.data_dir / "bound"
    inside.mkdir()
    subprocess.run(["mount", "--bind", str(data), str(inside)], check=True)
    try:
        writer.write({"keep": FileProjection(b"2")})
        assert reaper.wait_idle(30)
        assert (inside / "precious").read_bytes() == b"theirs"
    finally:
        subprocess.run(["umount", str(inside)], check=True)
    assert (data / "precious").read_bytes() == b"theirs"
    writer.write({"keep": FileProjection(b"3")})  # its sweep hands the dir over again
    assert reaper.wait_idle(30)
    assert not (vol / first.data_dir).exists() and read_payload(vol) == {"keep": b"3"}


def test_a_reaper_keeps_a_dir_with_another_filesystem_mounted_after_mountinfo_was_read(
    vol: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mountinfo is read once per batch; a tmpfs mounted inside a retired dir after that read
    (here: a mountinfo that never shows it) is still seen, by its device, and kept."""
    monkeypatch.setattr(atomicwriter, "read_mountinfo", lambda: [])
    reaper = DirReaper()
    writer = AtomicWriter(vol, retire=reaper.retire)
    first = writer.write({"keep": FileProjection(b"1")})
    inside = vol / first.data_dir / "mounted"
    inside.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(inside)], check=True)
    try:
        (inside / "precious").write_bytes(b"theirs")
        writer.write({"keep": FileProjection(b"2")})
        assert reaper.wait_idle(30)
        assert (inside / "precious").read_bytes() == b"theirs"
        assert reaper.removed == 0
    finally:
        subprocess.run(["umount", str(inside)], check=True)


@pytest.mark.parametrize("kind", ["bind", "file-bind"])
def test_a_reaper_keeps_a_dir_with_a_same_filesystem_bind_mount_made_after_mountinfo_was_read(
    vol: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A bind mount from the same filesystem changes no device number; made after the batch's
    mountinfo read (here: a mountinfo that never shows it), it is still not crossed."""
    monkeypatch.setattr(atomicwriter, "read_mountinfo", lambda: [])
    monkeypatch.setattr(atomicwriter, "mounts_under", lambda *_: [])
    reaper = DirReaper()
    writer = AtomicWriter(vol, retire=reaper.retire)
    first = writer.write({"keep": FileProjection(b"1")})
    theirs = tmp_path / "their-data"
    theirs.mkdir()
    (theirs / "precious").write_bytes(b"theirs")
    source, inside = theirs, vol / first.data_dir / "bound"
    if kind == "file-bind":
        source, inside = theirs / "precious", vol / first.data_dir / "bound-file"
        inside.write_bytes(b"")
    else:
        inside.mkdir()
    assert os.stat(source).st_dev == os.stat(inside).st_dev
    subprocess.run(["mount", "--bind", str(source), str(inside)], check=True)
    try:
        writer.write({"keep": FileProjection(b"2")})
        assert reaper.wait_idle(30)
        assert reaper.removed == 0 and inside.exists()
    finally:
        subprocess.run(["umount", str(inside)], check=True)
    assert (theirs / "precious").read_bytes() == b"theirs"
    assert read_payload(vol) == {"keep": b"2"}


def _run_child(vol: Path, version: str, step: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.paths.atomicchild", str(vol), version, step], cwd=REPO
    )


def _assert_old_or_new_then_recovers(vol: Path, allowed: list[dict[str, bytes]]) -> None:
    state = read_payload(vol)
    assert state in allowed
    result = AtomicWriter(vol).write(payload(2))
    assert _ts_dirs(vol) == [result.data_dir]
    assert not os.path.lexists(vol / DATA_DIR_TMP)
    assert read_payload(vol) == expected(2)
    assert all((vol / path).read_bytes() == data for path, data in expected(2).items())


@pytest.mark.parametrize(
    ("step", "after"),
    [("files_written", 1), ("tmp_linked", 1), ("swapped", 2), ("done", 2)],
)
def test_sigkill_at_each_step_leaves_old_or_new(vol: Path, step: str, after: int) -> None:
    AtomicWriter(vol).write(payload(1))
    child = _run_child(vol, "2", step)
    assert child.wait(timeout=60) == -9
    assert read_payload(vol) == expected(after)
    if step == "files_written":
        assert len(_ts_dirs(vol)) == 2  # the new dir a crash left behind, swept next time
    _assert_old_or_new_then_recovers(vol, [expected(after)])


def test_sigkill_at_random_moments_of_a_write_loop(vol: Path) -> None:
    AtomicWriter(vol).write(payload(1))
    rng = random.Random(14)
    for _ in range(8):
        child = _run_child(vol, "loop", "-")
        time.sleep(rng.uniform(0.2, 0.5))
        child.kill()
        child.wait(timeout=60)
        assert read_payload(vol) in [expected(1), expected(2)]
    _assert_old_or_new_then_recovers(vol, [expected(1), expected(2)])
