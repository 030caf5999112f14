"""The directories and `vol_data.json` files the caller of a CSI driver creates and removes.

Everything goes through `RootLayout`, so a symlink planted between the root
and a path is refused and nothing outside the root is written or removed.
Removal never touches a mount point: a path that is (or holds) a mount is
left alone and reported. `read_json` reads a `vol_data.json` back (for
reconstruction, `volfsm.plugins.csi.construct`): the CSI plugin is the only
code that writes or reads these files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from loguru import logger

from volfsm.errors import VolfsmError
from volfsm.node.layout import PathInUseError, RootLayout
from volfsm.node.mounts import mounts_under

FILE_MODE = 0o640
JSON_MAX_BYTES = 64 << 10
"""The most a vol_data.json may hold when read back (the plugin writes a few hundred bytes)."""


class CleanupError(VolfsmError):
    """A path the caller must remove could not be removed (mounted, not empty, unsafe)."""


def write_json(layout: RootLayout, path: Path, data: Mapping[str, str]) -> None:
    """Write `data` to `path` atomically (temp file + rename), creating its directory."""
    layout.ensure_dir(path.parent)
    tmp_name = f".{path.name}.tmp"
    with layout.pin(path.parent) as parent:
        tmp = os.path.join(parent, tmp_name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
        with os.fdopen(fd, "w") as fh:
            json.dump(dict(data), fh, sort_keys=True)
        os.replace(tmp, os.path.join(parent, path.name))


def read_json(layout: RootLayout, path: Path) -> dict[str, str] | str:
    """The JSON object of strings in `path` (opened without following links), or why not."""
    try:
        with layout.open_dir(path.parent) as fd:
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            handle = os.open(path.name, flags, dir_fd=fd)
            with os.fdopen(handle, "rb") as fh:
                raw = fh.read(JSON_MAX_BYTES + 1)
    except FileNotFoundError:
        return f"{path} is missing"
    except (OSError, VolfsmError) as exc:
        return f"{path} cannot be read: {exc}"
    if len(raw) > JSON_MAX_BYTES:
        return f"{path} is larger than {JSON_MAX_BYTES} bytes"
    try:
        data = json.loads(raw)
    except ValueError as exc:
        return f"{path} is not valid JSON ({exc})"
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        return f"{path} is not a JSON object of strings"
    return data


def remove_file(layout: RootLayout, path: Path) -> None:
    """Unlink a file (a symlink is removed as a link). Missing is fine."""
    try:
        with layout.pin(path.parent) as parent:
            os.unlink(os.path.join(parent, path.name))
    except FileNotFoundError:
        pass
    except IsADirectoryError as exc:
        raise CleanupError(f"{path} is a directory, expected a file") from exc


def remove_dir(layout: RootLayout, path: Path) -> None:
    """Remove `path` if it is an empty directory (or unlink it if it is a file or link).

    Raises CleanupError if it is or holds a mount point or is not empty:
    what is there may be data (kubelet's os.Remove fails the same way).
    """
    try:
        layout.remove_dir(path)
    except FileNotFoundError:
        pass
    except PathInUseError as exc:
        raise CleanupError(str(exc)) from exc


def remove_tree(layout: RootLayout, path: Path) -> None:
    """Remove `path` and everything under it, refusing if a mount is at or under it."""
    try:
        layout.remove_tree(path)
    except PathInUseError as exc:
        raise CleanupError(str(exc)) from exc


def mounted_at_or_under(path: Path) -> list[str]:
    """Mount points at or under `path`."""
    return [info.mount_point for info in mounts_under(path)]


def remove_all(
    layout: RootLayout,
    files: tuple[Path, ...],
    dirs: tuple[Path, ...],
    trees: tuple[Path, ...] = (),
) -> None:
    """Remove files, then directories (in the order given), then trees; CleanupError on the first
    that cannot go. Nothing is removed while any of the directories or trees holds a mount."""
    for path in (*dirs, *trees):
        mounted = mounted_at_or_under(path)
        if mounted:
            raise CleanupError(f"{path} is or holds a mount point: {', '.join(mounted)}")
    try:
        for path in files:
            remove_file(layout, path)
        for path in dirs:
            remove_dir(layout, path)
        for path in trees:
            remove_tree(layout, path)
    except CleanupError:
        raise
    except (VolfsmError, OSError) as exc:
        raise CleanupError(str(exc)) from exc


def remove_after_failure(
    layout: RootLayout,
    files: tuple[Path, ...],
    dirs: tuple[Path, ...],
    trees: tuple[Path, ...] = (),
) -> None:
    """`remove_all` after a final error: what cannot be removed is logged, not raised."""
    try:
        remove_all(layout, files, dirs, trees)
    except CleanupError as exc:
        logger.warning("after a final CSI error, left in place: {}", exc)
