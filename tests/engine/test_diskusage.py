"""The emptyDir disk usage walk (the kubelet's fs.DiskUsage) and the sizeLimit message."""

from __future__ import annotations

import os
from pathlib import Path

from volfsm.engine.volstats import quantity_text, size_limit_message
from volfsm.node.diskusage import disk_usage

MIB = 1 << 20


def _write(path: Path, size: int) -> None:
    with open(path, "wb") as out:
        out.write(b"\x5a" * size)
        out.flush()
        os.fsync(out.fileno())


def test_blocks_on_disk_hardlinks_once_symlinks_not_followed(tmp_path: Path) -> None:
    vol, outside = tmp_path / "vol", tmp_path / "outside"
    (vol / "sub").mkdir(parents=True)
    outside.mkdir()
    _write(vol / "sub" / "data", MIB)
    os.link(vol / "sub" / "data", vol / "again")  # the same blocks, counted once
    _write(outside / "big", 4 * MIB)
    os.symlink(outside / "big", vol / "link")  # the link itself, not what it points at
    (vol / "sparse").open("wb").truncate(64 * MIB)  # apparent size, no blocks

    found = disk_usage(str(vol), 10.0, 1000)

    expected = sum(
        os.lstat(p).st_blocks * 512
        for p in (vol, vol / "sub", vol / "sub" / "data", vol / "link", vol / "sparse")
    )
    assert found.complete and found.inodes_used == 5  # vol, sub, data (= again), link, sparse
    assert found.bytes_used == expected
    assert MIB <= found.bytes_used < 2 * MIB


def test_a_walk_past_its_entry_bound_says_it_is_incomplete(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"d{i}" / "f").write_bytes(b"x")
    found = disk_usage(str(tmp_path), 10.0, 3)
    assert not found.complete and found.inodes_used < 11
    assert disk_usage(str(tmp_path), 10.0, 100).inodes_used == 11


def test_the_kubelet_eviction_message() -> None:
    assert quantity_text(MIB) == "1Mi" and quantity_text(1536 * MIB) == "1536Mi"
    assert quantity_text(10**6) == "1M" and quantity_text(1_500_000) == "1500k"
    assert quantity_text(1_000_001) == "1000001"
    assert size_limit_message("cache", MIB) == (
        'Usage of EmptyDir volume "cache" exceeds the limit "1Mi".'
    )
