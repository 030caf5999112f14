"""Prometheus metrics of the node service, through `prometheus_client`.

`ServiceMetrics` is the service's collector, registered in its own private
registry (see `volfsm.web.exposition`). Two kinds of numbers:

* counted as events are appended (a `CommandHandler` listener): transitions
  by FSM and event type, operations by name, plugin and result, and
  `storage_operation_duration_seconds` from the `duration_s` of
  OperationSucceeded / OperationFailed (the plugin comes from the matching
  OperationStarted); the tallies become counter and histogram families when
  scraped, the histogram's `le` bounds written as the kubelet writes them
  ('0.1', '1', '600');
* read at scrape time, as the kubelet's volume manager collector does:
  `volume_manager_total_volumes{plugin_name,state}`, devices and pod-volumes
  by state, running operations, publish lag, relay counters, readiness;
  the `kubelet_volume_stats_*` gauges from what the volume stats gatherer
  last collected (`volfsm.engine.volstats`: on its own period, never on the
  scrape path) and the reconstruction counters from the engine's report;
* told by the CSI clients and the gatherer: `csi_operations_seconds` per
  driver, method and gRPC code, and
  `kubelet_volume_metric_collection_duration_seconds`.

Labels are low-cardinality (plugin, operation, state, result, verb, error
code), except the kubelet's own `namespace` / `persistentvolumeclaim` of
the volume stats and the `namespace` / `pod` / `volume` names of the
emptyDir sizeLimit gauges (only emptyDirs with a limit); never a volume id
or pod uid.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from events.tables import DETACHED, MOUNTED, UNMOUNTED
from events.types import (
    DesiredVolume,
    Envelope,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    VolumeMounted,
    VolumeSource,
)
from projections.asw import Asw
from volfsm.engine.volstats import VolumeStats
from volfsm.web.exposition import counter, gauge, registry_of

KUBELET_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0)
"""kubelet's storage_operation_duration_seconds (and csi_operations_seconds) buckets."""
COLLECTION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""kubelet_volume_metric_collection_duration_seconds buckets (Prometheus' defaults)."""
MIGRATED = "false"
"""The `migrated` label: volfsm does no in-tree to CSI migration."""

UNKNOWN_PLUGIN = "N/A"
PLUGIN_CSI = "kubernetes.io/csi"
CSI_PREFIX = PLUGIN_CSI + "/"
ASW_STATE = "actual_state_of_world"
DSW_STATE = "desired_state_of_world"

Counts = dict[tuple[str, str], int]


def plugin_label(source: VolumeSource) -> str:
    """A volume source's plugin as kubelet metrics name it ('kubernetes.io/csi:<driver>')."""
    return f"{source.plugin}:{source.driver}" if source.driver else source.plugin


def plugin_of_volume_id(volume_id: str) -> str:
    """The plugin label from a volume's unique name ('kubernetes.io/csi/<driver>^<handle>',
    'kubernetes.io/empty-dir/<uid>-<name>'); UNKNOWN_PLUGIN if it has neither shape."""
    if volume_id.startswith(CSI_PREFIX) and "^" in volume_id:
        return f"{PLUGIN_CSI}:{volume_id[len(CSI_PREFIX) :].split('^', 1)[0]}"
    plugin, sep, _rest = volume_id.rpartition("/")
    return plugin if sep and plugin.count("/") == 1 else UNKNOWN_PLUGIN


class Tally:
    """Counts per label values, fed as events are appended; exposed as a counter."""

    def __init__(self, name: str, help_text: str, label_names: Sequence[str]) -> None:
        self.name = name
        self.help = help_text
        self.label_names = tuple(label_names)
        self.values: dict[tuple[str, ...], float] = defaultdict(float)

    def inc(self, *label_values: str, amount: float = 1.0) -> None:
        """Add `amount` to the series with these label values."""
        self.values[label_values] += amount

    def get(self, *label_values: str) -> float:
        """The current value of one series (0 if never incremented)."""
        return self.values.get(label_values, 0.0)

    def family(self) -> CounterMetricFamily:
        """The tally as a counter family."""
        return counter(self.name, self.help, self.label_names, sorted(self.values.items()))


def _bound(upper: float) -> str:
    """A bucket bound as the kubelet's `le` label writes it ('0.1', '1', '600')."""
    return str(int(upper)) if float(upper).is_integer() else repr(float(upper))


class DurationTally:
    """Observations per label values in fixed buckets; exposed as a histogram."""

    def __init__(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str],
        buckets: Sequence[float] = KUBELET_BUCKETS,
    ) -> None:
        self.name = name
        self.help = help_text
        self.label_names = tuple(label_names)
        self.buckets = tuple(sorted(buckets))
        self.counts: dict[tuple[str, ...], list[int]] = {}
        self.sums: dict[tuple[str, ...], float] = defaultdict(float)

    def observe(self, value: float, *label_values: str) -> None:
        """Record one observation."""
        counts = self.counts.get(label_values)
        if counts is None:
            counts = self.counts[label_values] = [0] * (len(self.buckets) + 1)
        for i, upper in enumerate(self.buckets):
            if value <= upper:
                counts[i] += 1
        counts[-1] += 1
        self.sums[label_values] += value

    def count(self, *label_values: str) -> int:
        """Observations of one series."""
        counts = self.counts.get(label_values)
        return counts[-1] if counts else 0

    def family(self) -> HistogramMetricFamily:
        """The tally as a histogram family (cumulative buckets, _sum, _count)."""
        family = HistogramMetricFamily(self.name, self.help, labels=self.label_names)
        bounds = [*(_bound(b) for b in self.buckets), "+Inf"]
        for values, counts in sorted(self.counts.items()):
            buckets = [(le, float(n)) for le, n in zip(bounds, counts, strict=True)]
            family.add_metric(values, buckets, self.sums[values])
        return family


# ------------------------------------------------------------------- views


class RelayView(Protocol):
    """What metrics read from the relay at scrape time."""

    @property
    def connected(self) -> bool:
        """A session to NATS is up."""

    @property
    def acked_seq(self) -> int:
        """Every event up to this seq is in the stream."""

    def lag(self) -> int:
        """Events not yet acknowledged by JetStream."""


@dataclass
class Snapshot:
    """Scrape-time state `ServiceMetrics` reads."""

    ready: bool
    last_seq: int
    asw: Asw | None = None
    desired: Iterable[tuple[PodAdded, DesiredVolume]] = ()
    running_operations: int = 0
    relay: RelayView | None = None
    relay_counters: dict[str, int] = field(default_factory=dict)
    intake_connected: bool = False
    volume_stats: Sequence[VolumeStats] = ()
    """The gatherer's last results, one per (namespace, claim)."""
    empty_dir_stats: Sequence[VolumeStats] = ()
    """The gatherer's last results of disk-backed emptyDirs with a sizeLimit."""
    reconstruction: Mapping[str, Any] | None = None
    """The engine's reconstruction report as plain data (None until it ran)."""


_RELAY_COUNTERS = {
    "published": "Publishes sent to JetStream (re-sends included).",
    "acked": "PubAcks received.",
    "duplicates": "PubAcks saying the stream already held the message.",
    "timeouts": "Publishes without a PubAck in time (outcome unknown).",
    "errors": "Error replies from JetStream.",
    "reconnects": "Relay sessions opened after the first.",
    "skipped": "Events found already in the stream on reconnect, not sent again.",
    "rewinds": "Times the stream held less than the cursor and the tail was republished.",
}


class ServiceMetrics(Collector):
    """The service's collector: tallies fed by appended events and commands, and the
    state `snapshot` reads when scraped; `registry` holds it alone."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self.snapshot = snapshot
        self.transitions = Tally(
            "volfsm_transitions_total",
            "FSM transitions recorded, by state machine and event type.",
            ("fsm", "event"),
        )
        self.desired_events = Tally(
            "volfsm_desired_events_total",
            "Desired-state events recorded (pods added / removed, sizes).",
            ("event",),
        )
        self.operations_started = Tally(
            "volfsm_operations_started_total",
            "Operations started, by operation and plugin.",
            ("operation", "plugin"),
        )
        self.operations = Tally(
            "volfsm_operations_total",
            "Operations finished, by operation, plugin and result (success / failure).",
            ("operation", "plugin", "result"),
        )
        self.operation_errors = Tally(
            "volfsm_operation_errors_total",
            "Failed operations by error code and whether the error was final.",
            ("operation", "plugin", "code", "final"),
        )
        self.durations = DurationTally(
            "storage_operation_duration_seconds",
            "Storage operation duration (kubelet-compatible).",
            ("volume_plugin", "operation_name", "status", "migrated"),
        )
        self.csi_calls = DurationTally(
            "csi_operations_seconds",
            "Container Storage Interface operation duration with gRPC error code status total "
            "(kubelet-compatible).",
            ("driver_name", "method_name", "grpc_status_code", "migrated"),
        )
        self.end_to_end = DurationTally(
            "volume_operation_total_seconds",
            "Storage operation end to end duration in seconds: from an operation's first "
            "attempt on a volume until one succeeds, failed attempts and backoff included.",
            ("plugin_name", "operation_name"),
        )
        self.collections = DurationTally(
            "kubelet_volume_metric_collection_duration_seconds",
            "Duration in seconds to calculate volume stats (kubelet-compatible).",
            ("metric_source",),
            COLLECTION_BUCKETS,
        )
        self._first_attempt: dict[tuple[str, str], tuple[int, str]] = {}
        self._op_streams: dict[str, tuple[str, str]] = {}
        self.commands = Tally(
            "volfsm_commands_total",
            "Commands received over NATS, by verb and result code ('ok' when it succeeded).",
            ("verb", "code"),
        )
        self._op_plugins: dict[str, str] = {}
        self.content_writes = Tally(
            "volfsm_volume_content_writes_total",
            "SetUps (first mounts and remounts on a changed object or a token refresh) of "
            "configMap, secret, downwardAPI and projected volumes, by plugin and result: "
            "written (files swapped in atomically) or unchanged.",
            ("plugin", "result"),
        )
        self.registry = registry_of(self)

    # ----------------------------------------------------------- feeding

    def observe(self, envs: list[Envelope]) -> None:
        """A `CommandHandler` listener: count what was just appended."""
        for env in envs:
            body = env.body
            kind = type(body).KIND
            if kind in ("device", "podvol"):
                self.transitions.inc(kind, env.type)
                if isinstance(body, VolumeMounted) and body.contents:
                    result = body.contents.split(":", 1)[0]
                    self.content_writes.inc(plugin_of_volume_id(body.volume_id), result)
            elif kind == "desired":
                self.desired_events.inc(env.type)
            elif isinstance(body, OperationStarted):
                plugin = body.plugin or UNKNOWN_PLUGIN
                self._op_plugins[body.op_id] = plugin
                self.operations_started.inc(body.operation, plugin)
                self._started(env, body, plugin)
            elif isinstance(body, OperationSucceeded):
                plugin = self._op_plugins.pop(body.op_id, UNKNOWN_PLUGIN)
                self.operations.inc(body.operation, plugin, "success")
                self.durations.observe(body.duration_s, plugin, body.operation, "success", MIGRATED)
                self._succeeded(env, body)
            elif isinstance(body, OperationFailed):
                plugin = self._op_plugins.pop(body.op_id, UNKNOWN_PLUGIN)
                self._op_streams.pop(body.op_id, None)
                self.operations.inc(body.operation, plugin, "failure")
                self.operation_errors.inc(
                    body.operation, plugin, body.code, "true" if body.final else "false"
                )
                self.durations.observe(
                    body.duration_s, plugin, body.operation, "fail-unknown", MIGRATED
                )

    def _started(self, env: Envelope, body: OperationStarted, plugin: str) -> None:
        """Remember an operation's first attempt on its stream (volume_operation_total_seconds)."""
        key = (env.stream, body.operation)
        self._first_attempt.setdefault(key, (env.ts, plugin))
        self._op_streams[body.op_id] = key

    def _succeeded(self, env: Envelope, body: OperationSucceeded) -> None:
        key = self._op_streams.pop(body.op_id, None)
        first = self._first_attempt.pop(key, None) if key is not None else None
        if first is not None:
            started_us, plugin = first
            seconds = max(0.0, (env.ts - started_us) / 1e6)
            self.end_to_end.observe(seconds, plugin, body.operation)

    def csi_call(self, driver: str, method: str, code: str, seconds: float) -> None:
        """One CSI call ended (a `CsiClient.on_call` observer)."""
        self.csi_calls.observe(seconds, driver, method, code, MIGRATED)

    def volume_stats_collected(self, source: str, seconds: float) -> None:
        """One volume's stats were gathered (`VolumeStatsGatherer.on_duration`)."""
        self.collections.observe(seconds, source)

    def command(self, verb: str, code: str) -> None:
        """Count one command and its outcome."""
        self.commands.inc(verb, code)

    # ---------------------------------------------------------- collecting

    def collect(self) -> Iterator[Metric]:
        """Every family, the scrape-time ones read now (the `Collector` protocol)."""
        snap = self.snapshot()
        yield GaugeMetricFamily(
            "volfsm_ready",
            "1 once the ASW is rebuilt and a first reconcile ran.",
            value=1.0 if snap.ready else 0.0,
        )
        yield GaugeMetricFamily(
            "volfsm_log_last_seq", "Seq of the last event in the local log.", value=snap.last_seq
        )
        yield GaugeMetricFamily(
            "volfsm_operations_running",
            "Operations running now (pending).",
            value=snap.running_operations,
        )
        yield from _volume_families(snap)
        yield from _relay_families(snap)
        yield self.transitions.family()
        yield self.desired_events.family()
        yield self.operations_started.family()
        yield self.operations.family()
        yield self.operation_errors.family()
        yield self.durations.family()
        yield self.commands.family()
        yield self.csi_calls.family()
        yield self.end_to_end.family()
        yield self.collections.family()
        yield self.content_writes.family()
        yield from volume_stats_families(snap.volume_stats)
        yield from empty_dir_limit_families(snap.empty_dir_stats)
        yield from reconstruction_families(snap.reconstruction)


def _volume_counts(snap: Snapshot) -> tuple[Counts, Counts, Counts]:
    """(plugin, state) -> count for volume_manager_total_volumes, devices and pod-volumes."""
    per_plugin: Counts = defaultdict(int)
    devices: Counts = defaultdict(int)
    podvols: Counts = defaultdict(int)
    plugin_of: dict[str, str] = {}
    for _pod, dv in snap.desired:
        label = plugin_label(dv.source)
        plugin_of.setdefault(dv.volume_id, label)
        per_plugin[(label, DSW_STATE)] += 1
    if snap.asw is not None:
        for dev in snap.asw.devices.values():
            if dev.state != DETACHED:
                label = plugin_of.get(dev.volume_id) or plugin_of_volume_id(dev.volume_id)
                devices[(label, dev.state)] += 1
        for pv in snap.asw.podvols.values():
            if pv.state == UNMOUNTED:
                continue
            label = plugin_of.get(pv.volume_id) or plugin_of_volume_id(pv.volume_id)
            podvols[(label, pv.state)] += 1
            if pv.state == MOUNTED:
                per_plugin[(label, ASW_STATE)] += 1
    return per_plugin, devices, podvols


def _volume_families(snap: Snapshot) -> Iterator[Metric]:
    per_plugin, devices, podvols = _volume_counts(snap)
    yield gauge(
        "volume_manager_total_volumes",
        "Number of volumes in the actual (Mounted pod-volumes) and desired state of world "
        "(kubelet-compatible).",
        ("plugin_name", "state"),
        sorted(per_plugin.items()),
    )
    yield gauge(
        "volfsm_devices",
        "Volumes on the node by device FSM state and plugin (Detached ones left out).",
        ("plugin", "state"),
        sorted(devices.items()),
    )
    yield gauge(
        "volfsm_pod_volumes",
        "Pod-volumes by FSM state and plugin (Unmounted ones left out).",
        ("plugin", "state"),
        sorted(podvols.items()),
    )


def _relay_families(snap: Snapshot) -> Iterator[Metric]:
    relay = snap.relay
    lag = float(relay.lag()) if relay is not None else float(snap.last_seq)
    connected = relay is not None and relay.connected
    yield GaugeMetricFamily(
        "volfsm_publish_lag_events",
        "Events in the local log not yet acknowledged by JetStream.",
        value=lag,
    )
    yield GaugeMetricFamily(
        "volfsm_relay_connected",
        "1 while the relay has a NATS session.",
        value=1.0 if connected else 0.0,
    )
    yield GaugeMetricFamily(
        "volfsm_relay_acked_seq",
        "Every event up to this seq is in the JetStream stream.",
        value=relay.acked_seq if relay is not None else 0,
    )
    yield GaugeMetricFamily(
        "volfsm_commands_connected",
        "1 while the command intake is connected to NATS.",
        value=1.0 if snap.intake_connected else 0.0,
    )
    for key, help_text in _RELAY_COUNTERS.items():
        value = float(snap.relay_counters.get(key, 0))
        yield counter(f"volfsm_relay_{key}_total", help_text, (), [((), value)])


_VOLUME_STATS = (
    ("capacity_bytes", "capacity_bytes", "Capacity in bytes of the volume"),
    ("available_bytes", "available_bytes", "Number of available bytes in the volume"),
    ("used_bytes", "used_bytes", "Number of used bytes in the volume"),
    ("inodes", "inodes", "Maximum number of inodes in the volume"),
    ("inodes_free", "inodes_free", "Number of free inodes in the volume"),
    ("inodes_used", "inodes_used", "Number of used inodes in the volume"),
)
"""(metric suffix, `VolumeUsage` field, kubelet's help) of the kubelet_volume_stats_* gauges."""
CLAIM_LABELS = ("namespace", "persistentvolumeclaim")


def volume_stats_families(stats: Sequence[VolumeStats]) -> Iterator[Metric]:
    """The kubelet's volume stats gauges, one series per claim, from the gatherer's cache.

    The health gauge has a series only where the driver reported a condition.
    """
    measured = [s for s in stats if s.usage is not None]
    for suffix, attr, help_text in _VOLUME_STATS:
        yield gauge(
            f"kubelet_volume_stats_{suffix}",
            help_text,
            CLAIM_LABELS,
            [((s.namespace, s.claim), float(getattr(s.usage, attr))) for s in measured],
        )
    yield gauge(
        "kubelet_volume_stats_health_status_abnormal",
        "Abnormal volume health status. The count is either 1 or 0. 1 indicates the volume "
        "is unhealthy, 0 indicates volume is healthy",
        CLAIM_LABELS,
        [
            ((s.namespace, s.claim), 1.0 if s.abnormal else 0.0)
            for s in stats
            if s.abnormal is not None
        ],
    )


EMPTY_DIR_LABELS = ("namespace", "pod", "volume")


def empty_dir_limit_families(stats: Sequence[VolumeStats]) -> Iterator[Metric]:
    """Disk-backed emptyDirs against their sizeLimit, one series per pod volume.

    Where the kubelet evicts the pod (its eviction manager), volfsm reports:
    `volfsm_emptydir_size_limit_exceeded` is 1 while the volume uses more
    than its limit. A volume whose last walk could not finish has no
    `used_bytes` series.
    """
    keyed = [((s.namespace, s.pod_name, s.volume_name), s) for s in stats]
    yield gauge(
        "volfsm_emptydir_size_limit_bytes",
        "sizeLimit of a disk-backed emptyDir volume.",
        EMPTY_DIR_LABELS,
        [(k, float(s.size_limit_bytes or 0)) for k, s in keyed],
    )
    yield gauge(
        "volfsm_emptydir_used_bytes",
        "Bytes a disk-backed emptyDir volume uses on disk (du), as the kubelet measures it.",
        EMPTY_DIR_LABELS,
        [(k, float(s.usage.used_bytes)) for k, s in keyed if s.usage is not None],
    )
    yield gauge(
        "volfsm_emptydir_size_limit_exceeded",
        "1 while a disk-backed emptyDir volume uses more than its sizeLimit (the kubelet "
        "would evict its pod), 0 while it does not.",
        EMPTY_DIR_LABELS,
        [(k, 1.0 if s.abnormal else 0.0) for k, s in keyed if s.abnormal is not None],
    )


def reconstruction_families(report: Mapping[str, Any] | None) -> Iterator[Metric]:
    """The kubelet's reconstruction counters, from the engine's report (one run per start).

    `reconstruct_volume_operations_total`: volumes found on the node that the
    reconstruction handled (rebuilt, or could not be and became orphans);
    `_errors_total`: those that could not be reconstructed. The force-cleaned
    counters count the orphans whose cleanup ran, and those whose cleanup failed.
    """
    report = report or {}
    orphans = list(report.get("orphans") or [])
    failed = 1 if report.get("error") else 0
    ran = [o for o in orphans if o.get("status") in ("cleaned", "failed")]
    values = (
        (
            "reconstruct_volume_operations_total",
            "The number of volumes that were attempted to be reconstructed from the node.",
            int(report.get("reconstructed") or 0) + len(orphans) + failed,
        ),
        (
            "reconstruct_volume_operations_errors_total",
            "The number of volumes that failed reconstruction from the node.",
            len(orphans) + failed,
        ),
        (
            "force_cleaned_failed_volume_operations_total",
            "The number of volumes that were force cleaned after their reconstruction failed.",
            len(ran),
        ),
        (
            "force_cleaned_failed_volume_operation_errors_total",
            "The number of volumes that failed force cleanup after their reconstruction failed.",
            sum(1 for o in ran if o.get("status") == "failed"),
        ),
    )
    for name, help_text, value in values:
        yield counter(name, help_text, (), [((), float(value))])
