"""Fixtures for layout, mount and block-map tests (real dirs, real mounts; we are root)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.paths.nodekit import Janitor, build_outside, snapshot
from volfsm.node.layout import RootLayout


@pytest.fixture
def janitor(tmp_path: Path) -> Iterator[Janitor]:
    """Cleans every mount and loop device under tmp_path, even when the test fails."""
    keeper = Janitor(tmp_path)
    try:
        yield keeper
    finally:
        keeper.cleanup()


@pytest.fixture
def layout(tmp_path: Path, janitor: Janitor) -> RootLayout:
    """A root dir under tmp_path (created)."""
    root = tmp_path / "root"
    root.mkdir()
    return RootLayout(root)


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A dir outside the root with precious files; asserts it is unchanged at the end."""
    top = build_outside(tmp_path / "outside")
    before = snapshot(top)
    yield top
    assert snapshot(top) == before, "something outside the root was touched"
