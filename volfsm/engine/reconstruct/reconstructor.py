"""`Reconstructor`: runs the steps once at start, then records and registers what they decided."""

from __future__ import annotations

import asyncio
import time

from loguru import logger as log

from events.log import EventLog
from events.streams import device_stream, podvol_stream
from events.types import DesiredVolume, PodAdded
from projections.asw import Asw
from volfsm.engine.handler import CommandHandler
from volfsm.engine.index import EngineIndex
from volfsm.engine.operations import OperationGenerator
from volfsm.engine.reconstruct.against_node import plan_against_node
from volfsm.engine.reconstruct.found import plan_found
from volfsm.engine.reconstruct.held import plan_not_created, plan_specless
from volfsm.engine.reconstruct.interrupted import plan_interrupted
from volfsm.engine.reconstruct.orphans import DesiredPods, Orphan, OrphanCleaner
from volfsm.engine.reconstruct.plan import (
    Context,
    OnFound,
    Plan,
    Record,
    SpecConstructors,
    SpecRegistry,
)
from volfsm.engine.reconstruct.report import ReconstructionReport
from volfsm.engine.reconstruct.scan import scan_node
from volfsm.errors import VolfsmError
from volfsm.faultpoints import hit
from volfsm.node.layout import RootLayout


class Reconstructor:
    """Runs reconstruction once at start, and the one-shot orphan cleanup afterwards."""

    def __init__(
        self,
        *,
        log: EventLog,
        handler: CommandHandler,
        asw: Asw,
        dsw: DesiredPods,
        index: EngineIndex,
        ops: OperationGenerator,
        layout: RootLayout,
        registry: SpecRegistry,
        plugins: SpecConstructors,
    ) -> None:
        self.ctx = Context(
            log=log, asw=asw, index=index, ops=ops, layout=layout, registry=registry,
            plugins=plugins,
        )  # fmt: skip
        self.handler = handler
        self.dsw = dsw
        self.report: ReconstructionReport | None = None
        self.on_found: OnFound | None = None
        """Called with how many found entries the log has no event of (`_unknown_to_log`),
        before they are recorded (then the log has: the next start would not count them)."""
        self.cleaner = OrphanCleaner(
            handler=handler, dsw=dsw, ops=ops, layout=layout, registry=registry,
            entries_of=self.ctx.entries_of,
        )  # fmt: skip

    # ------------------------------------------------------------------ run

    async def run(self) -> ReconstructionReport:
        """Reconstruct (see the package doc); the report. Call once, before reconciling."""
        started = time.monotonic()
        hit("reconstruct.start")
        try:
            plan = await asyncio.to_thread(self._plan)
            unknown = await asyncio.to_thread(self._unknown_to_log, plan)
            if unknown and self.on_found is not None:
                self.on_found(unknown)  # before the marks reach the log
            await self._apply(plan)
            self._register(plan)
            report = plan.report
        except (VolfsmError, OSError, ValueError) as exc:
            # A node or log the code did not expect: say so (readiness stays off), and
            # reconcile on the log's state alone rather than not at all.
            log.exception("reconstruction failed")
            report = ReconstructionReport(error=f"{type(exc).__name__}: {exc}")
            await self._keep_files_of_earlier_finds()
        report.duration_s = time.monotonic() - started
        self.report = report
        report.log_lines()
        return report

    def _plan(self) -> Plan:
        """Decide every mark (in a worker thread: nothing else writes while this runs)."""
        ctx, plan = self.ctx, Plan()
        specs = ctx.specs(refresh=True)
        plan_interrupted(ctx, plan)
        scan = scan_node(ctx.layout, specs.plugins)
        plan.pod_uids = list(scan.pod_uids)
        plan_against_node(ctx, plan, scan, specs)
        plan_found(ctx, plan, scan, specs)
        plan_specless(ctx, plan, specs)
        plan_not_created(ctx, plan)
        return plan

    async def _keep_files_of_earlier_finds(self) -> None:
        """After a failed reconstruction: what an earlier start found still keeps its files."""
        fallback = Plan()
        try:
            await asyncio.to_thread(plan_not_created, self.ctx, fallback)
        except (VolfsmError, OSError, ValueError):
            log.exception("cannot tell which volumes the log never created")
        self.ctx.ops.found_on_node.update(fallback.not_created)

    def _unknown_to_log(self, plan: Plan) -> int:
        """How many found entries the log has no event of at all (not even a start): the log
        was lost or is behind, or another tool wrote there. An entry a crash left (its stream
        has events) is not counted: an intact log knows it."""
        streams = [podvol_stream(uid, name) for uid, name in plan.found_podvols]
        streams += [device_stream(vid) for vid in plan.found_devices]
        return sum(not self.ctx.log.has_stream(stream) for stream in streams)

    # ------------------------------------------------------------- applying

    async def _apply(self, plan: Plan) -> None:
        first = True
        ops = self.ctx.ops
        for action in plan.actions:
            try:
                if isinstance(action, Record):
                    await self.handler.record_async(action.stream, [action.body])
                elif action.pod_uid:
                    await ops.fire_podvol(action.pod_uid, action.name, action.trigger, action.body)
                else:
                    await ops.fire_device(action.volume_id, action.trigger, action.body)
            except VolfsmError as exc:  # an illegal transition: the plan is wrong, not fatal
                log.error("reconstruction could not record {}: {}", action, exc)
                continue
            if first:
                first = False
                hit("reconstruct.mid")

    def _register(self, plan: Plan) -> None:
        """Hand the reconstructed specs to the reconciler; queue pod dirs for cleanup."""
        registry = self.ctx.registry
        for key, spec in plan.podvol_specs.items():
            registry.reconstructed[key] = spec
            self._add_to_pod(key[0], spec)
        for vid, spec in plan.device_specs.items():
            registry.reconstructed_devices.setdefault(vid, spec)
        self.ctx.ops.found_on_node.update(plan.not_created)
        for orphan in plan.report.orphans:
            if orphan.pod_uid:
                self._add_to_pod(orphan.pod_uid, None)
        for uid in plan.pod_uids:
            if uid not in self.dsw.pods:
                registry.queue_pod_cleanup(uid)

    def _add_to_pod(self, uid: str, spec: DesiredVolume | None) -> None:
        """Make a pod the log does not know visible (status, pod dir cleanup) with its volumes."""
        if uid in self.dsw.pods:
            return
        index = self.ctx.index
        pod = index.removed_pods.get(uid)
        if pod is None:
            pod = PodAdded(pod_uid=uid, namespace="", name="")
        if spec is not None and all(dv.name != spec.name for dv in pod.volumes):
            pod = PodAdded(
                pod_uid=uid,
                namespace=pod.namespace,
                name=pod.name,
                volumes=(*pod.volumes, spec),
            )
        index.removed_pods[uid] = pod

    # ------------------------------------------------------------- orphans

    @property
    def orphans(self) -> list[Orphan]:
        """What could not be reconstructed (empty before `run`)."""
        return self.report.orphans if self.report is not None else []

    def start_orphan_cleanup(self) -> None:
        """The reconciler's one-shot hook, on its first pass after the desired state is complete."""
        self.cleaner.start(self.orphans)

    async def wait(self) -> None:
        """Wait for a running orphan cleanup (stop, tests)."""
        await self.cleaner.wait()
