"""The kubelet's AtomicWriter: a set of files swapped in as one step.

Layout of a volume dir written by it (kubelet reference §1.2)::

    <dir>/..data  -> ..2026_12_01_22_59_26.1234abcd   (relative symlink)
    <dir>/..2026_12_01_22_59_26.1234abcd/             the files, dir mode 0755
    <dir>/<top>   -> ..data/<top>                      one symlink per first path segment

`AtomicWriter.write` follows the kubelet's `Write` step by step: check every
path first (nothing is written if one is bad); compare the payload with
what ``..data`` points at and write nothing when no byte changed and no
path went away; else write the files into a new timestamped dir, set their
modes exactly (umask ignored), run `set_perms` (fsGroup) on the volume,
point ``..data_tmp`` at the new dir and rename it onto ``..data`` - the one
atomic step - then add missing top-level symlinks, remove the top-level
symlinks of paths that went away and the old dir.

A reader opening ``<dir>/<key>`` gets either the whole old or the whole new
file; a reader that resolves ``<dir>/..data`` once and reads every key in
that timestamped dir sees one consistent set if ``..data`` still points
there afterwards (`read_payload`). A path lookup racing the old dir's
removal may fail with ENOENT, as with the kubelet: retry.

Where volfsm departs from the kubelet, for crash safety (SIGKILL at any
step must leave the old or the new content and nothing that grows):

* a ``..data_tmp`` left by a crash between the symlink and the rename is
  removed before a new one is made (the kubelet's symlink call would fail
  on it);
* timestamped dirs ``..data`` does not point at - left by a crash after the
  new dir was made and before the old one was removed - are removed by the
  next write (`sweep`). Only names of the writer's own pattern inside the
  volume dir are touched.

A writer given a `DirReaper` (`retire`) hands the old dir, and the stale
ones its sweep finds, to the reaper's thread instead of removing them
itself: the swap is what readers wait for, and removing a directory can
cost milliseconds (ext4 with online ``discard`` frees its block at once).
The reaper removes them in the background, reading ``/proc/self/mountinfo``
once per batch; what it has not removed when the process dies is a stale
dir the next write sweeps, as after a crash.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger

from volfsm.node.layout import PathInUseError, remove_own_tree
from volfsm.node.mounts import MountInfo, mounts_under, read_mountinfo

DATA_DIR = "..data"
DATA_DIR_TMP = "..data_tmp"
DEFAULT_FILE_MODE = 0o644
TS_DIR_MODE = 0o755
MAX_PATH_BYTES = 4096
MAX_ELEMENT_BYTES = 255

TS_DIR_RE = re.compile(r"^\.\.\d{4}_\d{2}_\d{2}_\d{2}_\d{2}_\d{2}\.[0-9A-Za-z_]+$")
"""A timestamped dir's name: ``..`` + UTC ``YYYY_MM_DD_HH_MM_SS`` + ``.`` + a random suffix."""

Step = Callable[[str], None]
"""Told each step's name as it is reached ("files_written", "swapped", ...); tests kill there."""

Retire = Callable[[Path], None]
"""Takes a timestamped dir ``..data`` no longer points at, to remove it later (`DirReaper`)."""

MOUNTINFO_MAX_AGE_S = 0.02
"""The reaper reads mountinfo again when its copy is older than this."""

REAP_QUIET_S = 0.05
"""The reaper starts a batch once no dir was retired for this long (a burst of rewrites
is not slowed by removals competing for the disk and the CPU) ..."""

REAP_MAX_DELAY_S = 1.0
"""... or once the oldest queued dir has waited this long (a node that never goes quiet)."""

log = logger.bind(logger_name="volfsm.node.atomicwriter")


class AtomicWriteError(Exception):
    """A write could not be done; the message names the volume and never a file's content."""


@dataclass(frozen=True)
class FileProjection:
    """One file of a payload: its bytes, its mode, and its owner uid if not root."""

    data: bytes
    mode: int = DEFAULT_FILE_MODE
    fs_user: int | None = None


@dataclass
class WriteResult:
    """What one `write` did."""

    written: bool
    """False when nothing changed and the old dir was kept."""
    data_dir: str
    """The timestamped dir ``..data`` now points at."""
    removed_paths: list[str] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)
    """Stale timestamped dirs (left by a crash) removed on the way (or handed to the reaper)."""
    kept: list[str] = field(default_factory=list)
    """The old timestamped dir, when something is mounted in it: kept, not removed.
    Always empty with a reaper: the reaper checks for mounts and logs what it keeps."""


def check_path(path: str) -> str:
    """The cleaned form of a payload path; `AtomicWriteError` if the kubelet refuses it.

    Rules (ValidateLocalNonReservedPath and the writer's validatePath):
    not empty, not absolute, no ``..`` element, not starting with ``..``,
    each element at most 255 bytes and the path at most 4096.
    """
    if not path:
        raise AtomicWriteError("invalid path: must not be empty")
    if path.startswith("/"):
        raise AtomicWriteError(f"invalid path {path!r}: must be relative")
    if path.startswith(".."):
        raise AtomicWriteError(f"invalid path {path!r}: must not start with '..'")
    if len(path.encode()) > MAX_PATH_BYTES:
        raise AtomicWriteError(f"invalid path {path[:64]!r}...: longer than {MAX_PATH_BYTES} bytes")
    elements = path.split("/")
    if ".." in elements:
        raise AtomicWriteError(f"invalid path {path!r}: must not contain '..'")
    for element in elements:
        if len(element.encode()) > MAX_ELEMENT_BYTES:
            raise AtomicWriteError(
                f"invalid path {path!r}: element longer than {MAX_ELEMENT_BYTES} bytes"
            )
    cleaned = os.path.normpath(path)
    if cleaned in (".", "") or cleaned.startswith(".."):
        raise AtomicWriteError(f"invalid path {path!r}: names no file")
    return cleaned


def check_payload(payload: Mapping[str, FileProjection]) -> dict[str, FileProjection]:
    """The payload with cleaned paths; `AtomicWriteError` naming every bad path or mode."""
    cleaned: dict[str, FileProjection] = {}
    problems: list[str] = []
    for path, projection in payload.items():
        try:
            cleaned[check_path(path)] = projection
        except AtomicWriteError as exc:
            problems.append(str(exc))
            continue
        if not 0 <= projection.mode <= 0o777:
            problems.append(f"invalid mode {projection.mode:#o} for {path!r}: must be 0-0777")
    if problems:
        raise AtomicWriteError("; ".join(problems))
    return cleaned


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _old_paths(old_dir: Path) -> set[str]:
    """Every file and dir below `old_dir`, relative to it."""
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(old_dir):
        rel = os.path.relpath(dirpath, old_dir)
        for name in (*dirnames, *filenames):
            found.add(name if rel == "." else f"{rel}/{name}")
    return found


def _same_bytes(path: Path, data: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(data) + 1) == data
    except OSError:
        return False


def _remove_own_dir(path: Path) -> bool:
    """Remove a timestamped dir this writer made; kept (False) if a mount is at or under it.

    Such a dir holds only the files the writer put there. A mount inside it is
    someone else's (a bind mount into a projected volume, say): the dir stays
    and the caller reports it. mountinfo is the first check; `remove_own_tree`
    also refuses a mount made after it was read (it never enters another mount).
    """
    if mounts_under(path):
        return False
    try:
        remove_own_tree(path)
    except PathInUseError:
        return False
    return True


def ensure_mode(path: Path, mode: int) -> None:
    """chmod `path` to `mode` unless it has it (a chmod is a journaled write even if idle)."""
    if stat.S_IMODE(os.lstat(path).st_mode) != mode:
        os.chmod(path, mode)


def _timestamp_prefix() -> str:
    return ".." + time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime()) + "."


class AtomicWriter:
    """Writes payloads into one volume dir atomically (kubelet's AtomicWriter).

    `context` prefixes every error ("pod NS/NAME volume VOL"), like the
    kubelet's messages; no error carries a file's content.
    """

    def __init__(
        self,
        target_dir: Path,
        context: str = "",
        on_step: Step | None = None,
        retire: Retire | None = None,
    ) -> None:
        self.target_dir = target_dir
        self.context = context
        self._on_step = on_step
        self._retire = retire

    def _step(self, name: str) -> None:
        if self._on_step is not None:
            self._on_step(name)

    def _fail(self, message: str) -> AtomicWriteError:
        prefix = f"{self.context}: " if self.context else ""
        return AtomicWriteError(prefix + message)

    def current_dir(self) -> str | None:
        """The timestamped dir ``..data`` points at, or None before the first write."""
        try:
            return os.readlink(self.target_dir / DATA_DIR)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail(f"unable to read link for data directory: {exc.strerror}") from None

    def write(
        self, payload: Mapping[str, FileProjection], set_perms: Callable[[Path], None] | None = None
    ) -> WriteResult:
        """Make the volume dir hold exactly `payload`, in one atomic step (see the module doc)."""
        try:
            files = check_payload(payload)
        except AtomicWriteError as exc:
            raise self._fail(str(exc)) from None
        old_name = self.current_dir()
        old_dir = None if old_name is None else self.target_dir / old_name
        if old_dir is not None and not old_dir.is_dir():
            old_dir, old_name = None, None
        to_remove = self._paths_to_remove(old_dir, files)
        swept = self.sweep(keep=old_name)
        if old_dir is not None and not to_remove and self._unchanged(old_dir, files):
            self._make_visible(files)
            return WriteResult(written=False, data_dir=old_name or "", swept=swept)
        new_name = self._write_new_dir(files)
        self._step("files_written")
        if set_perms is not None:
            set_perms(self.target_dir)  # the kubelet: on the whole volume, before the swap
        self._swap(new_name)
        self._step("swapped")
        self._make_visible(files)
        removed = self._remove_visible(to_remove)
        kept: list[str] = []
        if old_dir is not None and old_name != new_name and not self._remove_old(old_dir):
            kept.append(old_dir.name)
        self._step("done")
        return WriteResult(
            written=True, data_dir=new_name, removed_paths=removed, swept=swept, kept=kept
        )

    def _remove_old(self, path: Path) -> bool:
        """Remove (or hand to the reaper) a timestamped dir; False if kept for a mount in it."""
        if self._retire is not None:
            self._retire(path)
            return True
        return _remove_own_dir(path)

    def _paths_to_remove(
        self, old_dir: Path | None, files: Mapping[str, FileProjection]
    ) -> set[str]:
        if old_dir is None:
            return set()
        present = set(files)
        for path in files:
            present.update(_ancestors(path))
        return _old_paths(old_dir) - present

    @staticmethod
    def _unchanged(old_dir: Path, files: Mapping[str, FileProjection]) -> bool:
        return all(_same_bytes(old_dir / path, p.data) for path, p in files.items())

    def _write_new_dir(self, files: Mapping[str, FileProjection]) -> str:
        suffix = secrets.token_hex(4)
        new_dir = self.target_dir / f"{_timestamp_prefix()}{suffix}"
        try:
            new_dir.mkdir(mode=TS_DIR_MODE)
            ensure_mode(new_dir, TS_DIR_MODE)
            for path, projection in files.items():
                self._write_file(new_dir, path, projection)
        except OSError as exc:
            raise self._fail(f"error writing payload to {new_dir.name}: {exc.strerror}") from None
        return new_dir.name

    @staticmethod
    def _write_file(new_dir: Path, path: str, projection: FileProjection) -> None:
        target = new_dir / path
        parent = target.parent
        if parent != new_dir:
            parent.mkdir(mode=TS_DIR_MODE, parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, projection.mode)
        try:
            view = memoryview(projection.data)
            while view:
                view = view[os.write(fd, view) :]
            if stat.S_IMODE(os.fstat(fd).st_mode) != projection.mode:  # the umask took bits
                os.fchmod(fd, projection.mode)
            if projection.fs_user is not None:
                os.fchown(fd, projection.fs_user, -1)
        finally:
            os.close(fd)

    def _swap(self, new_name: str) -> None:
        tmp = self.target_dir / DATA_DIR_TMP
        try:
            try:
                os.symlink(new_name, tmp)
            except FileExistsError:  # a leftover the sweep did not remove
                tmp.unlink()
                os.symlink(new_name, tmp)
            self._step("tmp_linked")
            os.rename(tmp, self.target_dir / DATA_DIR)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            with suppress(OSError, PathInUseError):  # a leftover: the next write sweeps it
                remove_own_tree(self.target_dir / new_name)
            raise self._fail(
                f"error swapping {DATA_DIR} to the new payload: {exc.strerror}"
            ) from None

    def _make_visible(self, files: Mapping[str, FileProjection]) -> None:
        """Ensure a ``<top> -> ..data/<top>`` symlink per first path segment (even unwritten)."""
        for top in sorted({path.split("/", 1)[0] for path in files}):
            visible = self.target_dir / top
            if visible.is_symlink():
                continue
            if os.path.lexists(visible):
                raise self._fail(f"{top!r} exists in the volume dir and is not a symlink")
            os.symlink(f"{DATA_DIR}/{top}", visible)

    def _remove_visible(self, to_remove: set[str]) -> list[str]:
        """Remove the top-level symlinks of paths that went away (deeper ones go with their dir)."""
        removed: list[str] = []
        for path in sorted(p for p in to_remove if "/" not in p):
            visible = self.target_dir / path
            if visible.is_symlink():
                visible.unlink()
                removed.append(path)
        return removed

    def sweep(self, keep: str | None) -> list[str]:
        """Remove timestamped dirs but `keep` (crash leftovers) and a stale ``..data_tmp``."""
        swept: list[str] = []
        try:
            names = os.listdir(self.target_dir)
        except FileNotFoundError:
            return swept
        for name in names:
            if name == keep or not TS_DIR_RE.match(name):
                continue
            path = self.target_dir / name
            if path.is_dir() and not path.is_symlink() and self._remove_old(path):
                swept.append(name)
        if DATA_DIR_TMP in names:
            (self.target_dir / DATA_DIR_TMP).unlink(missing_ok=True)
        return sorted(swept)


class DirReaper:
    """Removes the timestamped dirs writers retire, in a thread of its own.

    `retire` queues a dir once (by its canonical path, as `RootLayout` gives
    them); a thread starts when there is work and ends when there is none. A
    dir is removed only if its name is of the writer's pattern, it is a
    directory, no symlink is on its path, ``..data`` beside it does not point
    at it, and nothing is mounted at or under it: mountinfo is read after a
    batch is taken from the queue and again when that copy is older than
    `MOUNTINFO_MAX_AGE_S`; the removal itself works on directory fds and
    enters no mount, also one made since (`remove_own_tree`). A dir with a
    mount inside is kept and logged once.
    A batch starts when retirements pause (`REAP_QUIET_S`, at most
    `REAP_MAX_DELAY_S` after the first waiting one). `settle` drops a
    volume's queued dirs and waits for the one being removed, before a
    teardown removes the volume itself.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: dict[Path, None] = {}
        self._busy: Path | None = None
        self._thread: threading.Thread | None = None
        self._kept: set[Path] = set()
        self._last_retired = 0.0
        self._first_waiting = 0.0
        self.removed = 0
        """Dirs removed so far."""

    def retire(self, path: Path) -> None:
        """Queue `path` (a timestamped dir ``..data`` left) for removal; returns at once."""
        with self._cond:
            if path in self._queue or path == self._busy:
                return
            self._last_retired = time.monotonic()
            if not self._queue:
                self._first_waiting = self._last_retired
            self._queue[path] = None
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="volfsm-dir-reaper", daemon=True
                )
                self._thread.start()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every retired dir was handled; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and self._busy is None, timeout)

    def settle(self, target_dir: Path, timeout: float | None = None) -> bool:
        """Drop `target_dir`'s queued dirs and wait until none of its dirs is being removed."""
        with self._cond:
            for path in [p for p in self._queue if p.parent == target_dir]:
                del self._queue[path]
            return self._cond.wait_for(
                lambda: self._busy is None or self._busy.parent != target_dir, timeout
            )

    def _next_batch(self) -> list[Path]:
        """The queued dirs once retirements paused; [] (and the thread ends) when none is left."""
        with self._cond:
            while self._queue:
                now = time.monotonic()
                wait = min(
                    self._last_retired + REAP_QUIET_S - now,
                    self._first_waiting + REAP_MAX_DELAY_S - now,
                )
                if wait <= 0:
                    return list(self._queue)
                self._cond.wait(wait)
            self._thread = None
            self._cond.notify_all()
            return []

    def _run(self) -> None:
        while batch := self._next_batch():
            infos, read_at = read_mountinfo(), time.monotonic()
            for path in batch:
                with self._cond:
                    if path not in self._queue:
                        continue  # dropped by `settle`
                    del self._queue[path]
                    self._busy = path
                try:
                    if time.monotonic() - read_at > MOUNTINFO_MAX_AGE_S:
                        infos, read_at = read_mountinfo(), time.monotonic()
                    self._reap(path, infos)
                except Exception:  # never let one dir stop the others
                    log.exception("could not remove the old payload dir {}", path)
                finally:
                    with self._cond:
                        self._busy = None
                        self._cond.notify_all()

    def _reap(self, path: Path, infos: list[MountInfo]) -> None:
        if not TS_DIR_RE.match(path.name):
            return
        try:
            current: str | None = os.readlink(path.parent / DATA_DIR)
        except FileNotFoundError:
            current = None  # before a first swap: what the writer's own sweep removes too
        if current == path.name or not path.is_dir() or path.is_symlink():
            return
        if os.path.realpath(path) != os.fspath(path):
            self._keep(path, "a symlink is on its path")
        elif mounts_under(path, infos):
            self._keep(path, "a mount is inside it")
        else:
            try:
                remove_own_tree(path)
            except PathInUseError as exc:  # mounted since mountinfo was read
                self._keep(path, exc.reason)
            else:
                self.removed += 1

    def _keep(self, path: Path, why: str) -> None:
        if path not in self._kept:  # a later write's sweep hands it over again
            self._kept.add(path)
            log.warning("kept the old payload dir {}: {}", path, why)


def read_payload(target_dir: Path, attempts: int = 100) -> dict[str, bytes]:
    """Every file of the payload ``..data`` points at: one consistent set.

    Read through the timestamped dir's fd; the set is whole if ``..data``
    still points at that dir afterwards (dir names are never reused, and a
    dir is removed only after ``..data`` left it). Otherwise - a writer
    swapped meanwhile - read again. `FileNotFoundError` if there is none.
    """
    for _ in range(attempts):
        name = os.readlink(target_dir / DATA_DIR)
        try:
            fd = os.open(target_dir / name, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            continue
        try:
            found = _read_tree(fd, "")
        except FileNotFoundError:
            continue
        finally:
            os.close(fd)
        if os.readlink(target_dir / DATA_DIR) == name:
            return found
    raise FileNotFoundError(f"no stable payload in {target_dir} after {attempts} attempts")


def _read_tree(dir_fd: int, prefix: str) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for entry in os.scandir(dir_fd):
        rel = f"{prefix}{entry.name}"
        if entry.is_dir(follow_symlinks=False):
            sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dir_fd)
            try:
                found.update(_read_tree(sub, rel + "/"))
            finally:
                os.close(sub)
        else:
            fd = os.open(entry.name, os.O_RDONLY, dir_fd=dir_fd)
            with os.fdopen(fd, "rb") as f:
                found[rel] = f.read()
    return found
