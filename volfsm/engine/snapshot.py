"""Engine-state snapshots: start from the newest good one plus the events after it.

The engine's start folds three things out of the log: the ASW, the DSW
and the index (`fold_log`). A snapshot holds all three as they were after
one event (`seq`), so a start can decode it and fold only the events after
that seq instead of the whole log.

Stored (`events.snapshots`, in the log's own database): kind
`volfsm.engine-state`, `FORMAT_VERSION`, a fingerprint of the code that
folds (`fold_fingerprint`), the seq with its event's ts and row hash, and
the body: zlib(msgpack(`EngineState`)) with its size and sha256.

At start (`restore`), newest first, a snapshot is refused, with a warning
naming why, when: its format version or fingerprint is not this build's
(the fold may have changed: a snapshot is a cache, never a second source of
truth); its seq is past the end of the log, or the event at its seq is not
the one it was taken after (a truncated log, or another node's or an older
copy); a chunk is missing or the sha256 does not match; the body does not
decode. The next older one is tried, then a full replay. A good snapshot
plus the tail folds to exactly what the full replay gives (tests/snapshot).

The body holds each object once and is decoded in parts, so that a start
from a snapshot needs no more memory than a start from the log: first
everything but the ASW's pod-volume entries, where the ASW's desired pods
are the uids of the DSW's pods (a pod only the ASW holds is stored on its
own); then the pod-volume entries in chunks (`encode_podvol_part`), each
chunk's strings replaced by the DSW's copies (`PodVolSharer`) before the
next is decoded, as the split fold does with its child's entries.

While running, `volfsm.engine.snapshotter.EngineSnapshots` takes a snapshot
every `SnapshotPolicy.every_events` events, or after `every_s` seconds once
at least `min_events` happened, and at a clean stop.

What a snapshot holds is the engine's live state, which equals the fold of
the log except that the index may list fewer deleted pods and unwanted
volumes: it forgets them once they are cleaned up, which is not logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import importlib
import inspect
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
from loguru import logger

from events.log import EventLog
from events.snapshots import SnapshotError, SnapshotHeader
from events.types import EVENT_TYPES, PodAdded
from projections.asw import Asw, Hook
from projections.snapshot import (
    AswSnapshot,
    encode_podvol_part,
    read_podvol_part,
    restore_asw,
    snapshot_asw,
)
from volfsm.desired.dsw import DesiredStateOfWorld, DswSnapshot
from volfsm.engine.compact import PodVolSharer, share_devices_and_holders
from volfsm.engine.index import EngineIndex, IndexSnapshot
from volfsm.engine.splitfold import SPLIT_OVER, fold_split

_logger = logger

KIND = "volfsm.engine-state"
"""The snapshot kind the engine writes and reads."""

FORMAT_VERSION = 2
"""2: zlib(length-prefixed msgpack(EngineState), then the ASW's `encode_podvol_part`);
1: zlib(msgpack of the whole state at once). Bump on any change of the body's layout."""

FOLD_MODULES = (
    "events.types",
    "events.upcast",
    "events.tables",
    "projections.asw",
    "projections.snapshot",
    "volfsm.desired.dsw",
    "volfsm.engine.index",
    "volfsm.engine.snapshot",
)
"""The code whose behaviour a snapshot captures: its fingerprint is in every snapshot."""


@cache
def fold_fingerprint() -> str:
    """A hash of the source of `FOLD_MODULES`: snapshots of any other fold are refused.

    Changing how an event folds changes what a full replay gives; a snapshot
    written by the old code would silently keep the old answer. Any edit
    of those modules (an upgrade) thus costs one full replay at the next start.
    """
    digest = hashlib.sha256()
    for name in FOLD_MODULES:
        module = importlib.import_module(name)
        try:
            data = inspect.getsource(module).encode()
        except (OSError, TypeError):  # no source shipped: the compiled file, else the name
            try:
                data = Path(str(module.__file__)).read_bytes()
            except (OSError, AttributeError):
                data = b""
        digest.update(name.encode())
        digest.update(data)
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class SnapshotPolicy:
    """When the engine writes snapshots, and how many it keeps.

    Defaults: folding runs at a few hundred thousand events a second, so a
    tail of at most 50,000 events costs a start about 0.1-0.2 s on top of
    decoding the snapshot. Taking one stops the event loop for the encoding
    (1-2 µs per ASW entry: 0.1-0.2 s for the 115,000 entries of a node that
    logged 1,000,000 events), which every 50,000 events keeps under 1 % of
    the loop even on a node logging 1,000 events a second. The
    time trigger refreshes the snapshot of a quiet node (every 10 minutes,
    if at least 1,000 events happened), and a clean stop writes one, so a
    restart after a drain replays nothing. Three are kept: if the newest is
    damaged, the one before it still saves most of the replay.
    """

    every_events: int = 50_000
    every_s: float = 600.0
    min_events: int = 1_000
    keep: int = 3
    at_stop: bool = True
    write: bool = True
    """Write snapshots while running (and at stop)."""
    restore: bool = True
    """Start from a snapshot when a good one is stored (else: full replay)."""
    chunk_bytes: int = 1 << 20
    compress_level: int = 1


class EngineState(msgspec.Struct, array_like=True, frozen=True):
    """The first part of an engine snapshot's body: all but the ASW's pod-volume entries."""

    seq: int
    asw: AswSnapshot
    """The ASW without its pod-volume entries and desired pods."""
    dsw: DswSnapshot
    index: IndexSnapshot
    desired_pods: list[str] = []
    """The uids of the ASW's desired pods, in order (each is the DSW's pod of that uid,
    unless it is in `own_desired_pods`)."""
    own_desired_pods: list[PodAdded] = []
    """The ASW's desired pods the DSW does not hold (a pod the DSW holds as pending)."""


class _Seq(msgspec.Struct, array_like=True, frozen=True):
    """The first field of an `EngineState` alone (the decoder skips the others)."""

    seq: int


@dataclass(frozen=True)
class StoredState:
    """A snapshot body, decompressed and cut in its two parts (decoded by `install_state`)."""

    seq: int
    """The seq of the event the state was taken after."""
    head: memoryview
    """msgpack of an `EngineState`."""
    podvols: memoryview
    """An `encode_podvol_part`."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(EngineState)
_seq_decoder = msgspec.msgpack.Decoder(_Seq)
_LENGTH = 4
"""Bytes of the big-endian length of the first part of a body."""


def encode_state(asw: Asw, dsw: DesiredStateOfWorld, index: EngineIndex, seq: int) -> bytes:
    """The body of a snapshot of the three folds after event `seq` (uncompressed; cheap
    enough to call on the loop)."""
    pods = dsw.pods
    own = [pod for uid, pod in asw.desired_pods.items() if not _same(pods.get(uid), pod)]
    rest = dataclasses.replace(asw, podvols={}, desired_pods={})
    head = _encoder.encode(
        EngineState(
            seq=seq,
            asw=snapshot_asw(rest),
            dsw=dsw.export_state(),
            index=index.export_state(),
            desired_pods=list(asw.desired_pods),
            own_desired_pods=own,
        )
    )
    return len(head).to_bytes(_LENGTH, "big") + head + encode_podvol_part(asw)


def _same(dsw_pod: PodAdded | None, pod: PodAdded) -> bool:
    """Whether the DSW's pod can stand for the ASW's (the same object, or an equal one)."""
    return dsw_pod is pod or (dsw_pod is not None and dsw_pod == pod)


def decode_state(body: bytes) -> StoredState:
    """The state in a stored (zlib) body, its parts still encoded but for the seq;
    zlib.error, msgspec.DecodeError or ValueError if it is not one."""
    view = memoryview(zlib.decompress(body))
    end = _LENGTH + int.from_bytes(view[:_LENGTH], "big")
    if len(view) < _LENGTH or end > len(view):
        raise ValueError("the body's first part runs past its end")
    head = view[_LENGTH:end]
    return StoredState(_seq_decoder.decode(head).seq, head, view[end:])


def install_state(
    stored: StoredState, asw: Asw, dsw: DesiredStateOfWorld, index: EngineIndex
) -> None:
    """Decode a stored state into the engine's (existing) ASW, DSW and index objects.

    First all but the pod-volume entries; the devices and holders then
    share the DSW's strings, and the decoded first part is dropped, before
    the pod-volume entries are decoded a chunk at a time, sharing the DSW's
    keys and strings: each step reuses the memory of the copies the one
    before freed. If a part does not decode (msgspec.DecodeError,
    ValueError), ASW, DSW and index are left empty and the error raised.
    """
    try:
        state = _decoder.decode(stored.head)
        restore_asw(state.asw, into=asw)
        dsw.restore_state(state.dsw)
        index.restore_state(state.index)
        pods, own = dsw.pods, {pod.pod_uid: pod for pod in state.own_desired_pods}
        asw.desired_pods.update((uid, own.get(uid) or pods[uid]) for uid in state.desired_pods)
        del state, own
        share = PodVolSharer(dsw.desired_entries())
        share_devices_and_holders(asw, index, share)
        _, chunks = read_podvol_part(stored.podvols)
        for chunk in chunks:
            share.put(chunk.keys, chunk.entries, asw.podvols)
    except Exception:
        _install_empty(asw, dsw, index)
        raise


def _install_empty(asw: Asw, dsw: DesiredStateOfWorld, index: EngineIndex) -> None:
    """ASW, DSW and index as before any event (what a full replay starts from)."""
    restore_asw(AswSnapshot(Asw()), into=asw)
    dsw.restore_state(DswSnapshot())
    index.restore_state(IndexSnapshot())


def fold_hooks(dsw: DesiredStateOfWorld, index: EngineIndex) -> dict[type, Hook]:
    """What the engine does with each event besides the ASW fold, by body type.

    Desired-state events go to the index, then the DSW; pod-volume events
    and DeviceDetached to the index (what the live engine does with each
    appended envelope). Built from `EVENT_TYPES` by kind, so a new event
    type is routed by its KIND.
    """
    hooks: dict[type, Hook] = {}
    for name, cls in EVENT_TYPES.items():
        index_fold = index.handlers.get(cls)
        if cls.KIND == "desired":
            hook = _then_dsw(index_fold, dsw.folds.get(cls))
            if hook is not None:
                hooks[cls] = hook
        elif (cls.KIND == "podvol" or name == "DeviceDetached") and index_fold is not None:
            hooks[cls] = index_fold
    return hooks


def _then_dsw(index_fold: Hook | None, dsw_fold: Callable[[Any], None] | None) -> Hook | None:
    """The index's fold of a desired-state event, then the DSW's (either may be missing)."""
    if dsw_fold is None:
        return index_fold
    then = dsw_fold
    if index_fold is None:

        def dsw_only(body: Any, _: int) -> None:
            then(body)

        return dsw_only
    first = index_fold

    def desired(body: Any, version: int) -> None:
        first(body, version)
        then(body)

    return desired


def fold_log(
    log_: EventLog,
    asw: Asw,
    dsw: DesiredStateOfWorld,
    index: EngineIndex,
    after: int = 0,
    until: int | None = None,
    *,
    split_over: int | None = SPLIT_OVER,
) -> tuple[int, int]:
    """Fold the events after `after` (up to `until`) into ASW, DSW and index.

    A fold of at least `split_over` events into an ASW without pod-volume
    entries (a full replay) uses two processes (`volfsm.engine.splitfold`);
    None: never. Returns (last seq folded, or `after` if none; events folded).
    """
    hooks = fold_hooks(dsw, index)
    if split_over is not None and not asw.podvols:
        end = until if until is not None else log_.last_seq()
        if end - after >= split_over:
            return fold_split(log_, asw, hooks, after, end, shared_with=dsw.desired_entries())
    with log_.scan_fold(after, until) as rows:
        last, count = asw.fold_rows(rows, hooks)
    return (last if count else after), count


def save_state(
    log_: EventLog, seq: int, data: bytes, policy: SnapshotPolicy | None = None
) -> SnapshotHeader:
    """Store `encode_state` output for `seq` as an engine snapshot (blocking: off the loop)."""
    policy = policy or SnapshotPolicy()
    return log_.snapshots.save(
        kind=KIND,
        format_version=FORMAT_VERSION,
        fingerprint=fold_fingerprint(),
        seq=seq,
        body=zlib.compress(data, policy.compress_level),
        keep=policy.keep,
        chunk_bytes=policy.chunk_bytes,
    )


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic GC while a fold builds a large state (it would rescan it again and again)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ------------------------------------------------------------------ start


@dataclass(frozen=True)
class StartupReport:
    """How start-up rebuilt the state: which snapshot (or why none), what was replayed."""

    snapshot: SnapshotHeader | None
    refused: tuple[str, ...]
    """Why each snapshot tried before the one used (or all of them) was refused."""
    no_snapshot_reason: str
    """Why none was used ("" when one was)."""
    events_replayed: int
    last_seq: int
    decode_s: float
    replay_s: float

    @property
    def seconds(self) -> float:
        """Time spent reading snapshots and folding."""
        return self.decode_s + self.replay_s

    def summary(self) -> str:
        """One line for the startup log and /readyz."""
        if self.snapshot is not None:
            snap = self.snapshot
            text = (
                f"state from snapshot #{snap.id} at seq {snap.seq} "
                f"({snap.size / 1e6:.1f} MB, {self.decode_s:.2f} s) + {self.events_replayed} "
                f"events replayed ({self.replay_s:.2f} s), seq {self.last_seq}"
            )
            if self.refused:
                text += f"; {len(self.refused)} newer snapshot(s) refused: {self.refused[0]}"
            return text
        return (
            f"state from a full replay of {self.events_replayed} events ({self.replay_s:.2f} s), "
            f"seq {self.last_seq}; snapshot: none: {self.no_snapshot_reason}"
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain data (for /readyz or JSON logs)."""
        return {
            "snapshot_id": self.snapshot.id if self.snapshot else None,
            "snapshot_seq": self.snapshot.seq if self.snapshot else None,
            "no_snapshot_reason": self.no_snapshot_reason,
            "refused": list(self.refused),
            "events_replayed": self.events_replayed,
            "last_seq": self.last_seq,
            "decode_s": round(self.decode_s, 4),
            "replay_s": round(self.replay_s, 4),
        }


def _candidates(log_: EventLog) -> tuple[list[SnapshotHeader], str]:
    """Stored engine snapshots, newest first, or [] and why there are none."""
    store = log_.snapshots
    try:
        if not store.available():
            return [], "this log has no snapshot tables (log schema before 3, opened read-only)"
        headers = store.headers(KIND)
    except Exception as exc:  # a damaged table must not stop the start: replay instead
        return [], f"cannot list snapshots ({exc})"
    if not headers:
        return [], "no snapshot stored"
    return headers, ""


def _check_header(header: SnapshotHeader) -> str:
    """Why a header alone disqualifies its snapshot ("" if it does not)."""
    if header.format_version != FORMAT_VERSION:
        return (
            f"{header.describe()}: format version {header.format_version}, this build reads "
            f"{FORMAT_VERSION}"
        )
    if header.fingerprint != fold_fingerprint():
        return (
            f"{header.describe()}: written by a build with other fold code (fingerprint "
            f"{header.fingerprint}, this build {fold_fingerprint()})"
        )
    return ""


def _load(
    log_: EventLog,
    header: SnapshotHeader,
    asw: Asw,
    dsw: DesiredStateOfWorld,
    index: EngineIndex,
) -> str:
    """Install the snapshot of `header` into ASW, DSW and index; "" if it was, else why not
    (and the three left empty)."""
    try:
        stored = decode_state(log_.snapshots.load(header))
        if stored.seq != header.seq:
            return f"{header.describe()}: body is the state at seq {stored.seq}"
        install_state(stored, asw, dsw, index)
    except SnapshotError as exc:
        return str(exc)
    except (zlib.error, msgspec.DecodeError, ValueError) as exc:
        return f"{header.describe()}: body does not decode ({exc})"
    except Exception as exc:  # sqlite3 errors and the like: try the next one
        return f"{header.describe()}: cannot be read ({exc!r})"
    return ""


def restore(
    log_: EventLog,
    asw: Asw,
    dsw: DesiredStateOfWorld,
    index: EngineIndex,
    *,
    use_snapshots: bool = True,
) -> StartupReport:
    """Rebuild ASW, DSW and index: newest good snapshot + the events after it, or everything.

    Blocking (the engine runs it in a thread before the loop needs the state).
    """
    refused: list[str] = []
    used: SnapshotHeader | None = None
    after = 0
    t0 = time.perf_counter()
    with _gc_paused():
        if use_snapshots:
            headers, none_reason = _candidates(log_)
        else:
            headers, none_reason = [], "snapshots disabled (SnapshotPolicy.restore)"
        for header in headers:
            why = _check_header(header) or _load(log_, header, asw, dsw, index)
            if why:
                _logger.warning("snapshot ignored, not trusted: {}", why)
                refused.append(why)
                continue
            used, after = header, header.seq
            break
        decode_s = time.perf_counter() - t0
        if used is None and headers:
            none_reason = f"all {len(headers)} stored snapshot(s) refused"
        t1 = time.perf_counter()
        last, count = fold_log(log_, asw, dsw, index, after)
        replay_s = time.perf_counter() - t1
    report = StartupReport(
        snapshot=used,
        refused=tuple(refused),
        no_snapshot_reason="" if used is not None else none_reason,
        events_replayed=count,
        last_seq=last,
        decode_s=decode_s,
        replay_s=replay_s,
    )
    _logger.info("{}", report.summary())
    return report
