"""Writing engine-state snapshots while the engine runs (`volfsm.engine.snapshot` has the
format and the restore at start).

A snapshot is taken every `SnapshotPolicy.every_events` events, or after
`every_s` seconds once at least `min_events` happened, and at a clean stop.
It is encoded on the event loop, between two event batches, so it is the
state after exactly the last event the engine applied (a listener tracks
which seqs were applied; while one is missing, no snapshot is taken).
Compression and the checksum run in a worker thread; the body goes to
SQLite in 1 MiB transactions of its own, committed by the log's writer
thread between group commits, so an append waits for one chunk at most.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from loguru import logger

from events.log import EventLog
from events.snapshots import SnapshotHeader
from events.types import Envelope
from projections.asw import Asw
from volfsm.desired.dsw import DesiredStateOfWorld
from volfsm.engine.handler import CommandHandler
from volfsm.engine.index import EngineIndex
from volfsm.engine.snapshot import (
    SnapshotPolicy,
    StartupReport,
    encode_state,
    restore,
    save_state,
)

_logger = logger.bind(logger_name="volfsm.engine.snapshot")


@dataclass
class SnapshotStats:
    """What the writer did since start."""

    written: int = 0
    failed: int = 0
    last_seq: int = 0
    last_bytes: int = 0
    last_encode_s: float = 0.0
    last_error: str = ""
    waiting: str = ""
    """Why no snapshot can be taken now ("" if one can)."""


@dataclass
class EngineSnapshots:
    """Restores the engine's state at start and writes snapshots while it runs."""

    log: EventLog
    asw: Asw
    dsw: DesiredStateOfWorld
    index: EngineIndex
    policy: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    startup: StartupReport | None = None
    stats: SnapshotStats = field(default_factory=SnapshotStats)
    _applied: int = 0
    """Every event up to this seq reached the engine's state (and none after it, if
    `_ahead` is empty)."""
    _ahead: set[int] = field(default_factory=set)
    _base_seq: int = 0
    """Seq of the newest snapshot taken (written, being written, or failed) or restored:
    the policy counts events from here."""
    _stored_seq: int = 0
    """Seq of the newest snapshot written or restored."""
    _base_time: float = field(default_factory=time.monotonic)
    _saving: asyncio.Task[None] | None = None
    _attached: bool = False
    _stopped: bool = False
    _broken: str = ""

    @property
    def summary(self) -> str:
        """One line: what the start used (snapshot seq or "none: reason") and what it replayed."""
        if self.startup is None:
            return "state not rebuilt yet"
        return self.startup.summary()

    def restore(self) -> StartupReport:
        """Rebuild the engine's state from the log (blocking; run it in a thread)."""
        report = restore(
            self.log, self.asw, self.dsw, self.index, use_snapshots=self.policy.restore
        )
        self.startup = report
        self._applied = report.last_seq
        self._base_seq = report.snapshot.seq if report.snapshot is not None else 0
        self._stored_seq = self._base_seq
        self._base_time = time.monotonic()
        return report

    def attach(self, handler: CommandHandler) -> None:
        """Follow the appended events (subscribe after the engine's own listener)."""
        self._applied = max(self._applied, self.asw.last_seq)
        if not self._attached:
            handler.subscribe(self._on_envelopes)
            self._attached = True

    # -------------------------------------------------------------- listener

    def _on_envelopes(self, envs: list[Envelope]) -> None:
        if self._stopped:
            return
        applied = self._applied
        ahead = self._ahead
        for env in envs:
            seq = env.seq
            if seq == applied + 1:
                applied = seq
                while ahead and applied + 1 in ahead:
                    applied += 1
                    ahead.discard(applied)
            elif seq > applied:
                ahead.add(seq)
            elif not self._broken:
                self._broken = (
                    f"event {seq} reached the engine after event {applied}: snapshots of this "
                    "run could miss it, none are written any more"
                )
                _logger.warning("{}", self._broken)
        self._applied = applied
        self._check_due()

    def _due(self) -> bool:
        new = self._applied - self._base_seq
        if new >= self.policy.every_events:
            return True
        return (
            new >= self.policy.min_events
            and time.monotonic() - self._base_time >= self.policy.every_s
        )

    def _consistent(self) -> bool:
        """Whether the engine's state is exactly the fold up to `_applied`."""
        if self._broken:
            self.stats.waiting = self._broken
            return False
        if self._ahead:
            self.stats.waiting = (
                f"events after {self._applied} reached the engine before {self._applied + 1}"
            )
            return False
        if self.asw.last_seq != self._applied:
            self.stats.waiting = (
                f"the ASW is at seq {self.asw.last_seq}, the events seen end at {self._applied}"
            )
            return False
        self.stats.waiting = ""
        return True

    def _encode(self) -> tuple[int, bytes] | None:
        if not self._consistent() or self._applied <= self._stored_seq:
            return None
        t0 = time.perf_counter()
        data = encode_state(self.asw, self.dsw, self.index, self._applied)
        self.stats.last_encode_s = time.perf_counter() - t0
        return self._applied, data

    def _take(self) -> None:
        if self._saving is not None and not self._saving.done():
            return  # one save at a time; the next batch checks again
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # appended outside the loop: the next batch on the loop takes it
        encoded = self._encode()
        if encoded is None:
            return
        seq, data = encoded
        self._base_seq, self._base_time = seq, time.monotonic()
        self._saving = loop.create_task(self._save(seq, data), name="volfsm-snapshot")

    async def _save(self, seq: int, data: bytes) -> None:
        try:
            header = await asyncio.to_thread(self._write, seq, data)
        except Exception as exc:  # never take the engine down for a cache
            self.stats.failed += 1
            self.stats.last_error = f"snapshot at seq {seq} not written: {exc}"
            _logger.warning("{}", self.stats.last_error)
            return
        self.stats.written += 1
        self._stored_seq = max(self._stored_seq, header.seq)
        self.stats.last_seq = header.seq
        self.stats.last_bytes = header.size
        asyncio.get_running_loop().call_soon(self._check_due)  # due again while saving?

    def _check_due(self) -> None:
        if self.policy.write and not self._stopped and not self._broken and self._due():
            self._take()

    def _write(self, seq: int, data: bytes) -> SnapshotHeader:
        return save_state(self.log, seq, data, self.policy)

    # ------------------------------------------------------------ explicit

    async def wait_saved(self) -> None:
        """Wait for the snapshot being written, if any."""
        task = self._saving
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def snapshot_now(self) -> bool:
        """Store a snapshot of the current state now; whether the current state is stored.

        False if it cannot be taken now (`stats.waiting` says why) or the
        write failed (`stats.last_error`).
        """
        await self.wait_saved()
        encoded = self._encode()
        if encoded is None:
            return self._consistent() and self._stored_seq == self._applied > 0
        seq, data = encoded
        self._base_seq, self._base_time = seq, time.monotonic()
        self._saving = asyncio.get_running_loop().create_task(self._save(seq, data))
        await self.wait_saved()
        return self._stored_seq >= seq

    async def stop(self) -> None:
        """At a clean stop: finish the save in flight, write a last one (policy), stop following."""
        if self._stopped:
            return
        await self.wait_saved()
        if self.policy.write and self.policy.at_stop:
            await self.snapshot_now()
        self._stopped = True
