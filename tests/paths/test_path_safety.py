"""Path safety: unsafe names are refused, planted symlinks are never followed out of the root.

Every test that plants a link uses the `outside` fixture, which fails the
test if anything in the outside dir was created, modified or removed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from volfsm.node.dirsonly import remove_pod_dir
from volfsm.node.layout import (
    RootLayout,
    UnsafePathError,
    component_problem,
    safe_component,
)

ED = "kubernetes.io~empty-dir"
UNSAFE = ["", ".", "..", "../../etc", "/etc", "/", "a/b", "a\0b", "tab\there", "x" * 256]


@pytest.mark.parametrize("value", UNSAFE)
def test_safe_component_refuses_and_names_the_value_and_purpose(value: str) -> None:
    with pytest.raises(UnsafePathError) as info:
        safe_component(value, "pod UID")
    assert info.value.value == value
    assert info.value.purpose == "pod UID"
    assert repr(value) in str(info.value)
    assert "pod UID" in str(info.value)


@pytest.mark.parametrize("value", ["6f2c1d7e-0b7a", "cache", "a.b_c-d", "..hidden", "x" * 255])
def test_safe_component_accepts_ordinary_names(value: str) -> None:
    assert safe_component(value) == value
    assert component_problem(value) is None


def test_names_that_cannot_be_file_names_are_refused() -> None:
    with pytest.raises(UnsafePathError, match="encodable"):
        safe_component("\ud800")


@pytest.mark.parametrize("name", ["..", "kubernetes.io/..", "/abs", "a//b", "", "kubernetes.io/"])
def test_plugin_dir_refuses_unsafe_plugin_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnsafePathError):
        RootLayout(tmp_path).plugin_dir(name)


BUILDERS: dict[str, Callable[[RootLayout, str], Path]] = {
    "pod_dir uid": lambda lay, v: lay.pod_dir(v),
    "pod_volume_dir uid": lambda lay, v: lay.pod_volume_dir(v, ED, "vol"),
    "pod_volume_dir name": lambda lay, v: lay.pod_volume_dir("uid", ED, v),
    "pod_volume_dir plugin": lambda lay, v: lay.pod_volume_dir("uid", v, "vol"),
    "pod_volume_device_path name": lambda lay, v: lay.pod_volume_device_path("uid", ED, v),
    "pod_plugin_dir name": lambda lay, v: lay.pod_plugin_dir("uid", ED, v),
    "csi_publish_path uid": lambda lay, v: lay.csi_publish_path(v, "vol"),
    "csi_publish_path name": lambda lay, v: lay.csi_publish_path("uid", v),
    "csi_staging_path driver": lambda lay, v: lay.csi_staging_path(v, "handle"),
    "csi_block_global_map_path spec": lambda lay, v: lay.csi_block_global_map_path(v),
    "csi_block_publish_path uid": lambda lay, v: lay.csi_block_publish_path("pv", v),
    "csi_block_pod_device_path spec": lambda lay, v: lay.csi_block_pod_device_path("uid", v),
}


@pytest.mark.parametrize("builder", sorted(BUILDERS))
@pytest.mark.parametrize("value", ["..", "../../etc", "/etc/passwd", "a/b", "nul\0", ""])
def test_every_layout_path_refuses_unsafe_components(
    tmp_path: Path, builder: str, value: str
) -> None:
    lay = RootLayout(tmp_path)
    with pytest.raises(UnsafePathError):
        BUILDERS[builder](lay, value)


@pytest.mark.parametrize(
    "path",
    [
        "relative/path",
        "/etc",
        "{root}/../outside",
        "{root}/pods/../../x",
        "{root}x/pods",
        "{root}/./a",
    ],
)
def test_paths_outside_the_root_are_refused(layout: RootLayout, path: str) -> None:
    text = path.format(root=layout.root)
    with pytest.raises(UnsafePathError):
        layout.relative_parts(text)
    with pytest.raises(UnsafePathError):
        layout.ensure_dir(text)
    with pytest.raises(UnsafePathError):
        layout.remove_tree(text)


def test_the_root_itself_cannot_be_removed(layout: RootLayout) -> None:
    with pytest.raises(UnsafePathError):
        layout.remove_tree(layout.root)
    with pytest.raises(UnsafePathError):
        layout.remove_dir(layout.root)
    assert layout.root.is_dir()


# ----------------------------------------------------------- planted symlinks

LEVELS = ["pod", "volumes", "plugin", "volume"]


def plant(layout: RootLayout, level: str, outside: Path) -> Path:
    """Plant a symlink to the outside dir at one level of pods/u/volumes/<ED>/vol."""
    chain = {
        "pod": layout.pod_dir("u"),
        "volumes": layout.pod_volumes_dir("u"),
        "plugin": layout.pod_volumes_dir("u") / ED,
        "volume": layout.pod_volume_dir("u", ED, "vol"),
    }
    link = chain[level]
    link.parent.mkdir(parents=True, exist_ok=True)
    target = {"pod": outside, "volumes": outside / "volumes", "plugin": outside / ED}
    link.symlink_to(target.get(level, outside / "vol"))
    return link


@pytest.mark.parametrize("level", LEVELS)
def test_ensure_dir_refuses_a_planted_symlink_and_creates_nothing_outside(
    layout: RootLayout, outside: Path, level: str
) -> None:
    link = plant(layout, level, outside)
    volume = layout.pod_volume_dir("u", ED, "vol")
    for target in (volume, volume / "deeper" / "still"):
        with pytest.raises(UnsafePathError) as info:
            layout.ensure_dir(target)
        assert str(link) in str(info.value)
        assert "symlink" in str(info.value)
    assert link.is_symlink()


@pytest.mark.parametrize("level", LEVELS)
def test_resolve_open_and_pin_refuse_a_planted_symlink(
    layout: RootLayout, outside: Path, level: str
) -> None:
    plant(layout, level, outside)
    volume = layout.pod_volume_dir("u", ED, "vol")
    with pytest.raises(UnsafePathError):
        layout.resolve_inside(volume)
    with pytest.raises(UnsafePathError):
        layout.pin(volume).__enter__()
    with pytest.raises(UnsafePathError), layout.open_dir(volume):
        pass


def test_a_symlink_pointing_inside_the_root_is_not_followed_either(layout: RootLayout) -> None:
    real = layout.ensure_dir(layout.pod_volumes_dir("other"))
    layout.pods_dir.joinpath("u").symlink_to(real.parent)
    with pytest.raises(UnsafePathError):
        layout.ensure_dir(layout.pod_volume_dir("u", ED, "vol"))
    assert not (real / ED).exists()


def test_a_regular_file_in_the_way_is_refused(layout: RootLayout) -> None:
    layout.ensure_dir(layout.pods_dir)
    layout.pod_dir("u").write_text("not a dir")
    with pytest.raises(UnsafePathError, match="not a directory"):
        layout.ensure_dir(layout.pod_volume_dir("u", ED, "vol"))


@pytest.mark.parametrize("level", ["pod", "volumes", "plugin"])
def test_remove_tree_refuses_a_symlink_on_the_way(
    layout: RootLayout, outside: Path, level: str
) -> None:
    link = plant(layout, level, outside)
    with pytest.raises(UnsafePathError):
        layout.remove_tree(layout.pod_volume_dir("u", ED, "vol"))
    with pytest.raises(UnsafePathError):
        layout.remove_dir(layout.pod_volume_dir("u", ED, "vol"))
    assert link.is_symlink()


def test_remove_tree_and_remove_dir_remove_a_planted_final_symlink_as_a_link(
    layout: RootLayout, outside: Path
) -> None:
    volume = layout.pod_volume_dir("u", ED, "vol")
    link = plant(layout, "volume", outside)
    assert layout.remove_tree(volume) is True
    assert not os.path.lexists(link)
    plant(layout, "volume", outside)
    assert layout.remove_dir(volume) is True
    assert not os.path.lexists(link)


def test_remove_pod_dir_keeps_a_symlinked_pod_dir_and_follows_nothing(
    layout: RootLayout, outside: Path
) -> None:
    link = plant(layout, "pod", outside)
    result = remove_pod_dir(layout, "u")
    assert [(k.path, k.what) for k in result.kept] == [(link, "a symlink")]
    assert link.is_symlink()


@pytest.mark.parametrize("level", ["volumes", "plugin", "volume"])
def test_remove_pod_dir_keeps_a_link_left_under_volumes(
    layout: RootLayout, outside: Path, level: str
) -> None:
    link = plant(layout, level, outside)
    result = remove_pod_dir(layout, "u")
    assert [(k.path, k.what) for k in result.kept] == [(link, "a symlink")]
    assert link.is_symlink()


def test_remove_pod_dir_refuses_unsafe_uids(layout: RootLayout, outside: Path) -> None:
    for uid in ("..", "../outside", "/etc", ""):
        with pytest.raises(UnsafePathError):
            remove_pod_dir(layout, uid)
