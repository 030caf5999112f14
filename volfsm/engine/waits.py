"""Waiting for a pod to be mounted or unmounted (`VolumeEngine.wait_pod`).

A waiter is woken by the events that can change its answer (the engine's
listener calls `PodWaiters.check` for the pod of each desired-state and
pod-volume event), never by polling. A timeout names each volume still in
the way, its state and last error, instead of kubelet's catch-all "timed
out waiting for the condition".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from events.tables import MOUNTED, UNMOUNTED
from events.types import PodAdded, PodPending
from projections.asw import Asw
from volfsm.engine.status import PodStatus
from volfsm.errors import VolfsmError

WaitFor = Literal["mounted", "unmounted"]


class PodWaitTimeoutError(VolfsmError, TimeoutError):
    """`wait_pod` timed out; `status` says where each volume stands and why."""

    def __init__(self, uid: str, for_: str, timeout: float, status: PodStatus | None) -> None:
        self.uid = uid
        self.for_ = for_
        self.status = status
        super().__init__(f"pod {uid}: not {for_} after {timeout:g} s: {_explain(status, for_)}")


def _explain(status: PodStatus | None, for_: str) -> str:
    """Which volumes hold the pod back, with their state and last error (not a catch-all)."""
    if status is None:
        return "the engine does not know this pod"
    if for_ == "mounted" and not status.desired:
        return "the pod is not in the desired state"
    parts = []
    for vol in status.volumes:
        if (for_ == "mounted" and vol.state == MOUNTED) or (
            for_ == "unmounted" and vol.state == UNMOUNTED
        ):
            continue
        err = vol.last_error
        why = f"; last error {err.operation} {err.code}: {err.message}" if err else ""
        if vol.waiting:
            why = f"; waiting: {vol.waiting}{why}"
        parts.append(f"{vol.name} is {vol.state}{why}")
    if for_ == "unmounted" and status.desired:
        parts.insert(0, "the pod is still desired")
    return "; ".join(parts) or "waiting"


class DesiredPods(Protocol):
    """The pods the desired state holds."""

    pods: dict[str, PodAdded]
    pending: dict[str, PodPending]


class PodHolds(Protocol):
    """Whether a pod still holds a volume (the reconciler)."""

    def pod_holds_any(self, uid: str) -> bool:
        """Whether any of the pod's volumes is Mounted or Uncertain."""


@dataclass
class _Waiter:
    for_: WaitFor
    future: asyncio.Future[None] = field(repr=False)


class PodWaiters:
    """Who waits for which pod, and the answer to "is it mounted / unmounted yet"."""

    def __init__(self, *, asw: Asw, dsw: DesiredPods, holds: PodHolds) -> None:
        self.asw = asw
        self.dsw = dsw
        self.holds = holds
        self.by_pod: dict[str, list[_Waiter]] = {}
        """The waiters per pod uid (empty when nobody waits: the listener's fast path)."""

    def pod_is(self, uid: str, for_: WaitFor) -> bool:
        """Whether the pod is "mounted" (desired, every volume Mounted; Uncertain does not
        count) or "unmounted" (not desired, and none of its volumes Mounted or Uncertain)."""
        if for_ == "mounted":
            pod = self.dsw.pods.get(uid)
            if pod is None:
                return False
            podvols = self.asw.podvols
            for dv in pod.volumes:
                pv = podvols.get((uid, dv.name))
                if pv is None or pv.state != MOUNTED:
                    return False
            return True
        dsw = self.dsw
        return uid not in dsw.pods and uid not in dsw.pending and not self.holds.pod_holds_any(uid)

    def check(self, uid: str) -> None:
        """Wake the pod's waiters whose answer is now yes."""
        waiters = self.by_pod.get(uid)
        if not waiters:
            return
        for waiter in waiters:
            if not waiter.future.done() and self.pod_is(uid, waiter.for_):
                waiter.future.set_result(None)

    def fail_all(self, exc: BaseException) -> None:
        """End every wait with `exc` (the engine stopped)."""
        for waiters in self.by_pod.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(exc)
        self.by_pod.clear()

    async def wait(
        self,
        uid: str,
        for_: WaitFor,
        timeout: float | None,
        status: Callable[[str], PodStatus | None],
    ) -> None:
        """Return once `pod_is(uid, for_)`; `PodWaitTimeoutError` (with `status(uid)`) if
        `timeout` seconds pass first."""
        if self.pod_is(uid, for_):
            return
        waiter = _Waiter(for_, asyncio.get_running_loop().create_future())
        self.by_pod.setdefault(uid, []).append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(waiter.future)
        except TimeoutError:
            raise PodWaitTimeoutError(uid, for_, timeout or 0.0, status(uid)) from None
        finally:
            waiters = self.by_pod.get(uid, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self.by_pod.pop(uid, None)
