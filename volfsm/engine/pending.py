"""Operation dedupe and per-key exponential backoff: kubelet's nestedpendingoperations.

Every operation runs under a key (volume, pod). An empty pod means the whole
volume: it conflicts with every operation on that volume, in both
directions; (volume, pod) conflicts with (volume, "") and with itself, not
with (volume, other pod). An empty volume never conflicts with anything.

`start` is kubelet's `Run` without the goroutine: it refuses a conflicting
request (`AlreadyPendingError`, the request is dropped, not queued) or one
still in backoff under the same operation name (`ExponentialBackoffError`),
and otherwise marks the matching entry (or a new one) pending. `complete`
is `operationComplete`: success deletes the entry (which resets backoff); a
failure keeps it, not pending, and grows its backoff 0.5 s, 1 s, ... up to
2 min 2 s. "Pending" means running, never "backing off".

Two details follow the Go code rather than the prose around it:

* a backoff is reset when a *different* operation name arrives **while the
  entry is still in its backoff window**; after the window has passed the
  entry is reused with its old name and its old duration (so the next
  failure doubles it);
* among several matching entries, a running one wins at once, otherwise the
  exact-key match is preferred over the first non-exact one (#88355).

One deliberate difference: kubelet deletes an entry by swapping the last
entry into its slot, so "the first non-exact match" depends on deletion
history. Entries here keep their insertion order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from volfsm.errors import VolfsmError

EMPTY_POD = ""
"""The pod part of a whole-volume (device-level or serialised) key."""


@dataclass(frozen=True, slots=True)
class OperationKey:
    """What an operation locks: a volume, and a pod or the whole volume ("")."""

    volume_id: str
    pod: str = EMPTY_POD

    def __str__(self) -> str:
        return f"{self.volume_id}" + (f" pod {self.pod}" if self.pod else "")


class AlreadyPendingError(VolfsmError):
    """A conflicting operation is running; the new one was dropped (kubelet AlreadyExists)."""

    def __init__(self, key: OperationKey, running: OperationKey, operation: str) -> None:
        super().__init__(f"an operation ({operation}) is already running on {running}")
        self.key = key
        self.running = running
        self.operation = operation


class ExponentialBackoffError(VolfsmError):
    """The same operation failed recently; no retry is permitted until `retry_at`."""

    def __init__(self, key: OperationKey, operation: str, backoff: ExponentialBackoff) -> None:
        super().__init__(
            f"{operation} on {key}: no retries permitted for {backoff.duration:g} s "
            f"after the last failure: {backoff.last_error}"
        )
        self.key = key
        self.operation = operation
        self.duration = backoff.duration
        self.retry_at = backoff.retry_at
        self.last_error = backoff.last_error


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Kubelet's exponential backoff: first failure `initial`, then x`factor`, capped."""

    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 122.0
    enabled: bool = True


@dataclass(slots=True)
class ExponentialBackoff:
    """The backoff state of one entry (`durationBeforeRetry`, `lastErrorTime`)."""

    duration: float = 0.0
    last_error_at: float | None = None
    last_error: str = ""

    def next_duration(self, policy: BackoffPolicy) -> float:
        """The duration the next failure will set."""
        if self.duration == 0.0:
            return policy.initial
        return min(self.duration * policy.factor, policy.maximum)

    def update(self, policy: BackoffPolicy, now: float, error: str) -> None:
        """Record a failure at `now`."""
        self.duration = self.next_duration(policy)
        self.last_error_at = now
        self.last_error = error

    def in_backoff(self, now: float) -> bool:
        """Kubelet's `SafeToRetry` failing: now - lastErrorTime <= durationBeforeRetry."""
        return self.last_error_at is not None and now - self.last_error_at <= self.duration

    @property
    def retry_at(self) -> float | None:
        """When a retry is permitted again (None if the entry never failed)."""
        if self.last_error_at is None:
            return None
        return self.last_error_at + self.duration


@dataclass(slots=True)
class _Entry:
    key: OperationKey
    operation: str
    pending: bool = True
    backoff: ExponentialBackoff = field(default_factory=ExponentialBackoff)


class NestedPendingOperations:
    """The table of running and backing-off operations, keyed as kubelet keys them."""

    def __init__(
        self,
        policy: BackoffPolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy or BackoffPolicy()
        self.clock = clock
        self._by_volume: dict[str, list[_Entry]] = {}
        self._unkeyed: list[_Entry] = []
        self._count = 0
        self._running = 0
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._idle_waiters: list[asyncio.Future[None]] = []

    # ---------------------------------------------------------------- lookup

    def _find(self, key: OperationKey) -> _Entry | None:
        """Kubelet's `isOperationExists`: a running match wins, then exact, then first."""
        if not key.volume_id:
            return None
        chosen: _Entry | None = None
        for entry in self._by_volume.get(key.volume_id, ()):
            other = entry.key.pod
            if other != key.pod and other and key.pod:
                continue
            if entry.pending:
                return entry
            if chosen is None or other == key.pod:
                chosen = entry
        return chosen

    def _exact(self, key: OperationKey) -> _Entry | None:
        """Kubelet's `getOperation`: the entry with exactly this key."""
        entries = self._by_volume.get(key.volume_id, ()) if key.volume_id else self._unkeyed
        for entry in entries:
            if entry.key == key:
                return entry
        return None

    # -------------------------------------------------------------- run/done

    def start(self, volume_id: str, pod: str, operation: str) -> OperationKey:
        """Mark an operation running under (volume_id, pod), or refuse it.

        Raises `AlreadyPendingError` if a matching entry is running and
        `ExponentialBackoffError` if it is backing off under the same
        operation name. Returns the key to pass to `complete`.
        """
        key = OperationKey(volume_id, pod)
        entry = self._find(key)
        if entry is not None:
            if entry.pending:
                raise AlreadyPendingError(key, entry.key, entry.operation)
            if entry.backoff.in_backoff(self.clock()):
                if entry.operation == operation:
                    raise ExponentialBackoffError(key, operation, entry.backoff)
                entry.operation = operation
                entry.backoff = ExponentialBackoff()
            entry.pending = True
            entry.key = key
        else:
            entry = _Entry(key=key, operation=operation)
            if volume_id:
                self._by_volume.setdefault(volume_id, []).append(entry)
            else:
                self._unkeyed.append(entry)
            self._count += 1
        self._running += 1
        return key

    def next_backoff(self, key: OperationKey) -> float:
        """The backoff `complete(key, error)` would set now (0 if backoff is disabled)."""
        entry = self._exact(key)
        if entry is None or not self.policy.enabled:
            return 0.0
        return entry.backoff.next_duration(self.policy)

    def complete(self, key: OperationKey, error: str | None = None) -> float:
        """The operation under `key` finished; `error` is None on success.

        Returns the backoff the failure set (0.0 on success).
        """
        entry = self._exact(key)
        if entry is None:
            return 0.0
        if entry.pending:
            entry.pending = False
            self._running -= 1
        duration = 0.0
        if error is None or not self.policy.enabled:
            self._delete(entry)
        else:
            entry.backoff.update(self.policy, self.clock(), error)
            duration = entry.backoff.duration
        self._notify()
        return duration

    def restore(
        self, volume_id: str, pod: str, operation: str, duration: float, retry_at: float, error: str
    ) -> None:
        """Seed a backing-off entry (after a restart, from the log): retry allowed at `retry_at`.

        Kubelet starts every backoff from zero after a restart; volfsm reads
        the failure and its backoff from the log. Ignored if a matching entry
        exists or the backoff is already over.
        """
        if not volume_id or not self.policy.enabled or retry_at <= self.clock():
            return
        key = OperationKey(volume_id, pod)
        if self._find(key) is not None:
            return
        backoff = ExponentialBackoff(duration, retry_at - duration, error)
        entry = _Entry(key=key, operation=operation, pending=False, backoff=backoff)
        self._by_volume.setdefault(volume_id, []).append(entry)
        self._count += 1

    def _delete(self, entry: _Entry) -> None:
        vid = entry.key.volume_id
        if not vid:
            self._unkeyed.remove(entry)
        else:
            entries = self._by_volume[vid]
            entries.remove(entry)
            if not entries:
                del self._by_volume[vid]
        self._count -= 1

    # --------------------------------------------------------------- queries

    def is_operation_pending(self, volume_id: str, pod: str = EMPTY_POD) -> bool:
        """True if an operation matching (volume_id, pod) is running (not backing off)."""
        entry = self._find(OperationKey(volume_id, pod))
        return entry is not None and entry.pending

    def running_keys(self) -> list[OperationKey]:
        """The keys of the operations running now (not those backing off)."""
        return [e.key for entries in self._by_volume.values() for e in entries if e.pending]

    def is_operation_safe_to_retry(self, volume_id: str, pod: str, operation: str) -> bool:
        """False if a match is running, or backing off under the same operation name."""
        entry = self._find(OperationKey(volume_id, pod))
        if entry is None:
            return True
        if entry.pending:
            return False
        return not (entry.backoff.in_backoff(self.clock()) and entry.operation == operation)

    def retry_at(self, volume_id: str, pod: str = EMPTY_POD) -> float | None:
        """When the matching entry's backoff ends (clock seconds); None if none applies."""
        entry = self._find(OperationKey(volume_id, pod))
        if entry is None or entry.pending or not entry.backoff.in_backoff(self.clock()):
            return None
        return entry.backoff.retry_at

    def __len__(self) -> int:
        """Entries held: running or backing off."""
        return self._count

    @property
    def running(self) -> int:
        """How many operations are running now."""
        return self._running

    # ----------------------------------------------------------------- waits

    def _notify(self) -> None:
        if self._count == 0:
            _resolve_all(self._drain_waiters)
        if self._running == 0:
            _resolve_all(self._idle_waiters)

    async def wait(self) -> None:
        """Kubelet's `Wait()`: until no entry is left (failed entries stay until they succeed)."""
        if self._count == 0:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(fut)
        await fut

    async def wait_idle(self) -> None:
        """Until no operation is running (entries in backoff may remain)."""
        if self._running == 0:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(fut)
        await fut


def _resolve_all(waiters: list[asyncio.Future[None]]) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(None)
    waiters.clear()
