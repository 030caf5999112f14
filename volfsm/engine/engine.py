"""The volume engine: the kubelet VolumeManager's job as an asyncio object.

`VolumeEngine` owns the desired state (DSW), the actual state (the ASW
projection of the log, kept live from every appended event), the
reconciler and the operation executor. Its API is what the service (NATS
command intake, CLI) calls:

    engine = VolumeEngine(log, root_dir, plugins, EngineConfig())
    await engine.start()                      # fold the log, reconstruct, reconcile
    result = await engine.apply(objects)      # Pod / PV / PVC / ConfigMap / Secret / ... dicts
    engine.objects.config_map("default", "app")  # the node's object store (volfsm.objects)
    await engine.wait_pod(uid, for_="mounted", timeout=30)
    await engine.delete_pod(namespace="default", name="web")
    engine.pods(); engine.volumes()           # status
    await engine.stop(grace_s=5)

Every change of desired state is recorded as desired-state events before
the engine acts on it, and every operation records its start and outcome,
so a replay of the log shows what the engine wanted, did and saw.

At start, after the fold, reconstruction (`volfsm.engine.reconstruct`)
checks the log's beliefs against the node once before the first reconcile
pass: operations the process died in, mounts that vanished and entries the
log does not know become Uncertain with their reasons; what cannot be
reconstructed is cleaned up once the desired state is complete.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from events.log import EventLog
from events.types import (
    Envelope,
    PodAdded,
    PodPending,
    PodRemoved,
    VolumeMounted,
    VolumeSource,
)
from projections.asw import Asw
from volfsm.desired.dsw import DesiredChange, DesiredStateOfWorld
from volfsm.desired.plan import ApplyResult as ObjectResult
from volfsm.desired.plan import SkippedObject
from volfsm.engine.compact import release_free_memory, share_state
from volfsm.engine.config import EngineConfig
from volfsm.engine.executor import Operation, OperationExecutor
from volfsm.engine.failures import restore_failures
from volfsm.engine.handler import CommandHandler
from volfsm.engine.index import EngineIndex
from volfsm.engine.operations import (
    OperationGenerator,
)
from volfsm.engine.pending import BackoffPolicy, NestedPendingOperations
from volfsm.engine.reconciler import Reconciler
from volfsm.engine.reconstruct import ReconstructionReport, Reconstructor
from volfsm.engine.snapshotter import EngineSnapshots
from volfsm.engine.status import (
    PodStatus,
    VolumeStatus,
)
from volfsm.engine.statusview import StatusView
from volfsm.engine.volstats import VolumeStatsGatherer
from volfsm.engine.waits import PodWaiters, WaitFor
from volfsm.errors import VolfsmError
from volfsm.node.layout import RootLayout
from volfsm.objects import ObjectKeeper, ObjectStore, listing
from volfsm.objects.deletion import plan_delete, pod_object_key, stored_pods, stored_volumes
from volfsm.plugins.base import SpecConstructor, VolumePlugin


class PluginCatalogLike(Protocol):
    """What the engine needs of the plugin catalog."""

    def find(self, source: VolumeSource) -> VolumePlugin:
        """The plugin serving `source` (TRANSIENT `PluginError` if none)."""

    def can_serve(self, source: VolumeSource, volume_mode: str) -> str | None:
        """None if a plugin can serve `source` in `volume_mode`, else why not."""

    def spec_constructors(self) -> list[SpecConstructor]:
        """The plugins' reconstruction hooks, one per plugin name."""


class EngineNotRunningError(VolfsmError):
    """The engine was not started, or was stopped."""


@dataclass(frozen=True)
class ApplyResult:
    """What an apply did: a line per object, and the desired-state events it recorded."""

    objects: tuple[ObjectResult, ...] = ()
    events: tuple[Envelope, ...] = ()
    deleted: tuple[tuple[str, str, str], ...] = ()
    """(uid, namespace, name) of the pods an apply with `complete` removed."""
    skipped: tuple[SkippedObject, ...] = ()
    """Objects of kinds a node does not run (Deployment, Service, ...): not applied."""

    @property
    def changed(self) -> bool:
        """Whether anything was recorded."""
        return bool(self.events)


class VolumeEngine:
    """DSW + ASW + reconciler + executor, started and stopped in an asyncio program."""

    def __init__(
        self,
        log: EventLog,
        root_dir: Path | str,
        plugins: PluginCatalogLike,
        config: EngineConfig | None = None,
    ) -> None:
        self.log = log
        self.config = config or EngineConfig()
        self.layout = RootLayout(root_dir)
        self.plugins = plugins
        self.handler = CommandHandler(log)
        self.asw = Asw()
        self.dsw = DesiredStateOfWorld(plugins.can_serve, node_name=log.node)
        self.index = EngineIndex(self.dsw)
        cfg = self.config
        self.pending = NestedPendingOperations(
            BackoffPolicy(
                initial=cfg.backoff_initial, factor=cfg.backoff_factor, maximum=cfg.backoff_max
            )
        )
        self.executor = OperationExecutor(
            self.handler,
            self.pending,
            on_finished=self._on_operation_finished,
            operation_timeout=cfg.operation_timeout,
        )
        self.generator = OperationGenerator(
            handler=self.handler,
            asw=self.asw,
            sizes=self.dsw,
            holders=self.index,
            plugins=plugins,
            layout=self.layout,
            executor=self.executor,
            wait_for_attach_timeout=cfg.wait_for_attach_timeout,
        )
        self.reconciler = Reconciler(
            asw=self.asw,
            dsw=self.dsw,
            index=self.index,
            pending=self.pending,
            executor=self.executor,
            generator=self.generator,
            layout=self.layout,
            config=cfg,
        )
        self.reconstructor = Reconstructor(
            log=log,
            handler=self.handler,
            asw=self.asw,
            dsw=self.dsw,
            index=self.index,
            ops=self.generator,
            layout=self.layout,
            registry=self.reconciler,
            plugins=plugins,
        )
        self.reconciler.orphan_cleanup = self.reconstructor.start_orphan_cleanup
        self.reconstructor.on_found = self._found_unknown
        self.volstats = VolumeStatsGatherer(
            asw=self.asw,
            index=self.index,
            plugins=plugins,
            recorder=self.handler,
            root=self.layout.root,
            period=cfg.volume_stats_period,
            jitter=cfg.volume_stats_jitter,
        )
        self.objects = ObjectStore.beside(log.path)
        """The node's object store (`volfsm.objects`): what the volume plugins read."""
        self.keeper = ObjectKeeper(self.objects, log, self._record)
        self.waiters = PodWaiters(asw=self.asw, dsw=self.dsw, holds=self.reconciler)
        self.status = StatusView(
            asw=self.asw, dsw=self.dsw, index=self.index, rwop=self.reconciler.rwop,
            volstats=self.volstats,
        )  # fmt: skip
        self._change_lock = asyncio.Lock()
        self._loop_task: asyncio.Task[None] | None = None
        self._running = False
        self._stopped = False

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Fold the log into ASW, DSW and index, reconstruct, then start reconciling."""
        if self._running or self._stopped:
            raise EngineNotRunningError("an engine starts once")
        await asyncio.to_thread(self._fold_log)
        await self.keeper.open()
        self.dsw.remember(*stored_volumes(self.objects))
        self.dsw.remember_pods(stored_pods(self.objects))
        for uid in list(self.index.removed_pods):
            self.reconciler.queue_pod_cleanup(uid)
        restore_failures(
            asw=self.asw, dsw=self.dsw, index=self.index, pending=self.pending,
            generator=self.generator, reconciler=self.reconciler,
        )  # fmt: skip
        self.handler.subscribe(self._on_envelopes)
        self.snapshots.attach(self.handler)  # after the engine's listener: sees applied state
        fresh = self.asw.last_seq == 0
        await self.reconstructor.run()  # its marks reach ASW and index through the listener
        if fresh and not self.reconciler.desired_complete and self._node_was_empty():
            # Nothing was ever mounted here by anyone: there is nothing a late
            # desired state could still claim, so waiting would only delay deletes.
            self.reconciler.set_desired_complete("fresh node: empty log, nothing found on it")
        await self.keeper.settle_start({*self.dsw.pods, *self.dsw.pending})
        gc.freeze()  # the state just built stays: full collections no longer walk it
        release_free_memory()
        self._running = True
        self.reconciler.mark_all_dirty()
        loop = asyncio.get_running_loop()
        self.reconciler.start_grace(loop)
        self._loop_task = loop.create_task(self.reconciler.run(), name="volfsm-reconciler")
        self.handler.subscribe(self.volstats.observe)
        self.volstats.start()

    def _found_unknown(self, count: int) -> None:
        """Reconstruction found volumes the log has no record of: the log was lost or is
        behind (or another tool wrote into the root dir); only being told opens the gate now."""
        entries = "entry" if count == 1 else "entries"
        self.reconciler.hold_until_told(
            f"the log has no record of {count} volume {entries} found on the node"
            " (the log was lost or is behind, or another tool wrote there)"
        )

    def _node_was_empty(self) -> bool:
        """Reconstruction ran cleanly and found nothing on the node."""
        report = self.reconstruction
        return (
            report is not None
            and not report.error
            and not report.uncertain
            and not report.orphans
            and not report.interrupted
            and report.reconstructed == 0
        )

    def _fold_log(self) -> None:
        """Rebuild ASW, DSW and index: newest good snapshot + the events after it (see
        `volfsm.engine.snapshot`); `self.snapshots.summary` says what was used."""
        self.snapshots = EngineSnapshots(
            self.log, self.asw, self.dsw, self.index, self.config.snapshots
        )
        self.snapshots.restore()
        share_state(self.asw, self.dsw.desired_entries(), self.index)
        self.reconciler.columns.rebuild()

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop reconciling; let running operations finish for `grace_s`, then cancel them.

        A cancelled operation records OperationFailed (Canceled, not final)
        and leaves its entry Uncertain if it got as far as the plugin.
        """
        if not self._running:
            return
        self._running = False
        self._stopped = True
        self.reconciler.stop()
        await self.volstats.stop()
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        await self.executor.drain(grace_s)
        await self.reconciler.wait_cleanup()
        await self.reconstructor.wait()
        await self.snapshots.stop()  # the final state, so that the next start replays nothing
        gc.unfreeze()
        await asyncio.to_thread(self.objects.close)
        self.waiters.fail_all(EngineNotRunningError("the engine stopped"))

    @property
    def running(self) -> bool:
        """Started and not stopped."""
        return self._running

    @property
    def alive(self) -> bool:
        """Running, and the reconciler loop has not died (what `/healthz` reports)."""
        task = self._loop_task
        return self._running and task is not None and not task.done()

    def _require_running(self) -> None:
        if not self._running:
            raise EngineNotRunningError("the volume engine is not running")
        if self._loop_task is not None and self._loop_task.done():
            exc = self._loop_task.exception() if not self._loop_task.cancelled() else None
            raise EngineNotRunningError(f"the reconciler stopped: {exc!r}")

    # -------------------------------------------------------- desired state

    async def apply(
        self, objects: Sequence[Mapping[str, Any]], *, complete: bool = False
    ) -> ApplyResult:
        """Validate and apply Pods, PVs, PVCs and the objects pods refer to: all or nothing.

        Raises `InvalidObjectError` (every problem at once; nothing recorded).
        Otherwise the objects are kept in the object store, the
        desired-state and object events are recorded (durably) before this
        returns, and the reconciler is woken. Objects of kinds a node does
        not run are not applied: `ApplyResult.skipped` lists them.

        With `complete` the objects are the node's whole desired state: the
        pods they do not name are removed (in the same group commit, listed
        in `ApplyResult.deleted`), then the desired state is declared
        complete, so unmounts of what no pod wants may start. PVs and PVCs
        not named stay remembered (they mount nothing by themselves).
        """
        self._require_running()
        async with self._change_lock:
            plan = self.dsw.plan_apply(objects, self.objects)
            changes = list(plan.changes)
            deleted: list[PodAdded | PodPending] = []
            if complete:
                named = plan.pod_uids
                removed = {c.body.pod_uid for c in changes if isinstance(c.body, PodRemoved)}
                desired: list[tuple[str, PodAdded | PodPending]] = [
                    *self.dsw.pods.items(),
                    *self.dsw.pending.items(),
                ]
                for uid, pod in desired:
                    if uid not in named and uid not in removed:
                        changes.extend(self.dsw.plan_delete_pod(uid=uid))
                        deleted.append(pod)
            gone = [pod_object_key(self.objects, p.pod_uid, p.namespace, p.name) for p in deleted]
            deletes = [key for key in gone if key is not None]
            envs = await self.keeper.commit(plan.stored_changes, deletes, changes)
            self.dsw.commit_objects(plan)
        if complete:
            self.set_desired_complete("told: apply --complete")
        return ApplyResult(
            objects=tuple(plan.results),
            events=tuple(envs),
            deleted=tuple((p.pod_uid, p.namespace, p.name) for p in deleted),
            skipped=tuple(plan.skipped),
        )

    async def wake_csi_drivers(self, drivers: Collection[str]) -> list[Envelope]:
        """CSI drivers registered on this node: resolve again the pending pods waiting for
        them and record what follows (`PodAdded`, or a `PodPending` with new reasons), as an
        apply of an object a pending pod waits for does. Returns the recorded envelopes."""
        self._require_running()
        async with self._change_lock:
            changes = self.dsw.plan_wake_drivers(drivers)
            return await self.keeper.commit((), (), changes) if changes else []

    async def delete_pod(
        self, uid: str | None = None, namespace: str | None = None, name: str | None = None
    ) -> bool:
        """Remove a pod (by uid, or namespace and name) from the desired state.

        Returns False if there was no such pod. Its volumes are then
        unmounted; `wait_pod(uid, for_="unmounted")` waits for that.
        """
        self._require_running()
        async with self._change_lock:
            changes = self.dsw.plan_delete_pod(uid=uid, namespace=namespace, name=name)
            keys = [
                pod_object_key(self.objects, c.body.pod_uid, c.body.namespace, c.body.name)
                for c in changes
                if isinstance(c.body, PodRemoved)
            ]
            await self.keeper.commit((), [k for k in keys if k is not None], changes)
        return bool(changes)

    async def delete_object(self, kind: str, namespace: str, name: str) -> bool:
        """Delete a stored object other than a Pod (see `volfsm.objects.deletion`).

        False if there is none; `InvalidObjectError` for a PV or PVC a
        desired pod uses.
        """
        self._require_running()
        async with self._change_lock:
            key = plan_delete(self.objects, self.dsw, kind, namespace, name)
            if key is None:
                return False
            await self.keeper.commit((), [key])
            if kind == "PersistentVolume":
                self.dsw.forget_volume(name)
            elif kind == "PersistentVolumeClaim":
                self.dsw.forget_claim(key[1], name)
        return True

    def object_listing(self, what: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """`get <what>` of stored objects (`volfsm.objects.LISTS`); never a Secret's value."""
        return listing(self.objects, what, namespace)

    async def _record(self, changes: Sequence[DesiredChange]) -> list[Envelope]:
        """Record changes in order, one append per stream run, all in one group commit."""
        batches: list[tuple[str, list[Any]]] = []
        for change in changes:
            if batches and batches[-1][0] == change.stream:
                batches[-1][1].append(change.body)
            else:
                batches.append((change.stream, [change.body]))
        results = await asyncio.gather(
            *(self.handler.record_async(stream, bodies) for stream, bodies in batches)
        )
        return [env for envs in results for env in envs]

    def set_desired_complete(self, reason: str = "told") -> None:
        """Declare the desired state complete: unmounts, unstages and detaches may start."""
        self.reconciler.set_desired_complete(reason)

    @property
    def desired_complete(self) -> bool:
        """Whether unmounts may start (told, or the grace period passed)."""
        return self.reconciler.desired_complete

    @property
    def reconstruction(self) -> ReconstructionReport | None:
        """What reconstruction found and did; None until it is done."""
        return self.reconstructor.report

    def recovery_status(self) -> dict[str, Any]:
        """Reconstruction, orphans, stuck pod dirs and the desired-state gate, as plain data."""
        report = self.reconstruction
        reconciler = self.reconciler
        left = reconciler.grace_left() if self._running else None
        return {
            "reconstruction": report.as_dict() if report is not None else None,
            "desired_complete": reconciler.desired_complete,
            "desired_complete_reason": reconciler.complete_reason,
            "desired_grace_left_s": round(left, 3) if left is not None else None,
            "desired_gate": reconciler.gate,
            "desired_wait_reason": "" if reconciler.desired_complete else reconciler.until_told,
            "pod_dir_failures": dict(reconciler.pod_dir_failures),
        }

    def remount(self, uid: str) -> int:
        """Ask for SetUp again on each Mounted volume of a desired pod (kubelet remountRequired).

        Returns how many pod-volumes were marked. A failing remount leaves
        the volume Mounted (success is never downgraded) and is retried with
        backoff until it succeeds.
        """
        pod = self.dsw.pods.get(uid)
        if pod is None:
            return 0
        for dv in pod.volumes:
            self.reconciler.request_remount((uid, dv.name))
        self.reconciler.mark_many_dirty(dv.volume_id for dv in pod.volumes)
        self.reconciler.wake()
        return len(pod.volumes)

    def remount_volumes(self, uid: str, names: Collection[str]) -> int:
        """Ask for SetUp again on these volumes of a desired pod (an object they show changed,
        a token is due); returns how many were marked."""
        pod = self.dsw.pods.get(uid)
        if pod is None:
            return 0
        marked = [dv for dv in pod.volumes if dv.name in names]
        for dv in marked:
            self.reconciler.request_remount((uid, dv.name))
        self.reconciler.mark_many_dirty(dv.volume_id for dv in marked)
        if marked:
            self.reconciler.wake()
        return len(marked)

    # ------------------------------------------------------------ live feed

    def _on_envelopes(self, envs: list[Envelope]) -> None:
        """Every appended batch: keep ASW, DSW and index live; wake the reconciler on change."""
        woke = False
        reconciler = self.reconciler
        columns = reconciler.columns
        for env in envs:
            touched = columns.touched_by(env)
            self.asw.apply(env)
            body = env.body
            kind = type(body).KIND
            if kind == "desired":
                vids = self.index.apply(env)
                self.dsw.observe(env)
                if vids:
                    reconciler.mark_many_dirty(vids)
                    woke = True
                if isinstance(body, PodAdded | PodRemoved):
                    if isinstance(body, PodRemoved):
                        reconciler.queue_pod_cleanup(body.pod_uid)
                        if reconciler.remount_required or reconciler.remount_started:
                            reconciler.forget_remounts(body.pod_uid)
                    self.waiters.check(body.pod_uid)
            elif kind == "podvol":
                self.index.apply(env)
                if isinstance(body, VolumeMounted) and reconciler.remount_started:
                    reconciler.remounted((body.pod_uid, body.volume_name))
                if self.waiters.by_pod:
                    self.waiters.check(getattr(body, "pod_uid", ""))
            elif env.type == "DeviceDetached":
                self.index.apply(env)
            columns.touch(*touched)
        if woke:
            reconciler.wake()

    def _on_operation_finished(self, op: Operation) -> None:
        self.reconciler.on_operation_finished(op)
        self.reconciler.mark_dirty(op.volume_id)
        if op.pod_uid and op.pod_uid not in self.dsw.pods:
            self.reconciler.queue_pod_cleanup(op.pod_uid)
        self.reconciler.wake()

    # ---------------------------------------------------------------- waits

    def pod_is(self, uid: str, for_: WaitFor) -> bool:
        """Whether the pod is "mounted" (desired, every volume Mounted; Uncertain does not
        count) or "unmounted" (not desired, and none of its volumes Mounted or Uncertain)."""
        return self.waiters.pod_is(uid, for_)

    async def wait_pod(
        self, uid: str, for_: WaitFor = "mounted", timeout: float | None = None
    ) -> PodStatus | None:
        """Wait until the pod is "mounted" or "unmounted" (see `pod_is`); its status then.

        Raises `PodWaitTimeoutError` naming each volume still in the way, its
        state and last error (not kubelet's catch-all "timed out waiting
        for the condition").
        """
        if for_ not in ("mounted", "unmounted"):
            raise ValueError(f"for_ must be 'mounted' or 'unmounted', not {for_!r}")
        self._require_running()
        await self.waiters.wait(uid, for_, timeout, self.pod)
        return self.pod(uid)

    async def settle(self, timeout: float = 10.0) -> None:
        """Wait until nothing is dirty and no operation runs (tests and benchmarks)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        quiet = 0
        while quiet < 3:
            if loop.time() > deadline:
                raise TimeoutError(
                    f"engine did not settle: {self.executor.running} operations running, "
                    f"{self.reconciler.dirty} volumes dirty"
                )
            if self.executor.running == 0 and self.reconciler.dirty == 0:
                quiet += 1
            else:
                quiet = 0
            await asyncio.sleep(self.config.reconcile_period / 2 or 0.001)

    # --------------------------------------------------------------- status

    def pod(self, uid: str) -> PodStatus | None:
        """One pod's status, or None if the engine does not know it."""
        return self.status.pod(uid)

    def pods(self) -> list[PodStatus]:
        """Every desired pod, and every deleted pod not yet cleaned up."""
        return self.status.pods()

    def volume(self, volume_id: str) -> VolumeStatus | None:
        """One volume's status, or None if it is neither on the node nor wanted."""
        return self.status.volume(volume_id)

    def volumes(self) -> list[VolumeStatus]:
        """Every volume on the node or wanted by a pod (see `StatusView.volumes`)."""
        return self.status.volumes()
