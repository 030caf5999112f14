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
from functools import lru_cache
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


@lru_cache(maxsize=4096)
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


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW_DIR_FLAGS = _DIR_FLAGS | os.O_NOFOLLOW
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW


@dataclass
class _Listing:
    """What the volume dir held when a write began (one `scandir`)."""

    symlinks: set[str]
    """Names of the symlinks in it (``..data`` and the visible top-level ones)."""
    others: set[str]
    """Names of everything else."""
    stale: list[str]
    """Directories of the writer's pattern (the current one among them)."""

    @classmethod
    def of(cls, dir_fd: int) -> _Listing:
        symlinks: set[str] = set()
        others: set[str] = set()
        stale: list[str] = []
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                name = entry.name
                if entry.is_symlink():
                    symlinks.add(name)
                    continue
                others.add(name)
                if name.startswith("..") and TS_DIR_RE.match(name) and entry.is_dir():
                    stale.append(name)
        return cls(symlinks, others, stale)


def _tree_names(dir_fd: int, prefix: str, found: set[str]) -> None:
    """Every file and dir below the directory open at `dir_fd`, as `prefix` + relative path."""
    with os.scandir(dir_fd) as entries:
        subdirs = []
        for entry in entries:
            rel = prefix + entry.name
            found.add(rel)
            if entry.is_dir(follow_symlinks=False):
                subdirs.append((entry.name, rel))
    for name, rel in subdirs:
        try:
            sub = os.open(name, _NOFOLLOW_DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            _tree_names(sub, rel + "/", found)
        finally:
            os.close(sub)


def _same_bytes_at(dir_fd: int, path: str, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        want = len(data) + 1  # one byte more than `data`: a longer file differs
        chunks = []
        while want > 0 and (chunk := os.read(fd, want)):
            chunks.append(chunk)
            want -= len(chunk)
        return b"".join(chunks) == data
    except OSError:
        return False
    finally:
        os.close(fd)


class AtomicWriter:
    """Writes payloads into one volume dir atomically (kubelet's AtomicWriter).

    `context` prefixes every error ("pod NS/NAME volume VOL"), like the
    kubelet's messages; no error carries a file's content. Every step works
    on the volume dir's fd: `write` opens `target_dir` once, or uses the fd
    its caller opened (`dir_fd`: a walk that followed no symlink).
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
        self,
        payload: Mapping[str, FileProjection],
        set_perms: Callable[[Path], None] | None = None,
        dir_fd: int | None = None,
    ) -> WriteResult:
        """Make the volume dir hold exactly `payload`, in one atomic step (see the module doc).

        `dir_fd`: the volume dir, already open (the caller keeps and closes it).
        """
        try:
            files = check_payload(payload)
        except AtomicWriteError as exc:
            raise self._fail(str(exc)) from None
        if dir_fd is not None:
            return self._write_at(dir_fd, files, set_perms)
        try:
            fd = os.open(self.target_dir, _DIR_FLAGS)
        except OSError as exc:
            raise self._fail(f"error opening the volume dir: {exc.strerror}") from None
        try:
            return self._write_at(fd, files, set_perms)
        finally:
            os.close(fd)

    def _write_at(
        self,
        fd: int,
        files: Mapping[str, FileProjection],
        set_perms: Callable[[Path], None] | None,
    ) -> WriteResult:
        old_name, old_fd = self._open_current(fd)
        try:
            to_remove = self._paths_to_remove(old_fd, files)
            listing = _Listing.of(fd)
            swept = self._sweep(fd, listing, keep=old_name)
            if old_fd is not None and not to_remove and self._unchanged(old_fd, files):
                self._make_visible(fd, files, listing)
                return WriteResult(written=False, data_dir=old_name or "", swept=swept)
        finally:
            if old_fd is not None:
                os.close(old_fd)
        new_name = self._write_new_dir(fd, files)
        self._step("files_written")
        if set_perms is not None:
            set_perms(self.target_dir)  # the kubelet: on the whole volume, before the swap
        self._swap(fd, new_name)
        self._step("swapped")
        self._make_visible(fd, files, listing)
        removed = self._remove_visible(fd, to_remove, listing)
        kept: list[str] = []
        if old_name is not None and not self._remove_old(self.target_dir / old_name):
            kept.append(old_name)
        self._step("done")
        return WriteResult(
            written=True, data_dir=new_name, removed_paths=removed, swept=swept, kept=kept
        )

    def _open_current(self, fd: int) -> tuple[str | None, int | None]:
        """(name, fd) of the timestamped dir ``..data`` points at; (None, None) if none."""
        try:
            name = os.readlink(DATA_DIR, dir_fd=fd)
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            raise self._fail(f"unable to read link for data directory: {exc.strerror}") from None
        if not TS_DIR_RE.match(name):
            return None, None  # not a link this writer made: replaced at the swap, kept
        try:
            return name, os.open(name, _NOFOLLOW_DIR_FLAGS, dir_fd=fd)
        except OSError:
            return None, None

    def _remove_old(self, path: Path) -> bool:
        """Remove (or hand to the reaper) a timestamped dir; False if kept for a mount in it."""
        if self._retire is not None:
            self._retire(path)
            return True
        return _remove_own_dir(path)

    @staticmethod
    def _paths_to_remove(old_fd: int | None, files: Mapping[str, FileProjection]) -> set[str]:
        if old_fd is None:
            return set()
        found: set[str] = set()
        _tree_names(old_fd, "", found)
        if not found.difference(files):
            return set()
        present = set(files)
        for path in files:
            present.update(_ancestors(path))
        return found - present

    @staticmethod
    def _unchanged(old_fd: int, files: Mapping[str, FileProjection]) -> bool:
        return all(_same_bytes_at(old_fd, path, p.data) for path, p in files.items())

    def _write_new_dir(self, fd: int, files: Mapping[str, FileProjection]) -> str:
        new_name = f"{_timestamp_prefix()}{secrets.token_hex(4)}"
        try:
            os.mkdir(new_name, TS_DIR_MODE, dir_fd=fd)
            new_fd = os.open(new_name, _NOFOLLOW_DIR_FLAGS, dir_fd=fd)
            try:
                if stat.S_IMODE(os.fstat(new_fd).st_mode) != TS_DIR_MODE:  # the umask took bits
                    os.fchmod(new_fd, TS_DIR_MODE)
                made: set[str] = set()
                for path, projection in files.items():
                    self._write_file(new_fd, path, projection, made)
            finally:
                os.close(new_fd)
        except OSError as exc:
            raise self._fail(f"error writing payload to {new_name}: {exc.strerror}") from None
        return new_name

    @staticmethod
    def _write_file(new_fd: int, path: str, projection: FileProjection, made: set[str]) -> None:
        if "/" in path:
            ancestors = _ancestors(path)
            for index, parent in enumerate(ancestors):
                if parent not in made:
                    mode = TS_DIR_MODE if index == len(ancestors) - 1 else 0o777
                    with suppress(FileExistsError):
                        os.mkdir(parent, mode, dir_fd=new_fd)
                    made.add(parent)
        fd = os.open(path, _NEW_FILE_FLAGS, projection.mode, dir_fd=new_fd)
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

    def _swap(self, fd: int, new_name: str) -> None:
        try:
            try:
                os.symlink(new_name, DATA_DIR_TMP, dir_fd=fd)
            except FileExistsError:  # a leftover the sweep did not remove
                os.unlink(DATA_DIR_TMP, dir_fd=fd)
                os.symlink(new_name, DATA_DIR_TMP, dir_fd=fd)
            self._step("tmp_linked")
            os.rename(DATA_DIR_TMP, DATA_DIR, src_dir_fd=fd, dst_dir_fd=fd)
        except OSError as exc:
            with suppress(FileNotFoundError):
                os.unlink(DATA_DIR_TMP, dir_fd=fd)
            with suppress(OSError, PathInUseError):  # a leftover: the next write sweeps it
                remove_own_tree(self.target_dir / new_name)
            raise self._fail(
                f"error swapping {DATA_DIR} to the new payload: {exc.strerror}"
            ) from None

    def _make_visible(
        self, fd: int, files: Mapping[str, FileProjection], listing: _Listing
    ) -> None:
        """Ensure a ``<top> -> ..data/<top>`` symlink per first path segment (even unwritten)."""
        for top in sorted({path.split("/", 1)[0] for path in files}):
            if top in listing.symlinks:
                continue
            if top in listing.others:
                raise self._fail(f"{top!r} exists in the volume dir and is not a symlink")
            try:
                os.symlink(f"{DATA_DIR}/{top}", top, dir_fd=fd)
            except FileExistsError:
                if not stat.S_ISLNK(os.stat(top, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise self._fail(
                        f"{top!r} exists in the volume dir and is not a symlink"
                    ) from None
            listing.symlinks.add(top)

    @staticmethod
    def _remove_visible(fd: int, to_remove: set[str], listing: _Listing) -> list[str]:
        """Remove the top-level symlinks of paths that went away (deeper ones go with their dir)."""
        removed: list[str] = []
        for path in sorted(p for p in to_remove if "/" not in p):
            if path in listing.symlinks:
                with suppress(FileNotFoundError):
                    os.unlink(path, dir_fd=fd)
                listing.symlinks.discard(path)
                removed.append(path)
        return removed

    def sweep(self, keep: str | None) -> list[str]:
        """Remove timestamped dirs but `keep` (crash leftovers) and a stale ``..data_tmp``."""
        try:
            fd = os.open(self.target_dir, _DIR_FLAGS)
        except FileNotFoundError:
            return []
        try:
            return self._sweep(fd, _Listing.of(fd), keep)
        finally:
            os.close(fd)

    def _sweep(self, fd: int, listing: _Listing, keep: str | None) -> list[str]:
        swept: list[str] = []
        for name in listing.stale:
            if name != keep and self._remove_old(self.target_dir / name):
                swept.append(name)
        if DATA_DIR_TMP in listing.symlinks or DATA_DIR_TMP in listing.others:
            with suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(DATA_DIR_TMP, dir_fd=fd)
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
