"""mountinfo parsing and the mount helpers, against real mounts."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.paths.nodekit import Janitor
from volfsm.node import mounts
from volfsm.node.layout import RootLayout
from volfsm.node.mounts import MountError, parse_mountinfo, parse_mountinfo_line, split_options

# ------------------------------------------------------------------ parsing


def test_parses_the_proc5_example_with_an_optional_field() -> None:
    info = parse_mountinfo_line(
        "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue"
    )
    assert (info.mount_id, info.parent_id, info.major, info.minor) == (36, 35, 98, 0)
    assert info.root == "/mnt1"
    assert info.mount_point == "/mnt2"
    assert info.mount_options == ("rw", "noatime")
    assert info.optional_fields == ("master:1",)
    assert (info.fstype, info.source) == ("ext3", "/dev/root")
    assert info.super_options == ("rw", "errors=continue")
    assert info.super_option("errors") == "continue"
    assert info.super_option("rw") == ""
    assert info.super_option("size") is None
    assert not info.read_only


def test_parses_several_or_no_optional_fields() -> None:
    many = parse_mountinfo_line("1 0 0:5 / /a ro shared:5 master:3 propagate_from:2 - tmpfs t rw")
    assert many.optional_fields == ("shared:5", "master:3", "propagate_from:2")
    assert many.read_only
    none = parse_mountinfo_line("1 0 0:5 / /a rw - tmpfs t rw,size=8k")
    assert none.optional_fields == ()
    assert none.super_option("size") == "8k"


def test_decodes_octal_escapes_in_paths_and_source() -> None:
    info = parse_mountinfo_line(
        r"7 1 8:1 /r\040t /mnt/a\040b\011c\012d\134e rw - fuse.x my\040src rw"
    )
    assert info.root == "/r t"
    assert info.mount_point == "/mnt/a b\tc\nd\\e"
    assert info.fstype == "fuse.x"
    assert info.source == "my src"


def test_a_dash_inside_an_escaped_path_is_not_the_separator() -> None:
    info = parse_mountinfo_line(r"7 1 8:1 / /x\040-\040y rw - tmpfs none rw")
    assert info.mount_point == "/x - y"
    assert info.fstype == "tmpfs"


def test_non_utf8_names_round_trip_as_surrogates() -> None:
    info = parse_mountinfo_line(b"7 1 8:1 / /bad\xffname rw - tmpfs none rw")
    assert os.fsencode(info.mount_point) == b"/bad\xffname"


@pytest.mark.parametrize(
    "line", ["", "1 2 3", "1 0 0:5 / /a rw tmpfs t rw", "x 0 0:5 / /a rw - t s o"]
)
def test_malformed_lines_raise_value_error(line: str) -> None:
    with pytest.raises(ValueError):
        parse_mountinfo_line(line)


def test_parse_mountinfo_skips_blank_lines() -> None:
    text = "1 0 0:5 / /a rw - tmpfs t rw\n\n2 1 0:6 / /a/b rw - tmpfs u rw\n"
    assert [i.mount_point for i in parse_mountinfo(text)] == ["/a", "/a/b"]


def test_split_options_separates_flags_propagation_and_data() -> None:
    flags, propagation, data = split_options(["ro,nosuid", "size=1m", "private", "x-gvfs-hide"])
    assert flags == mounts.MS_RDONLY | mounts.MS_NOSUID
    assert propagation == mounts.MS_PRIVATE
    assert data == "size=1m"
    assert split_options(["ro", "rw"])[0] == 0
    with pytest.raises(MountError, match="loop"):
        split_options(["loop"])


# ------------------------------------------------------------- real mounts


def test_real_mount_at_a_path_with_space_tab_and_newline(tmp_path: Path, janitor: Janitor) -> None:
    target = tmp_path / "with space\tand tab\nand newline"
    target.mkdir()
    mounts.mount_tmpfs(target, 64 * 1024)
    found = mounts.find_mount(target)
    assert found is not None
    assert found.mount_point == os.fspath(target)
    assert (found.fstype, found.source) == ("tmpfs", "tmpfs")
    assert found.super_option("size") == "64k"
    assert mounts.is_mount_point(target)
    assert [i.mount_point for i in mounts.read_mountinfo()].count(os.fspath(target)) == 1
    assert mounts.umount(target) is True
    assert not mounts.is_mount_point(target)


def test_mounts_under_lists_deepest_first(tmp_path: Path, janitor: Janitor) -> None:
    top = tmp_path / "top"
    top.mkdir()
    mounts.mount_tmpfs(top, 1 << 20)
    (top / "inner").mkdir()
    mounts.mount_tmpfs(top / "inner", 1 << 20)
    (tmp_path / "top-sibling").mkdir()
    mounts.mount_tmpfs(tmp_path / "top-sibling", 1 << 20)
    under = [i.mount_point for i in mounts.mounts_under(top)]
    assert under == [os.fspath(top / "inner"), os.fspath(top)]
    for point in under:
        assert mounts.umount(point)
    assert mounts.mounts_under(top) == []


def test_stacked_mounts_report_the_top_one(tmp_path: Path, janitor: Janitor) -> None:
    target = tmp_path / "stack"
    target.mkdir()
    mounts.mount_tmpfs(target, 64 * 1024)
    mounts.mount_tmpfs(target, 128 * 1024)
    top = mounts.find_mount(target)
    assert top is not None and top.super_option("size") == "128k"
    assert mounts.umount(target) and mounts.umount(target)
    assert mounts.umount(target) is False


def test_mount_flags_and_data_reach_the_kernel(tmp_path: Path, janitor: Janitor) -> None:
    target = tmp_path / "flags"
    target.mkdir()
    mounts.mount("tmpfs", target, "tmpfs", ["nosuid,nodev,noexec", "size=32k,mode=0700", "private"])
    found = mounts.find_mount(target)
    assert found is not None
    assert {"nosuid", "nodev", "noexec"} <= set(found.mount_options)
    assert found.super_option("size") == "32k"
    assert found.super_option("mode") == "700"
    assert not any(f.startswith("shared:") for f in found.optional_fields)


def test_read_only_bind_mount_of_a_directory_and_of_a_file(
    tmp_path: Path, janitor: Janitor
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("data")
    dst = tmp_path / "dst"
    dst.mkdir()
    mounts.bind_mount(src, dst, read_only=True)
    found = mounts.find_mount(dst)
    assert found is not None and found.read_only
    assert (dst / "f").read_text() == "data"
    with pytest.raises(OSError) as info:
        (dst / "g").write_text("nope")
    assert info.value.errno == errno.EROFS
    file_dst = tmp_path / "file-dst"
    file_dst.write_text("")
    mounts.bind_mount(src / "f", file_dst)
    assert file_dst.read_text() == "data"
    assert mounts.umount(file_dst) and mounts.umount(dst)


def test_umount_is_idempotent_and_never_follows_a_symlink(tmp_path: Path, janitor: Janitor) -> None:
    target = tmp_path / "m"
    target.mkdir()
    assert mounts.umount(target) is False
    assert mounts.umount(tmp_path / "missing") is False
    mounts.mount_tmpfs(target)
    link = tmp_path / "link"
    link.symlink_to(target)
    assert mounts.umount(link) is False
    assert mounts.is_mount_point(target)
    assert mounts.umount(target) is True
    assert mounts.umount(target) is False


def test_busy_umount_fails_with_ebusy_and_lazy_detaches(tmp_path: Path, janitor: Janitor) -> None:
    target = tmp_path / "busy"
    target.mkdir()
    mounts.mount_tmpfs(target)
    fd = os.open(target / "open-file", os.O_CREAT | os.O_RDWR)
    try:
        with pytest.raises(MountError) as info:
            mounts.umount(target)
        assert info.value.code == "EBUSY"
        assert mounts.umount(target, lazy=True) is True
        assert not mounts.is_mount_point(target)
    finally:
        os.close(fd)


def test_mount_errors_carry_the_errno_name(tmp_path: Path, janitor: Janitor) -> None:
    with pytest.raises(MountError) as info:
        mounts.mount_tmpfs(tmp_path / "missing")
    assert info.value.code == "ENOENT"
    assert info.value.errno == errno.ENOENT
    (tmp_path / "d").mkdir()
    with pytest.raises(MountError) as bad:
        mounts.mount("tmpfs", tmp_path / "d", "no-such-fs-type")
    assert bad.value.code == "ENODEV"
    with pytest.raises(MountError, match="needs mount"):
        mounts.mount("/x.img", tmp_path / "d", "ext4", ["loop"])


async def test_async_variants_run_the_same_helpers(tmp_path: Path, janitor: Janitor) -> None:
    target = tmp_path / "async"
    target.mkdir()
    await mounts.mount_tmpfs_async(target, 64 * 1024)
    assert await mounts.is_mount_point_async(target)
    found = await mounts.find_mount_async(target)
    assert found is not None and found.fstype == "tmpfs"
    assert [i.mount_point for i in await mounts.mounts_under_async(tmp_path)] == [os.fspath(target)]
    assert any(i.mount_point == os.fspath(target) for i in await mounts.read_mountinfo_async())
    other = tmp_path / "async-bind"
    other.mkdir()
    await mounts.bind_mount_async(target, other, read_only=True)
    await mounts.mount_async("tmpfs", other, "tmpfs", ["size=16k"])
    assert await mounts.umount_async(other) and await mounts.umount_async(other)
    assert await mounts.umount_async(target) is True
    assert await mounts.umount_async(target) is False


def test_mounting_onto_a_pinned_target_including_follow_up_calls(
    tmp_path: Path, janitor: Janitor
) -> None:
    layout = RootLayout(tmp_path / "root")
    target = layout.ensure_dir(layout.pod_volume_dir("u", "p", "v"))
    src = tmp_path / "src"
    src.mkdir()
    with layout.pin(target) as pinned:
        assert pinned.startswith("/proc/self/fd/")
        mounts.bind_mount(src, pinned, read_only=True)
    found = mounts.find_mount(target)
    assert found is not None and found.mount_point == os.fspath(target) and found.read_only
    assert mounts.umount(target)
    with layout.pin(target) as pinned:
        mounts.mount("tmpfs", pinned, "tmpfs", ["size=16k", "private"])
    found = mounts.find_mount(target)
    assert found is not None and found.super_option("size") == "16k"
    assert not any(f.startswith("shared:") for f in found.optional_fields)


def test_errors_on_a_pinned_target_name_the_real_path(tmp_path: Path, janitor: Janitor) -> None:
    layout = RootLayout(tmp_path / "root")
    target = layout.ensure_dir(layout.pod_volume_dir("u", "p", "v"))
    with pytest.raises(MountError) as info, layout.pin(target) as pinned:
        mounts.mount("tmpfs", pinned, "no-such-fs-type")
    assert info.value.target == os.fspath(target)
