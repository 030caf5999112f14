"""A full replay on two cores: the pod-volume entries are folded by a child process.

Without a snapshot the engine folds the whole log, and one Python process
folds about 250,000 events a second. Pod-volume entries are the largest
part of the ASW's work and depend on nothing else (`projections.podvolfold`),
so for a big fold from an empty state a child process folds them while
this one reads every other row: devices, the desired state, and the hooks
(DSW and index, which also need the pod-volume events that change who
holds a volume). The child's entries are then put in place, as a full
fold in one process would have built them (tests/snapshot checks it).

If the child cannot be started, fails or sends something unreadable, the
pod-volume part is folded here instead (slower, never wrong) and a warning
says why. Only a fold of at least `SPLIT_OVER` events from an empty ASW is
split: a start from a snapshot replays a short tail in-process.

The child only reads the log. If the service dies while it runs, the child
finishes its fold (seconds), fails to write to the closed pipe and exits;
it is not tied to its parent with PR_SET_PDEATHSIG because that follows the
thread that started it (here a worker thread) and needs a `preexec_fn`,
which is unsafe in a process with threads.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from loguru import logger

from events.log import EventLog
from events.streams import PODVOL_PREFIX
from events.types import EVENT_TYPES
from projections.asw import Asw, Hook, PodVolumeState
from projections.podvolfold import fold_podvols
from projections.snapshot import read_podvol_part
from volfsm.engine.compact import PodVolSharer
from volfsm.engine.index import PodVolumeKey

SPLIT_OVER = 400_000
"""Smallest number of events a split fold is used for. The child's start (interpreter
and imports, ~0.35 s) eats the gain up to about 250,000 events (bench/recovery.py
--quick: 200,000 events, split 0.95x of one process)."""

CHILD_WAIT_MIN_S = 30.0
"""After its own half, wait for the child at least this long, or 4x that half's time."""

_logger = logger


def fold_split(
    log_: EventLog,
    asw: Asw,
    hooks: Mapping[type, Hook],
    after: int,
    until: int,
    *,
    child: list[str] | None = None,
    shared_with: Mapping[PodVolumeKey, Any] | None = None,
) -> tuple[int, int]:
    """Fold (after, until] into an empty-podvols `asw` with `hooks`; (last seq, events).

    `shared_with`: the DSW's entries (which `hooks` fill); the child's
    entries are shared with them (`PodVolSharer`) a chunk at a time as they
    are decoded, so the decoded copies are freed before the next chunk
    reuses their memory. `child` replaces the child's command (tests use it
    to make the child fail).
    """
    if asw.podvols:
        raise ValueError("a split fold needs an ASW without pod-volume entries")
    command = child or [
        sys.executable,
        "-m",
        "projections.podvolfold",
        str(log_.path),
        str(after),
        str(until),
    ]
    try:
        proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError as exc:
        _logger.warning("split replay: cannot start the pod-volume fold ({}); folding it here", exc)
        proc = None
    hooked = tuple(name for name, cls in EVENT_TYPES.items() if cls in hooks)
    started = time.monotonic()
    try:
        with log_.scan_fold(
            after, until, prefix=PODVOL_PREFIX, other_streams=True, also_types=hooked
        ) as rows:
            asw.fold_rows(rows, hooks, with_podvols=False)
        wait_s = max(CHILD_WAIT_MIN_S, 4 * (time.monotonic() - started))
        out = _child_output(proc, wait_s) if proc is not None else None
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
    share = PodVolSharer(shared_with) if shared_with is not None else None
    last = _take_part(out, asw.podvols, share) if out is not None else None
    if last is None:
        part = fold_podvols(log_, after, until)
        asw.podvols.update(part.podvols)
        last = part.last_seq, part.last_ts
    if last[0] > asw.last_seq:
        asw.last_seq, asw.last_ts = last
    count = log_.count_between(after, until)
    return (asw.last_seq if count else after), count


def _child_output(proc: subprocess.Popen[bytes], wait_s: float) -> bytes | None:
    """The child's output within `wait_s`, or None (and a warning saying why)."""
    try:
        out, err = proc.communicate(timeout=wait_s)
    except subprocess.TimeoutExpired:
        _logger.warning(
            "split replay: the pod-volume fold sent nothing {:.0f} s after this half was done; "
            "folding it here",
            wait_s,
        )
        return None
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        _logger.warning(
            "split replay: the pod-volume fold exited with {} ({}); folding it here",
            proc.returncode,
            tail[0],
        )
        return None
    return out


def _take_part(
    out: bytes, podvols: dict[PodVolumeKey, PodVolumeState], share: PodVolSharer | None
) -> tuple[int, int] | None:
    """Put the child's entries into `podvols`, in order; its (last seq, last ts).

    None (`podvols` left empty, and a warning) if `out` is unreadable.
    """
    try:
        head, chunks = read_podvol_part(out)
        for chunk in chunks:
            if share is None:
                podvols.update(zip(chunk.keys, chunk.entries, strict=True))
            else:
                share.put(chunk.keys, chunk.entries, podvols)
    except Exception as exc:  # msgspec.DecodeError, a bad frame or struct: never trust it
        podvols.clear()
        _logger.warning(
            "split replay: the pod-volume fold sent {} unreadable bytes ({}); folding it here",
            len(out),
            exc,
        )
        return None
    return head.last_seq, head.last_ts
