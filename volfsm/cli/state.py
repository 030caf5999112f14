"""`volfsm state`: the actual state of world, now or as of a seq or a time."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from events.log import EventLog
from events.types import PodAdded, PodPending
from projections.asw import Asw, DeviceState, PodVolumeState
from projections.pending import PendingPods, PendingSpell, pending_json
from projections.textfmt import TIME_HELP, describe_error, describe_operation
from volfsm.cli.common import DataDirOpt, DbOpt, Output, OutputOpt, open_log, parse_time
from volfsm.render import (
    fmt_bytes,
    fmt_duration,
    fmt_ts,
    print_json,
    print_line,
    print_table,
    to_builtins,
)


def _device_row(dev: DeviceState) -> list[str]:
    return [
        dev.volume_id,
        dev.state + (" (reconstructed)" if dev.reconstructed else ""),
        fmt_ts(dev.since_us),
        dev.plugin,
        fmt_bytes(dev.size_bytes),
        dev.device_mount_path,
        describe_operation(dev.last_operation),
        describe_error(dev.last_error),
    ]


def _podvol_row(pv: PodVolumeState, pod_names: dict[str, str]) -> list[str]:
    return [
        pod_names.get(pv.pod_uid, pv.pod_uid),
        pv.volume_name,
        pv.volume_id,
        pv.state
        + (" (reconstructed)" if pv.reconstructed else "")
        + (f" (abnormal: {pv.condition or 'no message'})" if pv.abnormal else ""),
        fmt_ts(pv.since_us),
        pv.mount_path,
        describe_operation(pv.last_operation),
        describe_error(pv.last_error),
    ]


DEVICE_COLUMNS = (
    "VOLUME",
    "STATE",
    "SINCE",
    "PLUGIN",
    "SIZE",
    "DEVICE MOUNT PATH",
    "LAST OP",
    "LAST ERROR",
)


def _pod_row(pod: PodAdded) -> list[str]:
    volumes = ", ".join(f"{v.name}={v.volume_id}" for v in pod.volumes)
    return [pod.pod_uid, f"{pod.namespace}/{pod.name}", volumes]


def _pending_rows(waiting: list[PendingSpell], end_us: int) -> list[list[str]]:
    return [
        [
            s.pod_uid,
            s.pod,
            fmt_ts(s.since_us),
            fmt_duration(s.duration_us(end_us)),
            f"volume {w.name}: {w.text}",
        ]
        for s in waiting
        for w in s.waiting
    ]


def print_state_table(
    asw: Asw,
    node: str,
    pod_names: dict[str, str],
    asked: str | None = None,
    pending: PendingPods | None = None,
    at_us: int | None = None,
) -> None:
    """The ASW as three tables: devices, pod volumes, desired pods; and a fourth of the
    pods waiting for their claims, if any (one row per waiting volume; how long they have
    waited is measured to `at_us`, default the last event)."""
    as_of = f"seq {asw.last_seq} ({fmt_ts(asw.last_ts)})" if asw.last_seq else "seq 0 (no events)"
    asked_text = f" (asked for {asked})" if asked else ""
    print_line(f"node {node or '?'}, as of {as_of}{asked_text}")
    print_line("")
    print_table(
        "Devices",
        [
            "VOLUME",
            "STATE",
            "SINCE",
            "PLUGIN",
            "SIZE",
            "DEVICE MOUNT PATH",
            "LAST OP",
            "LAST ERROR",
        ],
        [_device_row(d) for d in sorted(asw.devices.values(), key=lambda d: d.volume_id)],
    )
    print_line("")
    print_table(
        "Pod volumes",
        ["POD", "VOLUME", "VOLUME ID", "STATE", "SINCE", "MOUNT PATH", "LAST OP", "LAST ERROR"],
        sorted(_podvol_row(pv, pod_names) for pv in asw.podvols.values()),
    )
    print_line("")
    print_table(
        "Desired pods",
        ["POD UID", "POD", "VOLUMES"],
        [
            [
                uid,
                f"{p.namespace}/{p.name}",
                ", ".join(f"{v.name}={v.volume_id}" for v in p.volumes),
            ]
            for uid, p in sorted(asw.desired_pods.items())
        ],
    )
    waiting = _waiting(pending)
    if waiting:
        print_line("")
        print_table(
            "Pending pods (desired, nothing mounted until every volume resolves)",
            ["POD UID", "POD", "PENDING SINCE", "FOR", "WAITING FOR"],
            _pending_rows(waiting, at_us if at_us is not None else asw.last_ts),
        )


def _waiting(pending: PendingPods | None) -> list[PendingSpell]:
    """The waits still going, by pod name and uid."""
    if pending is None:
        return []
    return sorted(pending.open.values(), key=lambda s: (s.pod, s.pod_uid))


def _as_dict(obj: object) -> dict[str, Any]:
    result = to_builtins(obj)
    assert isinstance(result, dict)
    return result


def state_json(
    asw: Asw,
    node: str,
    asked: str | None = None,
    pending: PendingPods | None = None,
    at_us: int | None = None,
) -> dict[str, Any]:
    """The ASW as a JSON document (times in µs, plus ISO `since`).

    `as_of` is the last event applied; `asked` echoes --at / --seq (null if neither).
    `pending_pods` lists the pods waiting for their claims (`pending_json`; not in
    `desired_pods`, which holds the added ones), `duration_us` measured to `at_us` (default:
    the last event).
    """
    devices = []
    for dev in sorted(asw.devices.values(), key=lambda d: d.volume_id):
        item = _as_dict(dev)
        item["since"] = fmt_ts(dev.since_us)
        devices.append(item)
    podvols = []
    for _, pv in sorted(asw.podvols.items()):
        item = _as_dict(pv)
        item["since"] = fmt_ts(pv.since_us)
        podvols.append(item)
    return {
        "node": node,
        "as_of": {"seq": asw.last_seq, "ts": asw.last_ts, "time": fmt_ts(asw.last_ts) or None},
        "asked": asked,
        "devices": devices,
        "pod_volumes": podvols,
        "desired_pods": [_as_dict(p) for _, p in sorted(asw.desired_pods.items())],
        "desired_sizes": dict(sorted(asw.desired_sizes.items())),
        "pending_pods": [
            pending_json(s, at_us if at_us is not None else asw.last_ts) for s in _waiting(pending)
        ],
    }


def load_state(
    log: EventLog, seq: int | None, at_us: int | None
) -> tuple[Asw, dict[str, str], PendingPods]:
    """Fold the log up to `seq`, or to the last event at or before `at_us`, or all of it.

    Also returns 'namespace/name' of every pod seen so far, removed pods included,
    and the pods' waits for their claims.
    """
    if at_us is not None:
        seq = log.seq_at_time(at_us)
    asw = Asw()
    pod_names: dict[str, str] = {}
    pending = PendingPods()
    for env in log.read_after(0, until_seq=seq):
        asw.apply(env)
        body = env.body
        if isinstance(body, PodAdded | PodPending):
            pod_names[body.pod_uid] = f"{body.namespace}/{body.name}"
            pending.apply(env)
        elif env.type == "PodRemoved":
            pending.apply(env)
    return asw, pod_names, pending


def state(
    at: Annotated[str | None, typer.Option("--at", help=f"State at this time. {TIME_HELP}")] = None,
    seq: Annotated[
        int | None, typer.Option("--seq", min=0, help="State right after this seq.")
    ] = None,
    output: OutputOpt = Output.table,
    data_dir: DataDirOpt = None,
    db: DbOpt = None,
) -> None:
    """Show the actual state of world: devices, pod volumes, desired pods."""
    if at is not None and seq is not None:
        raise typer.BadParameter("give --at or --seq, not both", param_hint="--at/--seq")
    at_us = parse_time(at, option="--at") if at is not None else None
    with open_log(data_dir, db) as log:
        asw, pod_names, pending = load_state(log, seq, at_us)
        node = log.node
    asked = f"time {fmt_ts(at_us)}" if at_us is not None else None
    if seq is not None:
        asked = f"seq {seq}"
    if output is Output.json:
        print_json(state_json(asw, node, asked, pending, at_us))
    else:
        print_state_table(asw, node, pod_names, asked, pending, at_us)


def register(app: typer.Typer) -> None:
    """Add `state` to the CLI."""
    app.command("state")(state)
