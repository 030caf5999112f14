"""How the engine changes the object store: store first, then the log, then publish.

`ObjectKeeper.commit` writes the objects (durably, pending), records their
events together with the desired-state events of the same apply (one
group commit), then publishes them to readers and listeners. If the
events could not be recorded the writes are rolled back, so the store
never holds a change the log does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence

from loguru import logger as log

from events.log import EventLog
from events.streams import OBJECT_PREFIX
from events.types import Envelope
from volfsm.desired.plan import AppliedObject, DesiredChange, ObjectKey
from volfsm.objects.model import StoreWrite
from volfsm.objects.records import NO_RECORD, changes_of, last_event_in, recorded_at_start
from volfsm.objects.store import ObjectStore

Record = Callable[[Sequence[DesiredChange]], Awaitable[list[Envelope]]]


class ObjectKeeper:
    """The engine's writer of the object store (one commit at a time: the engine's lock)."""

    def __init__(self, store: ObjectStore, log_: EventLog, record: Record) -> None:
        self.store = store
        self.log = log_
        self.record = record

    async def open(self) -> None:
        """Open the store, settling what a crash left pending against the log."""
        await asyncio.to_thread(self.store.open, last_event_in(self.log))

    async def settle_start(self, desired_pods: Collection[str]) -> None:
        """Make the store and the log agree at start (the log decides which pods exist).

        A log with no object events beside a store that has objects (a lost
        or restored log, or one older than the store) gets an ObjectApplied
        for each stored object, saying why. A stored pod the desired state
        does not hold (its log was lost) is dropped from the store.
        """
        stale = [o for o in self.store.objects("Pod") if o.uid not in desired_pods]
        if self.log.has_stream(OBJECT_PREFIX, prefix=True):
            if stale:
                reason = "not in the desired state at start"
                await self.commit((), [o.key for o in stale], reason=reason)
            return
        if stale:
            await asyncio.to_thread(self.store.purge, [o.key for o in stale])
        kept = self.store.objects()
        if kept:
            log.warning(
                "object store: the log records none of its {} objects; recording them", len(kept)
            )
            await self.record(recorded_at_start(kept, NO_RECORD))

    async def commit(
        self,
        objects: Sequence[AppliedObject],
        deletes: Iterable[ObjectKey],
        desired: Sequence[DesiredChange] = (),
        reason: str = "",
    ) -> list[Envelope]:
        """Store `objects` and `deletes`, record them after `desired`, publish them.

        Returns the recorded envelopes. Raises what recording raised, with
        the store rolled back (unless the events did reach the log).
        """
        writes = await asyncio.to_thread(self.store.write, objects, list(deletes))
        changes = [*desired, *changes_of(writes, reason)]
        if not writes:
            return await self.record(changes) if changes else []
        task = asyncio.ensure_future(self.record(changes))
        try:
            envs = await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait([task])  # the append goes on in the log's writer: see how it ends
            await self._settle(writes, task)
            raise
        except BaseException:
            await self._settle(writes, task)
            raise
        self.store.publish(writes)
        return envs

    async def _settle(self, writes: list[StoreWrite], task: asyncio.Future[list[Envelope]]) -> None:
        """After a failed or cancelled record: publish what reached the log, roll back the rest."""
        if task.done() and not task.cancelled() and task.exception() is None:
            self.store.publish(writes)
            return
        last = last_event_in(self.log)
        logged = [w for w in writes if last(w.key) == (_expected(w), w.resource_version)]
        lost = [w for w in writes if w not in logged]
        if lost:
            log.warning("object store: {} change(s) not logged; rolled back", len(lost))
            await asyncio.to_thread(self.store.revert, lost)
        if logged:
            self.store.publish(logged)


def _expected(write: StoreWrite) -> str:
    return "ObjectDeleted" if write.deleted else "ObjectApplied"
