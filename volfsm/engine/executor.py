"""The operation executor: runs operations as asyncio tasks under pending-operation keys.

An `Operation` is what the operation generator (`operations.py`) built: a
name (kubelet's: volume_mount, unmount_device, ...), the key it locks, the
stream its records go to and the body that calls the plugin and fires the
FSM transitions. The executor

* asks `NestedPendingOperations` to start it, and drops it when the key is
  busy or backing off (the reconciler tries again on a later pass);
* appends `OperationStarted` before the body runs (so a log that ends there
  names the call that was in flight), and `OperationSucceeded` or
  `OperationFailed` (code, message, final, the backoff that follows,
  duration) after it; a body may leave its last transition on the
  operation's own stream (a mount's `VolumeMounted`) to the executor
  (`defer_final`), which appends it and `OperationSucceeded` in one append:
  one group commit, one wake-up of the waiting task, one listener call;
* releases the key, updating the backoff, only after the outcome is
  recorded, then tells the engine (which marks the volume for the next
  reconcile pass and wakes it).

`call_plugin` wraps every plugin call: a timeout becomes an UNCERTAIN
DeadlineExceeded, any exception that is not a `PluginError` an UNCERTAIN
"Unknown" (kubelet treats non-gRPC errors as non-final).

Stopping (`drain`) never cancels an operation in the middle of an append:
only plugin calls in flight are cancelled (Canceled, UNCERTAIN), so each
operation still fires its transitions and records its outcome, and the
live state stays equal to the log.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from loguru import logger as log

from events.types import Body, OperationFailed, OperationStarted, OperationSucceeded
from volfsm import faultpoints
from volfsm.engine.handler import CommandHandler
from volfsm.engine.pending import (
    AlreadyPendingError,
    ExponentialBackoffError,
    NestedPendingOperations,
    OperationKey,
)
from volfsm.plugins.base import ErrorClass, PluginError

T = TypeVar("T")

DEADLINE_EXCEEDED = "DeadlineExceeded"
CANCELED = "Canceled"
UNKNOWN = "Unknown"


class OperationCancelled(PluginError):
    """The operation's task was cancelled mid-call (shutdown): the call may still be running."""

    def __init__(self, what: str) -> None:
        super().__init__(CANCELED, f"{what} was cancelled", ErrorClass.UNCERTAIN)


@dataclass
class Operation:
    """One operation as the executor runs it."""

    name: str
    """Kubelet's operation name: volume_mount, map_volume, unmount_device, ..."""
    volume_id: str
    pod_key: str
    """Pod part of the pending-operations key ("" locks the whole volume)."""
    stream: str
    """Where OperationStarted/Succeeded/Failed go (podvol for pod ops, device otherwise)."""
    body: Callable[[], Awaitable[None]]
    pod_uid: str = ""
    plugin: str = ""
    reason: str = ""
    recorded: bool = True
    """False for bookkeeping operations that call no plugin (mark detached)."""
    op_id: str = ""
    failure: PluginError | None = field(default=None)
    final: Final | None = None
    """The operation's last transition, left by its body (`defer_final`) for the executor to
    append in one append with OperationSucceeded; None once appended or if there is none."""


Final = Callable[[Sequence[Body]], Awaitable[None]]
"""Fires an operation's last transition with these records appended after it (one append)."""

OnFinished = Callable[[Operation], None]

_CURRENT: contextvars.ContextVar[Operation | None] = contextvars.ContextVar(
    "volfsm_operation", default=None
)


def defer_final(stream: str, fire: Final) -> bool:
    """Leave `fire` (the last transition of the running operation, on `stream`) to the
    executor, which appends it together with the operation's OperationSucceeded: one
    append and one group commit instead of two. False (the caller fires now) outside a
    recorded operation or when the operation records to another stream."""
    op = _CURRENT.get()
    if op is None or not op.recorded or op.stream != stream or op.final is not None:
        return False
    op.final = fire
    return True


class OperationExecutor:
    """Starts operations under their keys, records their lifecycle, applies backoff."""

    def __init__(
        self,
        handler: CommandHandler,
        pending: NestedPendingOperations,
        *,
        on_finished: OnFinished | None = None,
        operation_timeout: float | None = 120.0,
    ) -> None:
        self.handler = handler
        self.pending = pending
        self.on_finished = on_finished
        self.operation_timeout = operation_timeout
        self.tasks: set[asyncio.Task[None]] = set()
        self._in_call: set[asyncio.Task[object]] = set()
        self._aborting = False
        self._ids = itertools.count(1)
        self._id_prefix = os.urandom(4).hex()
        self.started = 0
        self.refused = 0

    # -------------------------------------------------------------- starting

    def start(self, op: Operation) -> bool:
        """Start `op` unless its key is running or backing off; True if it started."""
        try:
            key = self.pending.start(op.volume_id, op.pod_key, op.name)
        except (AlreadyPendingError, ExponentialBackoffError):
            self.refused += 1
            return False
        op.op_id = self.new_op_id()
        task = asyncio.get_running_loop().create_task(self._run(op, key), name=op.op_id)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        self.started += 1
        return True

    def new_op_id(self) -> str:
        """A fresh operation id (also for the records of a step inside an operation)."""
        return f"{self._id_prefix}-{next(self._ids)}"

    # --------------------------------------------------------------- running

    async def _run(self, op: Operation, key: OperationKey) -> None:
        started = time.monotonic()
        cancelled = False
        faultpoints.operation(op.name, op.plugin, op.pod_uid, op.volume_id)
        _CURRENT.set(op)  # the task's own context: `defer_final` finds its operation
        try:
            if op.recorded:
                await self._record(op.stream, self._started_body(op))
            await op.body()
        except PluginError as exc:
            op.failure = exc
        except asyncio.CancelledError:
            op.failure, cancelled = OperationCancelled(op.name), True
        except Exception as exc:  # a bug or an I/O error in the engine itself
            log.exception("operation {} {} on {} failed", op.op_id, op.name, key)
            op.failure = PluginError(UNKNOWN, f"{type(exc).__name__}: {exc}", ErrorClass.UNCERTAIN)
        if op.failure is not None:
            op.final = None  # a failure after the body deferred it: never appended
        await self._finish(op, key, time.monotonic() - started)
        if cancelled:
            raise asyncio.CancelledError

    def _started_body(self, op: Operation) -> OperationStarted:
        return OperationStarted(
            op_id=op.op_id,
            operation=op.name,
            volume_id=op.volume_id,
            pod_uid=op.pod_uid,
            plugin=op.plugin,
            reason=op.reason,
        )

    async def _finish(self, op: Operation, key: OperationKey, duration: float) -> None:
        try:
            if op.final is not None:
                await self._fire_final(op, duration)
            if op.recorded and op.final is None:
                failure = op.failure
                if failure is None:
                    body: Body = OperationSucceeded(
                        op_id=op.op_id, operation=op.name, duration_s=round(duration, 6)
                    )
                else:
                    body = OperationFailed(
                        op_id=op.op_id,
                        operation=op.name,
                        code=failure.code,
                        message=failure.message,
                        final=failure.final,
                        backoff_s=self.pending.next_backoff(key),
                        duration_s=round(duration, 6),
                    )
                await self._record(op.stream, body)
        except Exception:  # the log is gone (shutdown): still release the key
            log.exception("could not record the outcome of {} {}", op.op_id, op.name)
        finally:
            self.pending.complete(key, None if op.failure is None else str(op.failure))
            if self.on_finished is not None:
                self.on_finished(op)

    async def _fire_final(self, op: Operation, duration: float) -> None:
        """The deferred last transition and OperationSucceeded in one append; a failure of
        that transition is the operation's failure (recorded by `_finish` as usual)."""
        final = op.final
        assert final is not None
        done = OperationSucceeded(op_id=op.op_id, operation=op.name, duration_s=round(duration, 6))
        try:
            await final([done])
        except PluginError as exc:
            op.failure, op.final = exc, None
            return
        except Exception as exc:  # an illegal transition, the log is gone, or a listener's bug
            log.exception("operation {} {}: its last transition failed", op.op_id, op.name)
            if not self._succeeded_in_log(op):
                error = PluginError(UNKNOWN, f"{type(exc).__name__}: {exc}", ErrorClass.UNCERTAIN)
                op.failure, op.final = error, None
            return
        faultpoints.hit("append.after", OperationSucceeded.__name__)

    def _succeeded_in_log(self, op: Operation) -> bool:
        """Whether op's OperationSucceeded is in the log (what raised came after the append:
        then the operation did succeed, and no OperationFailed may follow it)."""
        try:
            last = self.handler.log.read_stream(op.stream)[-1:]
        except Exception:
            return False
        body = last[0].body if last else None
        return isinstance(body, OperationSucceeded) and body.op_id == op.op_id

    async def _record(self, stream: str, body: Body) -> None:
        await self.handler.record_async(stream, [body])
        faultpoints.hit("append.after", type(body).__name__)

    # ---------------------------------------------------------- plugin calls

    async def call_plugin(
        self, what: str, call: Callable[[], Awaitable[T]], timeout: float | None = None
    ) -> T:
        """Await one plugin call with a timeout, normalising every failure to `PluginError`.

        `timeout` defaults to the executor's operation timeout.
        """
        limit = self.operation_timeout if timeout is None else timeout
        if self._aborting:
            raise OperationCancelled(what)
        task = asyncio.current_task()
        if task is not None:
            self._in_call.add(task)
        faultpoints.hit("driver.before", what)
        try:
            async with asyncio.timeout(limit):
                result = await faultpoints.in_flight("driver.during", call, what)
            faultpoints.hit("driver.after", what)
            return result
        except PluginError:
            faultpoints.hit("driver.after", what)
            raise
        except TimeoutError:
            raise PluginError(
                DEADLINE_EXCEEDED, f"{what} did not finish within {limit:g} s", ErrorClass.UNCERTAIN
            ) from None
        except asyncio.CancelledError:
            if not self._aborting or task is None:
                raise
            task.uncancel()  # our own abort: the operation goes on to record its outcome
            raise OperationCancelled(what) from None
        except Exception as exc:
            raise PluginError(
                UNKNOWN, f"{what}: {type(exc).__name__}: {exc}", ErrorClass.UNCERTAIN
            ) from exc
        finally:
            if task is not None:
                self._in_call.discard(task)

    # --------------------------------------------------------------- stopping

    @property
    def running(self) -> int:
        """Operations running now."""
        return len(self.tasks)

    async def drain(self, grace_s: float, abort_s: float = 5.0) -> None:
        """Let running operations finish for `grace_s`, then abort them.

        Aborting cancels the plugin calls in flight (and refuses new ones),
        never an append: each operation still records its transitions and its
        outcome (Canceled, not final), so the live state and the log agree.
        Operations not done `abort_s` later are cancelled outright.
        """
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=grace_s)
        self._aborting = True
        for task in list(self._in_call):
            task.cancel()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=abort_s)
        leftovers = set(self.tasks)
        for task in leftovers:
            task.cancel()
        if leftovers:
            await asyncio.gather(*leftovers, return_exceptions=True)
