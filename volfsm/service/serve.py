"""`volfsm serve`: the node service's lifecycle.

Start, in this order:

0. refuse at once, touching nothing, if another service holds the root dir
   (`volfsm.node.rootdir`: one volfsm per root dir);
1. the HTTP server (so /healthz answers while the log is being read);
2. open the event log (the data dir is locked: one service per data dir),
   then claim the root dir: lock it for the life of the service and check
   its ownership mark against the log. A root dir that is not provably
   this node's (pod dirs the log does not know and no mark, another
   node's mark) is refused unless `--adopt-root-dir`; one whose mark names
   another log (the log was lost or replaced) or that was adopted is
   handled as after a lost log (6);
3. NATS: the `--nats` URL, or an embedded JetStream server on loopback with
   its store under `<data-dir>/nats`; the node name goes to `<data-dir>/node`
   (and, once ready, the URL to `<data-dir>/nats.url`: the CLI finds both
   there, and a script may wait for that file as the sign of readiness);
4. plugins: emptyDir, and each `--csi` driver (probed in the background and
   registered once it answers, as the kubelet registers drivers; the pending
   pods waiting for a driver are resolved again when it registers, or once
   the engine has started for those registered before);
5. the relay, publishing from its cursor (it only reads the log). It starts
   before the engine so that a NATS setup the operator must fix (refused
   credentials, an unusable stream) stops the service before it mounts
   anything; NATS merely being unreachable is not fatal (lag);
6. the engine: fold the log into the ASW and DSW, reconstruct (check the
   log's beliefs against the node: interrupted operations, vanished mounts
   and what the log does not know become Uncertain with their reasons),
   then reconcile (one call: `VolumeEngine.start()`). The desired state
   starts incomplete: nothing is unmounted, unstaged or removed until
   `volfsm apply --complete` says it is complete or `--desired-grace`
   seconds (default 30) have passed; mounts run at once. After a lost log
   (the root dir's mark names another log, the root dir was adopted, or
   reconstruction finds volumes the log does not know) the timer does not
   apply: only `apply --complete` opens the gate, and the mark remembers
   that across restarts until it does. `--restore-from-stream` that puts
   the history back makes the log whole again;
7. the command intake, so commands meet a rebuilt ASW;
8. ready once reconstruction is done and the first reconcile pass ran
   (`/readyz`).

SIGTERM / SIGINT drain: stop taking commands, stop the engine (running
operations get `drain_grace` seconds; what does not finish is recorded as
cancelled), flush the relay (up to `drain_grace` while NATS is up), close
NATS, the log and the embedded server. A clean drain exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
from pathlib import Path
from typing import Any

import nats.errors
from loguru import logger

from events.errors import LogLockedError, LogOpenError, RestoreError
from events.log import EventLog
from events.streams import pod_stream, podvol_stream
from events.types import Envelope, OperationFailed, OperationStarted, OperationSucceeded
from volfsm.bus import NatsServer
from volfsm.bus.connect import Denials, connect_once
from volfsm.bus.errors import NatsSetupError
from volfsm.bus.relay import Relay, RelayConfig
from volfsm.bus.roles import node_inbox_prefix
from volfsm.engine import EngineConfig, VolumeEngine
from volfsm.errors import VolfsmError
from volfsm.gate import LIFT, gate_text
from volfsm.node.layout import RootLayout
from volfsm.node.rootdir import RootClaim, RootDir, RootDirError
from volfsm.objects import ObjectStoreError
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.csi.plugin import CsiPlugin
from volfsm.plugins.emptydir import EmptyDirPlugin
from volfsm.plugins.hostpath import HostPathPlugin
from volfsm.plugins.local import HOSTNAME_LABEL, LocalVolumePlugin
from volfsm.plugins.objectvol.tokens import TokenManager
from volfsm.plugins.objectvol.updates import ObjectUpdates
from volfsm.service.config import NATS_URL_FILENAME, NODE_FILENAME, Settings
from volfsm.service.intake import CommandIntake, CommandProcessor
from volfsm.service.metrics import ServiceMetrics, Snapshot
from volfsm.service.objectvolumes import (
    admission,
    refresh_root_ca,
    register_object_plugins,
    start_updates,
)
from volfsm.service.republish import republish_due
from volfsm.service.restore import LogRestoreError, prepare_and_restore
from volfsm.web.exposition import metrics_response
from volfsm.web.http import HttpServer, Response

EXIT_OK = 0
EXIT_FAILED = 1
CSI_RETRY_S = 2.0
RESTORE_CONNECT_TIMEOUT_S = 5.0
CSI_STARTUP_WAIT_S = 10.0
"""How long start-up waits for the CSI drivers before reconciling without them."""
EMBEDDED_CHECK_S = 1.0
"""How often the embedded nats-server is checked (and restarted if it died)."""


class ServiceStartError(VolfsmError):
    """The service cannot start (log locked, NATS refused us, bad stream, ...)."""


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` (a reader never sees a half-written file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def log_envelopes(envs: list[Envelope]) -> None:
    """A `CommandHandler` listener: one log line per recorded event, with stream and seq."""
    for env in envs:
        body = env.body
        log = logger.bind(stream=env.stream, seq=env.seq, event=env.type)
        if isinstance(body, OperationStarted):
            log.bind(operation=body.operation, op_id=body.op_id).debug(
                "{} started ({})", body.operation, body.reason or "no reason given"
            )
        elif isinstance(body, OperationSucceeded):
            log.bind(operation=body.operation, op_id=body.op_id).info(
                "{} succeeded in {:.3f}s", body.operation, body.duration_s
            )
        elif isinstance(body, OperationFailed):
            log.bind(operation=body.operation, op_id=body.op_id, code=body.code).warning(
                "{} failed ({}): {}: {}",
                body.operation,
                "final" if body.final else f"retry after {body.backoff_s:g}s",
                body.code,
                body.message,
            )
        else:
            log.info("{} {}", env.type, env.stream)


class NodeService:
    """One `volfsm serve`: log, engine, relay, command intake, HTTP."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = ServiceMetrics(self.snapshot)
        self.log: EventLog | None = None
        self.engine: VolumeEngine | None = None
        self.object_updates: ObjectUpdates | None = None
        self.relay: Relay | None = None
        self.intake: CommandIntake | None = None
        self.processor: CommandProcessor | None = None
        self.http: HttpServer | None = None
        self.nats_server: NatsServer | None = None
        self.nats_url = settings.nats_url or ""
        self.catalog = PluginCatalog()
        self.csi_plugins: dict[str, CsiPlugin] = {}
        self.root: RootDir | None = None
        self.ready = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._stopped = False
        self._log = logger.bind(component="service")

    # ----------------------------------------------------------- run

    async def run(self, *, handle_signals: bool = True) -> int:
        """Start, serve until SIGTERM/SIGINT (or `request_stop`), drain; the exit code."""
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop, sig)
        try:
            try:
                await self.start()
            except ServiceStartError as exc:
                self._log.error("volfsm serve cannot start: {}", exc)
                return EXIT_FAILED
            except Exception:
                self._log.exception("volfsm serve failed while starting")
                return EXIT_FAILED
            await self._stop.wait()
            return EXIT_OK
        finally:
            await self.stop()
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    def request_stop(self, sig: int | None = None) -> None:
        """Begin the drain (what SIGTERM/SIGINT do)."""
        if self._stop.is_set():
            self._log.info("already draining")
            return
        name = signal.Signals(sig).name if sig is not None else "request"
        self._log.info("{}: draining", name)
        self._stop.set()

    # --------------------------------------------------------- start

    async def start(self) -> None:
        """Start everything (see the module docstring); ServiceStartError if it cannot."""
        s = self.settings
        root = RootDir(s.root_dir, node=s.node, data_dir=s.data_dir)
        try:
            root.check_free()  # before anything: a second service on this root exits here
        except RootDirError as exc:
            raise ServiceStartError(str(exc)) from None
        try:
            s.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ServiceStartError(f"cannot create the data dir: {exc}") from None
        self._log.info(
            "volfsm serve starting: node {}, data dir {}, root dir {}",
            s.node,
            s.data_dir,
            s.root_dir,
        )
        if s.http is not None:
            self.http = HttpServer(
                s.http.host,
                s.http.port,
                {
                    "/metrics": lambda _request: self.metrics_page(),
                    "/healthz": lambda _request: self.healthz(),
                    "/readyz": lambda _request: self.readyz(),
                },
            )
            try:
                await self.http.start()
            except OSError as exc:
                self.http = None
                raise ServiceStartError(f"--http {s.http.host}:{s.http.port}: {exc}") from None
        self.log = await asyncio.to_thread(self._open_log)
        claim = await asyncio.to_thread(self._claim_root, root, self.log)
        write_atomic(s.data_dir / NODE_FILENAME, s.node + "\n")
        self._start_nats()
        layout = RootLayout(s.root_dir)
        object_volumes = register_object_plugins(self.catalog, layout, s)
        memory = object_volumes.allocatable.get("memory")
        self.catalog.register(EmptyDirPlugin(layout, int(memory) if memory else None))
        self.catalog.register(HostPathPlugin(layout))
        self.catalog.register(LocalVolumePlugin(layout, {**s.node_labels, HOSTNAME_LABEL: s.node}))
        await self._start_csi(layout)
        lost = claim.lost
        if s.restore_from_stream and await self._restore_log() and claim.restorable:
            self._log.info("the log's history is back from the stream: the grace timer applies")
            root.set_until_complete("")
            lost = ""
        engine = VolumeEngine(
            self.log,
            s.root_dir,
            self.catalog,
            EngineConfig(
                reconcile_period=s.reconcile_period,
                backoff_initial=s.backoff_initial,
                backoff_max=s.backoff_max,
                operation_timeout=s.csi_timeout,
                desired_complete=False,
                desired_grace=s.desired_grace,
                log_lost=lost,
                volume_stats_period=s.volume_stats_period,
            ),
        )
        self.engine = engine
        engine.dsw.admission = admitting = admission(s)
        self.object_updates = start_updates(engine, object_volumes)
        self._wire_csi_driver_objects(engine, object_volumes.tokens)
        if self.csi_plugins:
            self._spawn(self._republish_loop(engine), "csi-republish")
        engine.volstats.on_duration = self.metrics.volume_stats_collected
        engine.reconciler.on_hold = root.set_until_complete
        engine.reconciler.on_complete = self._desired_complete
        relay = Relay(
            self.log,
            self.nats_url,
            s.node,
            RelayConfig(
                stream=s.stream,
                replicas=s.stream_replicas,
                duplicate_window_s=s.duplicate_window,
                manage_stream=s.stream_setup != "check",
                connect_options={"name": f"volfsm-{s.node}-relay", **s.nats_options},
            ),
        )
        engine.handler.subscribe(self.metrics.observe)
        engine.handler.subscribe(log_envelopes)
        engine.handler.subscribe(lambda _envs: relay.notify())
        try:
            await relay.start()
        except NatsSetupError as exc:
            raise ServiceStartError(str(exc)) from None
        self.relay = relay
        try:
            await engine.start()
        except ObjectStoreError as exc:
            raise ServiceStartError(str(exc)) from None
        await self._wake_for_drivers(self.catalog.csi_driver_names())  # registered before
        # before remount_all: the remounts it asks for then read the new bundle
        for namespace in await refresh_root_ca(engine, admitting):
            self._log.info("kube-root-ca.crt of {} published again: the CA changed", namespace)
        self.object_updates.remount_all()
        self._log.info(
            "ASW rebuilt from the log: {} devices, {} pod-volumes, {} desired pods, seq {}",
            len(engine.asw.devices),
            len(engine.asw.podvols),
            len(engine.dsw.pods),
            engine.asw.last_seq,
        )
        report = engine.reconstruction
        if report is not None:
            self._log.info(
                "reconstruction done: {} ({} found on the node, {} interrupted operations); {}",
                report.summary(),
                report.reconstructed,
                len(report.interrupted),
                gate_text(engine.recovery_status()) or "desired state complete",
            )
        self.processor = CommandProcessor(
            engine,
            s.node,
            max_bytes=s.max_command_bytes,
            status=self.status,
            count=self.metrics.command,
        )
        self.intake = CommandIntake(
            self.processor, self.nats_url, s.node, connect_options=s.nats_options
        )
        await self.intake.start()
        if relay.connected:
            await self.intake.wait_subscribed(5.0)
        self._spawn(self._watch_ready(), "volfsm-ready")
        if self.nats_server is not None:
            self._spawn(self._watch_embedded(self.nats_server), "volfsm-embedded-nats")

    def _open_log(self) -> EventLog:
        path = self.settings.log_path
        node = self.settings.node
        try:
            if path.exists():
                owner = EventLog(path, readonly=True)
                try:
                    if owner.node and owner.node != node:
                        raise ServiceStartError(
                            f"{path} is the log of node {owner.node!r}, not {node!r}: pass "
                            f"--node {owner.node} or use another --data-dir"
                        )
                finally:
                    owner.close()
            return EventLog(path, node=node)
        except LogLockedError as exc:
            raise ServiceStartError(
                f"{exc} (is another volfsm serve using this data dir?)"
            ) from None
        except LogOpenError as exc:
            raise ServiceStartError(str(exc)) from None

    def _claim_root(self, root: RootDir, log: EventLog) -> RootClaim:
        """Lock the root dir and check its mark against the log (see `volfsm.node.rootdir`)."""

        def knows_pod(uid: str) -> bool:
            return log.has_stream(pod_stream(uid)) or log.has_stream(
                podvol_stream(uid, ""), prefix=True
            )

        try:
            claim = root.claim_for(log.log_id, knows_pod, adopt=self.settings.adopt_root_dir)
        except RootDirError as exc:
            raise ServiceStartError(str(exc)) from None
        self.root = root
        if claim.lost:
            self._log.warning("root dir {}: {}", root.root, claim.note or claim.lost)
        elif claim.note:
            self._log.info("{}", claim.note)
        return claim

    def _desired_complete(self, reason: str) -> None:
        """The gate opened: the root dir's mark no longer holds it (next start: intact log)."""
        if self.root is not None:
            try:
                self.root.set_until_complete("")
            except RootDirError as exc:
                self._log.error("{}", exc)

    async def _restore_log(self) -> bool:
        """--restore-from-stream: copy this node's events the log lacks back from JetStream.

        Whether any were put back.
        """
        s = self.settings
        assert self.log is not None and self.nats_url is not None

        async def ignore(*_: object) -> None:
            return None

        denials = Denials()

        async def on_error(exc: Exception) -> None:
            denials.note(exc)

        try:
            nc = await connect_once(
                self.nats_url,
                connect_timeout_s=RESTORE_CONNECT_TIMEOUT_S,
                error_cb=on_error,
                disconnected_cb=ignore,
                closed_cb=ignore,
                name=f"volfsm-{s.node}-restore",
                **{"inbox_prefix": node_inbox_prefix(s.node), **s.nats_options},
            )
        except (NatsSetupError, ConnectionError) as exc:
            raise ServiceStartError(f"--restore-from-stream: {exc}") from None
        try:
            restoring = prepare_and_restore(
                self.log,
                nc.jetstream(),
                s.stream,
                s.node,
                manage=s.stream_setup != "check",
                replicas=s.stream_replicas,
                duplicate_window_s=s.duplicate_window,
            )
            result = await denials.guard(restoring)
        except (LogRestoreError, RestoreError, NatsSetupError, nats.errors.Error) as exc:
            raise ServiceStartError(f"--restore-from-stream: {exc}") from None
        finally:
            await nc.close()
        if result.restored:
            self._log.warning(
                "log restored from stream {}: seq {}..{} ({} events) put back after seq {}",
                s.stream,
                result.log_last_seq + 1,
                result.stream_last_seq,
                result.restored,
                result.log_last_seq,
            )
            return True
        else:
            self._log.info(
                "--restore-from-stream: the log (seq {}) already holds every event stream {}"
                " has of this node (seq {}); nothing to restore",
                result.log_last_seq,
                s.stream,
                result.stream_last_seq,
            )
            return False

    def _start_nats(self) -> None:
        """Use --nats, or start the embedded server (in this thread: it dies with it)."""
        if self.settings.nats_url is not None:
            return
        max_payload = max(1 << 20, self.settings.max_command_bytes + (64 << 10))
        server = NatsServer(
            self.settings.data_dir / "nats",
            config_text=f"max_payload: {max_payload}\n",
        )
        try:
            server.start()
        except Exception as exc:
            raise ServiceStartError(f"cannot start the embedded nats-server: {exc}") from None
        self.nats_server = server
        self.nats_url = server.url
        self._log.info("embedded JetStream server on {} (store {})", server.url, server.store_dir)

    async def _start_csi(self, layout: RootLayout) -> None:
        s = self.settings
        waits = []
        for drv in s.csi:
            plugin = CsiPlugin(
                drv.name,
                drv.endpoint,
                layout,
                node_name=s.node,
                timeout_s=s.csi_timeout,
                socket_wait_s=CSI_RETRY_S,
            )
            self.csi_plugins[drv.name] = plugin
            plugin.client.on_call = functools.partial(self.metrics.csi_call, drv.name)
            registered = asyncio.Event()
            waits.append(registered.wait())
            self._spawn(self._register_csi(plugin, registered), f"csi-register:{drv.name}")
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), CSI_STARTUP_WAIT_S)

    def _wire_csi_driver_objects(self, engine: VolumeEngine, tokens: TokenManager | None) -> None:
        """CSI plugins read CSIDriver objects from the engine's store and get tokens from
        the token source the projected volumes use."""
        for plugin in self.csi_plugins.values():
            plugin.objects.lookup = engine.objects.csi_driver
            plugin.objects.tokens = tokens.get if tokens is not None else None

    async def _republish_loop(self, engine: VolumeEngine) -> None:
        """requiresRepublish: NodePublish again, every --csi-republish-period, each mounted
        volume of a driver whose CSIDriver object asks for it (the kubelet's remount)."""
        while True:
            await asyncio.sleep(self.settings.csi_republish_period)
            for uid, names in republish_due(engine).items():
                engine.remount_volumes(uid, names)

    async def _register_csi(self, plugin: CsiPlugin, registered: asyncio.Event) -> None:
        """Probe the driver until it answers, then register it (kubelet plugin registration)."""
        delay = CSI_RETRY_S
        warned = False
        while True:
            try:
                await plugin.start()
            except Exception as exc:
                if not warned:
                    self._log.warning(
                        "CSI driver {} at {} not ready ({}); retrying",
                        plugin.driver,
                        plugin.endpoint,
                        exc,
                    )
                    warned = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            self.catalog.register_csi_driver(plugin.driver, plugin)
            registered.set()
            self._log.info("CSI driver {} registered ({})", plugin.driver, plugin.endpoint)
            engine = self.engine
            if engine is not None and engine.running:  # else the engine's start wakes them
                await self._wake_for_drivers([plugin.driver])
            return

    async def _wake_for_drivers(self, drivers: list[str]) -> None:
        """Resolve again the pending pods waiting for these CSI drivers (just registered)."""
        engine = self.engine
        if engine is None or not drivers:
            return
        try:
            envs = await engine.wake_csi_drivers(drivers)
        except Exception as exc:  # the pods stay pending; the next registration retries
            self._log.error("pods waiting for CSI drivers {} not resolved: {}", drivers, exc)
            return
        if envs:
            self._log.info(
                "CSI drivers {} registered: {} pending pods resolved again", drivers, len(envs)
            )

    async def _watch_ready(self) -> None:
        engine = self.engine
        assert engine is not None
        while engine.reconstruction is None or engine.reconciler.passes < 1:
            await asyncio.sleep(0.01)
        write_atomic(self.settings.data_dir / NATS_URL_FILENAME, self.nats_url + "\n")
        self.ready = True
        self._log.info("volfsm serve ready: node {}, NATS {}", self.settings.node, self.nats_url)

    async def _watch_embedded(self, server: NatsServer) -> None:
        """Bring the embedded server back (same port and store) if it dies while we run."""
        while True:
            await asyncio.sleep(EMBEDDED_CHECK_S)
            if server.running or self._stop.is_set():
                continue
            self._log.warning("embedded nats-server exited; restarting it on {}", server.url)
            try:
                server.start()  # in this thread, so that it dies with us
            except Exception as exc:
                self._log.error("embedded nats-server does not start again: {}", exc)

    def _spawn(self, coro: Any, name: str) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---------------------------------------------------------- stop

    async def stop(self) -> None:
        """Drain and close everything that was started. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        grace = self.settings.drain_grace
        if self.intake is not None:
            await self.intake.stop_accepting()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.object_updates is not None:
            self.object_updates.close()
        if self.engine is not None:
            running = self.engine.executor.running
            if running:
                self._log.info("waiting up to {:g}s for {} running operations", grace, running)
            await self.engine.stop(grace_s=grace)
        if self.relay is not None:
            flush = grace if self.relay.connected else 0.0
            await self.relay.stop(flush_timeout=flush)
            lag = self.relay.lag()
            if lag:
                self._log.warning("{} events not yet in the stream; they go out on next start", lag)
        if self.intake is not None:
            await self.intake.close()
        for plugin in self.csi_plugins.values():
            with contextlib.suppress(Exception):
                await plugin.stop()
        if self.http is not None:
            await self.http.stop()
        if self.log is not None:
            last = self.log.last_seq()
            await asyncio.to_thread(self.log.close)
            self._log.info("event log closed at seq {}", last)
        if self.nats_server is not None:
            await asyncio.to_thread(self.nats_server.stop)
            with contextlib.suppress(OSError):
                (self.settings.data_dir / NATS_URL_FILENAME).unlink()
        if self.root is not None:
            self.root.release()
        self._log.info("volfsm serve stopped")

    # -------------------------------------------------------- status

    def status(self) -> dict[str, Any]:
        """Node-wide status added to `get` replies."""
        relay = self.relay
        engine = self.engine
        recovery = engine.recovery_status() if engine is not None else {}
        return {
            **recovery,
            "node": self.settings.node,
            "ready": self.ready,
            "last_seq": self.log.last_seq() if self.log is not None else 0,
            "publish_lag": relay.lag() if relay is not None else None,
            "relay": {
                "connected": relay.connected if relay is not None else False,
                "acked_seq": relay.acked_seq if relay is not None else 0,
                "last_error": relay.last_error if relay is not None else None,
            },
        }

    def snapshot(self) -> Snapshot:
        """Scrape-time state for the metrics."""
        engine = self.engine
        relay = self.relay
        report = engine.reconstruction if engine is not None else None
        counters: dict[str, int] = {}
        if relay is not None:
            counters = {k: int(v) for k, v in vars(relay.counters).items()}
        return Snapshot(
            ready=self.ready,
            last_seq=self.log.last_seq() if self.log is not None else 0,
            asw=engine.asw if engine is not None else None,
            desired=engine.dsw.volumes_to_mount() if engine is not None else (),
            running_operations=engine.executor.running if engine is not None else 0,
            relay=relay,
            relay_counters=counters,
            intake_connected=self.intake.connected if self.intake is not None else False,
            volume_stats=engine.volstats.by_claim() if engine is not None else (),
            empty_dir_stats=engine.volstats.empty_dirs() if engine is not None else (),
            reconstruction=report.as_dict() if report is not None else None,
        )

    def metrics_page(self) -> Response:
        """GET /metrics."""
        return metrics_response(self.metrics.registry)

    def healthz(self) -> Response:
        """GET /healthz: the process answers and is not shutting down for good."""
        engine = self.engine
        if self._stopped:
            return Response(503, "stopped\n")
        if engine is not None and self.ready and not engine.alive:
            return Response(503, "engine stopped or its reconciler died\n")
        return Response(200, "ok\n")

    def readyz(self) -> Response:
        """GET /readyz: ASW rebuilt, reconstruction and the first reconcile pass done.

        NATS is not a condition, nor is the desired state being complete
        (an `[i]` line says whether unmounts may start yet).
        """
        engine = self.engine
        report = engine.reconstruction if engine is not None else None
        rebuilt = engine is not None and (engine.running or report is not None)
        if report is None:
            done = "[-] reconstruction done"
        elif report.error:
            done = f"[-] reconstruction failed: {report.error}"
        else:
            done = f"[+] reconstruction done ({report.summary()})"
        lines = [
            f"[{'+' if rebuilt else '-'}] asw rebuilt",
            done,
            f"[{'+' if self.ready else '-'}] first reconcile done",
        ]
        if engine is not None and report is not None:
            if engine.desired_complete:
                lines.append(f"[i] desired state complete ({engine.reconciler.complete_reason})")
            elif engine.reconciler.until_told:
                lines.append(
                    f"[i] desired state not complete: {engine.reconciler.until_told}: no unmounts"
                    f" until {LIFT}; the grace timer does not apply"
                )
            else:
                left = engine.reconciler.grace_left()
                until = f"; grace ends in {left:.0f}s" if left is not None else ""
                lines.append(f"[i] desired state not complete: no unmounts yet{until}")
        relay = self.relay
        if relay is not None:
            lines.append(
                f"[i] nats {'connected' if relay.connected else 'disconnected'}, "
                f"publish lag {relay.lag()} events"
            )
        for name in self.csi_plugins:
            known = name in self.catalog.csi_driver_names()
            lines.append(f"[i] csi driver {name} {'registered' if known else 'not registered'}")
        failed = report is not None and bool(report.error)
        ok = self.ready and not self._stop.is_set() and not failed
        if self._stop.is_set():
            lines.append("[-] draining")
        return Response(
            200 if ok else 503, ("ok" if ok else "not ready") + "\n" + "\n".join(lines) + "\n"
        )


async def serve(settings: Settings, *, handle_signals: bool = True) -> int:
    """Run one node service until it is told to stop; returns the exit code."""
    return await NodeService(settings).run(handle_signals=handle_signals)
