"""Whose root dir is it: the start rules (`volfsm.node.rootdir.decide`), the lock and the mark.

Pure decisions on `RootContent` first, then `RootDir` on real directories:
a second holder is refused naming the first, a foreign root dir is refused
before anything is created in it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from volfsm.node.rootdir import (
    LOST_ADOPTED,
    LOST_FOUND,
    LOST_REPLACED,
    META_DIR,
    ForeignRootDirError,
    RootClaim,
    RootContent,
    RootDir,
    RootDirLockedError,
    RootMark,
    decide,
    inspect_root,
)

ROOT = Path("/srv/root")
DATA = Path("/srv/data")
OURS = RootMark(node="n1", log_id="log-b", data_dir=str(DATA))


def knows(*uids: str) -> Callable[[str], bool]:
    known = set(uids)
    return lambda uid: uid in known


def claim(content: RootContent, *, known: Iterable[str] = (), adopt: bool = False) -> RootClaim:
    return decide(
        content,
        node="n1",
        log_id="log-b",
        data_dir=DATA,
        knows_pod=knows(*known),
        adopt=adopt,
    )


def test_an_empty_or_new_root_dir_is_marked_and_used() -> None:
    result = claim(RootContent(ROOT))
    assert result.mark == OURS and result.lost == ""


def test_its_own_mark_is_normal_and_a_pending_hold_stays() -> None:
    result = claim(RootContent(ROOT, mark=OURS, pod_dirs=("u1",)))
    assert result.lost == ""
    pending = RootMark("n1", "log-b", str(DATA), until_complete="earlier", lost_kind=LOST_FOUND)
    result = claim(RootContent(ROOT, mark=pending, pod_dirs=("u1",)))
    assert result.lost == "earlier" and not result.restorable


def test_a_mark_naming_another_log_is_a_lost_log_that_a_restore_can_mend() -> None:
    theirs = RootMark(node="n1", log_id="log-a-1234567", data_dir="/old")
    result = claim(RootContent(ROOT, mark=theirs, pod_dirs=("u1",)))
    assert result.lost.startswith(
        "the log was lost or replaced: the root dir's mark names log log-a-12 (data dir /old),"
        " this log is log-b"
    )
    assert result.restorable
    assert result.mark.until_complete == result.lost
    assert result.mark.lost_kind == LOST_REPLACED


def test_a_lost_log_of_an_adopted_root_stays_unrestorable() -> None:
    theirs = RootMark("n1", "log-a", "/old", until_complete="adopted it", lost_kind=LOST_ADOPTED)
    result = claim(RootContent(ROOT, mark=theirs, pod_dirs=("u1",)))
    assert "before that, adopted it" in result.lost
    assert not result.restorable


def test_another_nodes_mark_is_refused_unless_adopted() -> None:
    theirs = RootMark(node="n2", log_id="log-x", data_dir="/x")
    with pytest.raises(ForeignRootDirError, match="its mark says it is node n2's"):
        claim(RootContent(ROOT, mark=theirs))
    result = claim(RootContent(ROOT, mark=theirs), adopt=True)
    assert result.lost.startswith("the root dir was adopted (--adopt-root-dir)")
    assert result.mark.lost_kind == LOST_ADOPTED


def test_pods_the_log_knows_without_a_mark_are_an_upgrade() -> None:
    result = claim(RootContent(ROOT, pod_dirs=("u1", "u9")), known=["u1"])
    assert result.lost == "" and result.mark == OURS
    assert "this log knows its pods u1: marked as node n1's" in result.note


def test_pods_the_log_does_not_know_without_a_mark_are_foreign() -> None:
    content = RootContent(ROOT, pod_dirs=("a", "b", "c", "d"))
    with pytest.raises(ForeignRootDirError) as err:
        claim(content, known=["zz"])
    text = str(err.value)
    assert text.startswith(f"root dir {ROOT} is not this volfsm's: it has 4 pod dirs (a, b, c, ...")
    assert "kubelet" in text and "--adopt-root-dir" in text and "\n" not in text
    result = claim(content, adopt=True)
    assert result.lost and result.mark.until_complete == result.lost


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (RootContent(ROOT, other=("config.yaml", "pki")), "it holds config.yaml, pki"),
        (RootContent(ROOT, mark_problem="is not a volfsm mark (x)"), "is not a volfsm mark"),
    ],
    ids=["kubelet-files", "unreadable-mark"],
)
def test_other_signs_of_a_foreign_root_are_refused(content: RootContent, why: str) -> None:
    with pytest.raises(ForeignRootDirError, match=why):
        claim(content)
    assert claim(content, adopt=True).lost


# ------------------------------------------------------------ on real directories


def test_inspect_sees_pods_other_entries_and_skips_its_own(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "pods" / "u1").mkdir(parents=True)
    (root / "plugins").mkdir()
    (root / META_DIR).mkdir()
    (root / "plugins_registry").mkdir()
    data = root / "data"
    data.mkdir()
    content = inspect_root(root, data)
    assert content.pod_dirs == ("u1",) and content.other == ("plugins_registry",)
    assert content.mark is None and inspect_root(tmp_path / "missing").pod_dirs == ()


def test_a_second_holder_is_refused_naming_the_first_and_free_once_released(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    first = RootDir(root, node="n1", data_dir=tmp_path / "d1")
    first.claim_for("log-1", lambda _uid: False)
    second = RootDir(root, node="n2", data_dir=tmp_path / "d2")
    try:
        with pytest.raises(RootDirLockedError) as err:
            second.check_free()
        expected = f"(pid {os.getpid()}, node n1, data dir {tmp_path / 'd1'})"
        assert f"root dir {root} is in use by another volfsm serve {expected}" in str(err.value)
        with pytest.raises(RootDirLockedError):
            second.claim_for("log-2", lambda _uid: False)
        assert RootMark.from_json(first.mark_path.read_text()).log_id == "log-1"
    finally:
        first.release()
    second.check_free()


def test_a_foreign_root_is_refused_before_anything_is_created_in_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "pods" / "someone").mkdir(parents=True)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with pytest.raises(ForeignRootDirError):
        RootDir(root, node="n1", data_dir=tmp_path / "d").claim_for("log-1", lambda _u: False)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_the_mark_keeps_and_clears_the_hold(tmp_path: Path) -> None:
    held = RootDir(tmp_path / "root", node="n1", data_dir=tmp_path / "d")
    try:
        held.claim_for("log-1", lambda _uid: False)
        held.set_until_complete("found 2 volumes")
        mark = RootMark.from_json(held.mark_path.read_text())
        assert (mark.until_complete, mark.lost_kind) == ("found 2 volumes", LOST_FOUND)
        held.set_until_complete("")
        mark = RootMark.from_json(held.mark_path.read_text())
        assert (mark.until_complete, mark.lost_kind, mark.log_id) == ("", "", "log-1")
    finally:
        held.release()
