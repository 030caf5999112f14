"""The root dir's lock and ownership mark: one volfsm per root dir, and never someone else's.

Two files in ``<root>/.volfsm/`` (a hidden dir that no pod or plugin path can
name and that reconstruction does not scan):

* ``root.lock``: an flock held by the running `volfsm serve` for its whole
  life, with the holder's pid, node name and data dir written in it, so a
  second service on the same root dir (even with a data dir of its own) is
  refused at once with a message naming the holder;
* ``owner.json``: the ownership mark, written by the first service that
  claims the root dir: the node name and the identity of its event log
  (`EventLog.log_id`), and, while the log cannot vouch for what is on the
  node, why (``until_complete``): until `volfsm apply --complete` the grace
  timer does not open the unmount gate, across restarts too.

`decide` applies the rules at start (unit-tested on its own):

* mark of this node and this log: normal (a pending ``until_complete`` stays);
* mark of this node, another log: the log was lost or replaced; the root
  is claimed for the new log with ``until_complete`` set (cleared by the
  service if `--restore-from-stream` puts the history back: ``restorable``);
* mark of another node, or a mark volfsm cannot read: refused, unless
  adopting;
* no mark, no pod dirs (and nothing volfsm never creates): a new or empty
  root, marked;
* no mark, pod dirs of which the log knows at least one: a node upgraded
  from a build without the mark: marked;
* no mark, pod dirs the log does not know, or other top-level entries (a
  kubelet's ``config.yaml``, ``plugins_registry/``, ...): foreign, refused
  unless adopting. Adopting marks it with ``until_complete`` set.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from volfsm.errors import VolfsmError
from volfsm.node.layout import PLUGINS, PODS

META_DIR = ".volfsm"
"""Hidden dir in the root dir holding the lock and the mark."""
LOCK_NAME = "root.lock"
MARK_NAME = "owner.json"
ADOPT_OPTION = "--adopt-root-dir"
MARK_FORMAT = "volfsm-root-dir"
_IGNORED_TOP = frozenset({PODS, PLUGINS, META_DIR, "lost+found"})
"""Top-level entries that say nothing about whose the root dir is."""
_SHOWN = 3
"""How many pod dirs or entries a message names."""
LOST_REPLACED = "replaced"
"""The mark names another log: the data dir was lost or replaced."""
LOST_ADOPTED = "adopted"
"""The root dir was adopted: nothing says its content is volfsm's."""
LOST_FOUND = "found"
"""Reconstruction found volumes the log does not know."""


class RootDirError(VolfsmError):
    """The root dir cannot be used by this service; nothing in it was changed."""


class RootDirLockedError(RootDirError):
    """Another volfsm serve holds the root dir."""


class ForeignRootDirError(RootDirError):
    """The root dir is not provably volfsm's (or is another node's)."""


# ------------------------------------------------------------------- the mark


@dataclass(frozen=True)
class RootMark:
    """The ownership mark: whose root dir this is."""

    node: str
    log_id: str
    data_dir: str
    until_complete: str = ""
    """Why only `volfsm apply --complete` may open the unmount gate ("" when the timer may)."""
    lost_kind: str = ""
    """What `until_complete` comes from: LOST_REPLACED, LOST_ADOPTED or LOST_FOUND."""
    written_us: int = 0

    def to_json(self) -> str:
        """The file's text."""
        return json.dumps({"format": MARK_FORMAT, **asdict(self)}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> RootMark:
        """Parse the file's text; ValueError if it is not a mark of this format."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != MARK_FORMAT:
            raise ValueError("not a volfsm root dir mark")
        node, log_id = data.get("node"), data.get("log_id")
        if not isinstance(node, str) or not isinstance(log_id, str) or not node:
            raise ValueError("node or log_id missing")
        return cls(
            node=node,
            log_id=log_id,
            data_dir=str(data.get("data_dir", "")),
            until_complete=str(data.get("until_complete", "")),
            lost_kind=str(data.get("lost_kind", "")),
            written_us=int(data.get("written_us", 0)),
        )


def short_id(log_id: str) -> str:
    """The first 8 characters of a log id, as messages show it."""
    return log_id[:8] or "(none)"


def _shown(names: list[str]) -> str:
    more = f", ... ({len(names)} in all)" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def _write_atomic(path: Path, text: str) -> None:
    """Replace `path` durably: a reader sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


# ---------------------------------------------------------------- what is there


@dataclass(frozen=True)
class RootContent:
    """What a root dir holds that tells whose it is (read without changing anything)."""

    path: Path
    mark: RootMark | None = None
    mark_problem: str = ""
    """Why a mark file is there but cannot be read ("" if none is, or it reads)."""
    pod_dirs: tuple[str, ...] = ()
    """Names under pods/ (pod uids)."""
    other: tuple[str, ...] = ()
    """Top-level entries that are not volfsm's (a kubelet's config.yaml, pki/, ...)."""


def _entries(path: Path) -> list[str]:
    try:
        with os.scandir(path) as it:
            return sorted(entry.name for entry in it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _read_mark(path: Path) -> tuple[RootMark | None, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, ""
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot be read ({exc})"
    try:
        return RootMark.from_json(text), ""
    except (ValueError, TypeError) as exc:
        return None, f"is not a volfsm mark ({exc})"


def inspect_root(root: Path, data_dir: Path | None = None) -> RootContent:
    """Read the mark, the pod dirs and the other top-level entries of `root` (missing: empty)."""
    mark, problem = _read_mark(root / META_DIR / MARK_NAME)
    skip = set(_IGNORED_TOP)
    if data_dir is not None and data_dir.parent == root:
        skip.add(data_dir.name)
    other = [name for name in _entries(root) if name not in skip]
    pods = root / PODS
    if pods.is_symlink() or (pods.exists() and not pods.is_dir()):
        other.append(PODS)
    return RootContent(
        path=root,
        mark=mark,
        mark_problem=problem,
        pod_dirs=tuple(_entries(pods)) if PODS not in other else (),
        other=tuple(sorted(other)),
    )


# ------------------------------------------------------------------ the rules


@dataclass(frozen=True)
class RootClaim:
    """What a start decided about its root dir."""

    mark: RootMark
    """The mark to keep in the root dir."""
    lost: str = ""
    """Why the log cannot vouch for the root dir's content ("" if it can)."""
    restorable: bool = False
    """`lost` comes from another log having written the mark: putting the history back from
    the stream into this (empty) log (`--restore-from-stream`) makes it whole again."""
    note: str = ""
    """What the service should log about the claim ("" if nothing)."""


def _advice() -> str:
    return (
        "sharing a root dir with a running kubelet (or another volfsm) destroys its pods' data. "
        "Give this service a root dir of its own (--root-dir), or, if nothing else uses this one "
        f"and its content is what volfsm left there, start once with {ADOPT_OPTION}: what is "
        "found there is then kept until `volfsm apply -f DIR --complete`"
    )


def _foreign(content: RootContent, why: str) -> ForeignRootDirError:
    return ForeignRootDirError(f"root dir {content.path} is not this volfsm's: {why}; {_advice()}")


def _adopted(mark: RootMark, why: str) -> RootClaim:
    lost = f"the root dir was adopted ({ADOPT_OPTION}): {why}"
    return RootClaim(
        mark=replace(mark, until_complete=lost, lost_kind=LOST_ADOPTED), lost=lost, note=lost
    )


def decide(
    content: RootContent,
    *,
    node: str,
    log_id: str,
    data_dir: Path,
    knows_pod: Callable[[str], bool],
    adopt: bool = False,
) -> RootClaim:
    """Whose `content` is and what to do: a `RootClaim`, or ForeignRootDirError.

    `knows_pod(uid)` says whether this node's log has events of that pod.
    """
    ours = RootMark(node=node, log_id=log_id, data_dir=str(data_dir))
    mark = content.mark
    if content.mark_problem:
        why = f"its ownership mark {META_DIR}/{MARK_NAME} {content.mark_problem}"
        if not adopt:
            raise _foreign(content, why)
        return _adopted(ours, why)
    if mark is not None:
        return _decide_marked(content, mark, ours, adopt)
    if content.other:
        why = f"it holds {_shown(list(content.other))}, which volfsm never creates, and no mark"
        if not adopt:
            raise _foreign(content, why)
        return _adopted(ours, why)
    if not content.pod_dirs:
        return RootClaim(mark=ours)
    known = [uid for uid in content.pod_dirs if knows_pod(uid)]
    if known:
        note = (
            f"root dir {content.path} had no ownership mark; this log knows its pods "
            f"{_shown(known)}: marked as node {node}'s"
        )
        return RootClaim(mark=ours, note=note)
    why = (
        f"it has {len(content.pod_dirs)} pod dirs ({_shown(list(content.pod_dirs))}) that this "
        "node's log does not know, and no mark"
    )
    if not adopt:
        raise _foreign(content, why)
    return _adopted(ours, why)


def _decide_marked(content: RootContent, mark: RootMark, ours: RootMark, adopt: bool) -> RootClaim:
    if mark.node != ours.node:
        why = (
            f"its mark says it is node {mark.node}'s (log {short_id(mark.log_id)}, data dir "
            f"{mark.data_dir or '?'}), not {ours.node}'s"
        )
        if not adopt:
            raise _foreign(content, why)
        return _adopted(ours, why)
    if mark.log_id == ours.log_id:
        pending = replace(ours, until_complete=mark.until_complete, lost_kind=mark.lost_kind)
        return RootClaim(
            mark=pending,
            lost=mark.until_complete,
            restorable=bool(mark.until_complete) and mark.lost_kind == LOST_REPLACED,
        )
    lost = (
        f"the log was lost or replaced: the root dir's mark names log {short_id(mark.log_id)} "
        f"(data dir {mark.data_dir or '?'}), this log is {short_id(ours.log_id)}"
    )
    kind = LOST_REPLACED
    if mark.until_complete and mark.lost_kind != LOST_REPLACED:
        lost, kind = f"{lost}; before that, {mark.until_complete}", mark.lost_kind
    return RootClaim(
        mark=replace(ours, until_complete=lost, lost_kind=kind),
        lost=lost,
        restorable=kind == LOST_REPLACED,
        note=lost,
    )


# -------------------------------------------------------------- lock and mark


@dataclass(frozen=True)
class Holder:
    """Who holds a root dir's lock."""

    pid: int | None
    node: str
    data_dir: str

    def describe(self) -> str:
        """'pid 123, node n1, data dir /var/lib/volfsm'."""
        pid = str(self.pid) if self.pid is not None else "unknown"
        return f"pid {pid}, node {self.node or '?'}, data dir {self.data_dir or '?'}"


def _holder_of(fd: int) -> Holder:
    raw = os.pread(fd, 4096, 0).decode(errors="replace")
    try:
        data: Any = json.loads(raw)
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    pid = data.get("pid")
    return Holder(
        pid=pid if isinstance(pid, int) else None,
        node=str(data.get("node", "")),
        data_dir=str(data.get("data_dir", "")),
    )


def _locked_error(root: Path, holder: Holder) -> RootDirLockedError:
    return RootDirLockedError(
        f"root dir {root} is in use by another volfsm serve ({holder.describe()}): one volfsm "
        "per root dir; stop that one first, or give this one another --root-dir"
    )


class RootDir:
    """This service's hold on its root dir: the lock, and the mark it keeps current."""

    def __init__(self, root: Path, *, node: str, data_dir: Path) -> None:
        self.root = root
        self.node = node
        self.data_dir = data_dir
        self.claim: RootClaim | None = None
        self._fd: int | None = None

    @property
    def lock_path(self) -> Path:
        """<root>/.volfsm/root.lock."""
        return self.root / META_DIR / LOCK_NAME

    @property
    def mark_path(self) -> Path:
        """<root>/.volfsm/owner.json."""
        return self.root / META_DIR / MARK_NAME

    def check_free(self) -> None:
        """RootDirLockedError if a running service holds the root dir. Creates nothing."""
        try:
            fd = os.open(self.lock_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise RootDirError(f"cannot open {self.lock_path}: {exc}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _locked_error(self.root, _holder_of(fd)) from None
        finally:
            os.close(fd)

    def claim_for(
        self, log_id: str, knows_pod: Callable[[str], bool], *, adopt: bool = False
    ) -> RootClaim:
        """Decide whose the root dir is, lock it and write the mark; RootDirError if refused.

        A foreign root dir is refused before anything is created in it; the
        decision is taken again under the lock, which holds until `release`.
        """

        def rule() -> RootClaim:
            try:
                content = inspect_root(self.root, self.data_dir)
            except OSError as exc:
                raise RootDirError(f"cannot read root dir {self.root}: {exc}") from None
            return decide(
                content,
                node=self.node,
                log_id=log_id,
                data_dir=self.data_dir,
                knows_pod=knows_pod,
                adopt=adopt,
            )

        self.check_free()
        rule()
        self._lock()
        try:
            claim = rule()
        except RootDirError:
            self.release()
            raise
        self.claim = claim
        self._write_mark(claim.mark)
        return claim

    def _lock(self) -> None:
        try:
            (self.root / META_DIR).mkdir(parents=True, exist_ok=True, mode=0o755)
            fd = os.open(
                self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644
            )
        except OSError as exc:
            raise RootDirError(f"cannot create {self.lock_path}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_of(fd)
            os.close(fd)
            raise _locked_error(self.root, holder) from None
        record = {"pid": os.getpid(), "node": self.node, "data_dir": str(self.data_dir)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd

    def _write_mark(self, mark: RootMark) -> None:
        mark = replace(mark, written_us=time.time_ns() // 1000)
        try:
            _write_atomic(self.mark_path, mark.to_json())
        except OSError as exc:
            raise RootDirError(f"cannot write {self.mark_path}: {exc}") from None
        if self.claim is not None:
            self.claim = replace(self.claim, mark=mark)

    def set_until_complete(self, reason: str, kind: str = LOST_FOUND) -> None:
        """Record (or, with "", clear) why only `apply --complete` opens the gate.

        A reason already recorded keeps its kind (it is what `reason` adds to).
        """
        claim = self.claim
        if claim is None or claim.mark.until_complete == reason:
            return
        kind = (claim.mark.lost_kind or kind) if reason else ""
        self._write_mark(replace(claim.mark, until_complete=reason, lost_kind=kind))

    def release(self) -> None:
        """Give up the lock (the files stay: the mark is the root dir's, not the process's)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
