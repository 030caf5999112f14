"""Prometheus metrics of the node service, rendered as text exposition format 0.0.4.

Written without `prometheus_client` (not a dependency): a counter, a
histogram and a text renderer are a few dozen lines. Two kinds of numbers:

* counted as events are appended (a `CommandHandler` listener): transitions
  by FSM and event type, operations by name, plugin and result, and
  `storage_operation_duration_seconds` from the `duration_s` of
  OperationSucceeded / OperationFailed (the plugin comes from the matching
  OperationStarted);
* read at scrape time, as the kubelet's volume manager collector does:
  `volume_manager_total_volumes{plugin_name,state}`, devices and pod-volumes
  by state, running operations, publish lag, relay counters, readiness.

Labels are low-cardinality only (plugin, operation, state, result, verb,
error code); never a volume id, pod uid or name.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from events.tables import DETACHED, MOUNTED, UNMOUNTED
from events.types import (
    DesiredVolume,
    Envelope,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    VolumeSource,
)
from projections.asw import Asw

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

KUBELET_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0)
"""kubelet's storage_operation_duration_seconds buckets."""

UNKNOWN_PLUGIN = "N/A"
PLUGIN_CSI = "kubernetes.io/csi"
CSI_PREFIX = PLUGIN_CSI + "/"
ASW_STATE = "actual_state_of_world"
DSW_STATE = "desired_state_of_world"

Labels = tuple[tuple[str, str], ...]


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


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


@dataclass
class Family:
    """One metric family: its samples (name suffix, labels, value) for rendering."""

    name: str
    kind: str
    help: str
    samples: list[tuple[str, Labels, float]] = field(default_factory=list)

    def add(self, labels: Labels, value: float, suffix: str = "") -> None:
        """Add one sample."""
        self.samples.append((suffix, labels, value))

    def render(self) -> str:
        """The family in text exposition format."""
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        lines.extend(f"{self.name}{sfx}{_labels(lbl)} {_num(v)}" for sfx, lbl, v in self.samples)
        return "\n".join(lines) + "\n"


class Counter:
    """A labelled counter."""

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

    def family(self) -> Family:
        """The counter as a family."""
        fam = Family(self.name, "counter", self.help)
        for values, total in sorted(self.values.items()):
            fam.add(tuple(zip(self.label_names, values, strict=True)), total)
        return fam


class Histogram:
    """A labelled histogram with fixed buckets."""

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

    def family(self) -> Family:
        """The histogram as a family (cumulative buckets, _sum, _count)."""
        fam = Family(self.name, "histogram", self.help)
        for values, counts in sorted(self.counts.items()):
            base = tuple(zip(self.label_names, values, strict=True))
            for upper, n in zip(self.buckets, counts, strict=False):
                fam.add((*base, ("le", _num(upper))), n, "_bucket")
            fam.add((*base, ("le", "+Inf")), counts[-1], "_bucket")
            fam.add(base, self.sums[values], "_sum")
            fam.add(base, counts[-1], "_count")
        return fam


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
    """Scrape-time state handed to `ServiceMetrics.render`."""

    ready: bool
    last_seq: int
    asw: Asw | None = None
    desired: Iterable[tuple[PodAdded, DesiredVolume]] = ()
    running_operations: int = 0
    relay: RelayView | None = None
    relay_counters: dict[str, int] = field(default_factory=dict)
    intake_connected: bool = False


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


class ServiceMetrics:
    """The service's counters and histograms, fed by appended events and commands."""

    def __init__(self) -> None:
        self.transitions = Counter(
            "volfsm_transitions_total",
            "FSM transitions recorded, by state machine and event type.",
            ("fsm", "event"),
        )
        self.desired_events = Counter(
            "volfsm_desired_events_total",
            "Desired-state events recorded (pods added / removed, sizes).",
            ("event",),
        )
        self.operations_started = Counter(
            "volfsm_operations_started_total",
            "Operations started, by operation and plugin.",
            ("operation", "plugin"),
        )
        self.operations = Counter(
            "volfsm_operations_total",
            "Operations finished, by operation, plugin and result (success / failure).",
            ("operation", "plugin", "result"),
        )
        self.operation_errors = Counter(
            "volfsm_operation_errors_total",
            "Failed operations by error code and whether the error was final.",
            ("operation", "plugin", "code", "final"),
        )
        self.durations = Histogram(
            "storage_operation_duration_seconds",
            "Storage operation duration (kubelet-compatible).",
            ("volume_plugin", "operation_name", "status"),
        )
        self.commands = Counter(
            "volfsm_commands_total",
            "Commands received over NATS, by verb and result code ('ok' when it succeeded).",
            ("verb", "code"),
        )
        self._op_plugins: dict[str, str] = {}

    # ----------------------------------------------------------- feeding

    def observe(self, envs: list[Envelope]) -> None:
        """A `CommandHandler` listener: count what was just appended."""
        for env in envs:
            body = env.body
            kind = type(body).KIND
            if kind in ("device", "podvol"):
                self.transitions.inc(kind, env.type)
            elif kind == "desired":
                self.desired_events.inc(env.type)
            elif isinstance(body, OperationStarted):
                plugin = body.plugin or UNKNOWN_PLUGIN
                self._op_plugins[body.op_id] = plugin
                self.operations_started.inc(body.operation, plugin)
            elif isinstance(body, OperationSucceeded):
                plugin = self._op_plugins.pop(body.op_id, UNKNOWN_PLUGIN)
                self.operations.inc(body.operation, plugin, "success")
                self.durations.observe(body.duration_s, plugin, body.operation, "success")
            elif isinstance(body, OperationFailed):
                plugin = self._op_plugins.pop(body.op_id, UNKNOWN_PLUGIN)
                self.operations.inc(body.operation, plugin, "failure")
                self.operation_errors.inc(
                    body.operation, plugin, body.code, "true" if body.final else "false"
                )
                self.durations.observe(body.duration_s, plugin, body.operation, "fail-unknown")

    def command(self, verb: str, code: str) -> None:
        """Count one command and its outcome."""
        self.commands.inc(verb, code)

    # ---------------------------------------------------------- rendering

    def render(self, snap: Snapshot) -> str:
        """Every family as Prometheus text."""
        families = [
            self._gauge(
                "volfsm_ready",
                "1 once the ASW is rebuilt and a first reconcile ran.",
                [((), 1.0 if snap.ready else 0.0)],
            ),
            self._gauge(
                "volfsm_log_last_seq",
                "Seq of the last event in the local log.",
                [((), float(snap.last_seq))],
            ),
            self._gauge(
                "volfsm_operations_running",
                "Operations running now (pending).",
                [((), float(snap.running_operations))],
            ),
            *self._volume_families(snap),
            *self._relay_families(snap),
            self.transitions.family(),
            self.desired_events.family(),
            self.operations_started.family(),
            self.operations.family(),
            self.operation_errors.family(),
            self.durations.family(),
            self.commands.family(),
        ]
        return "".join(f.render() for f in families)

    @staticmethod
    def _gauge(name: str, help_text: str, samples: Iterable[tuple[Labels, float]]) -> Family:
        fam = Family(name, "gauge", help_text)
        for labels, value in samples:
            fam.add(labels, value)
        return fam

    def _volume_families(self, snap: Snapshot) -> list[Family]:
        total = Family(
            "volume_manager_total_volumes",
            "gauge",
            "Number of volumes in the actual (Mounted pod-volumes) and desired state of world "
            "(kubelet-compatible).",
        )
        devices: dict[tuple[str, str], int] = defaultdict(int)
        podvols: dict[tuple[str, str], int] = defaultdict(int)
        per_plugin: dict[tuple[str, str], int] = defaultdict(int)
        plugin_of: dict[str, str] = {}
        for _pod, dv in snap.desired:
            label = plugin_label(dv.source)
            plugin_of.setdefault(dv.volume_id, label)
            per_plugin[(label, DSW_STATE)] += 1
        if snap.asw is not None:
            for dev in snap.asw.devices.values():
                if dev.state == DETACHED:
                    continue
                label = plugin_of.get(dev.volume_id) or plugin_of_volume_id(dev.volume_id)
                devices[(label, dev.state)] += 1
            for pv in snap.asw.podvols.values():
                if pv.state == UNMOUNTED:
                    continue
                label = plugin_of.get(pv.volume_id) or plugin_of_volume_id(pv.volume_id)
                podvols[(label, pv.state)] += 1
                if pv.state == MOUNTED:
                    per_plugin[(label, ASW_STATE)] += 1
        for (plugin, state), n in sorted(per_plugin.items()):
            total.add((("plugin_name", plugin), ("state", state)), n)
        dev_fam = self._gauge(
            "volfsm_devices",
            "Volumes on the node by device FSM state and plugin (Detached ones left out).",
            [((("plugin", p), ("state", s)), n) for (p, s), n in sorted(devices.items())],
        )
        pv_fam = self._gauge(
            "volfsm_pod_volumes",
            "Pod-volumes by FSM state and plugin (Unmounted ones left out).",
            [((("plugin", p), ("state", s)), n) for (p, s), n in sorted(podvols.items())],
        )
        return [total, dev_fam, pv_fam]

    def _relay_families(self, snap: Snapshot) -> list[Family]:
        relay = snap.relay
        lag = float(relay.lag()) if relay is not None else float(snap.last_seq)
        fams = [
            self._gauge(
                "volfsm_publish_lag_events",
                "Events in the local log not yet acknowledged by JetStream.",
                [((), lag)],
            ),
            self._gauge(
                "volfsm_relay_connected",
                "1 while the relay has a NATS session.",
                [((), 1.0 if relay is not None and relay.connected else 0.0)],
            ),
            self._gauge(
                "volfsm_relay_acked_seq",
                "Every event up to this seq is in the JetStream stream.",
                [((), float(relay.acked_seq if relay is not None else 0))],
            ),
            self._gauge(
                "volfsm_commands_connected",
                "1 while the command intake is connected to NATS.",
                [((), 1.0 if snap.intake_connected else 0.0)],
            ),
        ]
        for key, help_text in _RELAY_COUNTERS.items():
            fam = Family(f"volfsm_relay_{key}_total", "counter", help_text)
            fam.add((), float(snap.relay_counters.get(key, 0)))
            fams.append(fam)
        return fams
