"""`volfsm explain pod NS/NAME|UID [--at T]`: why a pod's volumes are or are not mounted."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import typer

from events.log import EventLog
from projections.explain import (
    Attempt,
    EntryStatus,
    ExplainFold,
    PodExplanation,
    PodNotFoundError,
    describe_attempt,
    explain_folded,
)
from projections.textfmt import TIME_HELP
from volfsm.cli.common import DataDirOpt, DbOpt, Output, OutputOpt, fail, open_log, parse_time
from volfsm.cli.refs import UnknownNameError, resolve_pods
from volfsm.render import fmt_bytes, fmt_duration, fmt_ts, print_json, print_line


def _status_text(status: EntryStatus, at_us: int) -> str:
    if status.since_us is None:
        return status.state
    text = (
        f"{status.state} since {fmt_ts(status.since_us)} ({fmt_duration(at_us - status.since_us)})"
    )
    if status.reconstructed:
        text += " (reconstructed)"
    if status.reason:
        text += f": {status.reason}"
    return text


def _attempt_line(a: Attempt) -> str:
    """One attempt: when it ended (or started, if still running), where, and how."""
    stream = "device" if a.stream.startswith("device/") else "pod volume"
    when = fmt_ts(a.ended_us if a.ended_us is not None else a.started_us)
    text = f"{when}  [{stream}] {describe_attempt(a)}"
    if a.status == "running" and a.reason:
        text += f", started because: {a.reason}"
    return text


def print_explanation(exp: PodExplanation) -> None:
    """The explanation as indented text."""
    at = exp.at_us
    print_line(
        f"pod {exp.namespace}/{exp.name} (uid {exp.pod_uid}) at {fmt_ts(at)} "
        f"(as of seq {exp.as_of_seq}; relative times are to this moment)"
    )
    if exp.waiting:
        print_line(
            f"desired: yes, since {fmt_ts(exp.added_us)} (pending: nothing is mounted until "
            "every volume resolves)"
        )
        print_line("waiting for:")
        for item in exp.waiting:
            print_line(f"  - {item}")
    elif exp.desired:
        print_line(f"desired: yes, since {fmt_ts(exp.added_us)}")
    else:
        print_line(
            f"desired: no, removed at {fmt_ts(exp.removed_us)} (added at {fmt_ts(exp.added_us)})"
        )
    counts = ", ".join(f"{verdict} {n}" for verdict, n in exp.counts().items())
    print_line(f"volumes: {len(exp.volumes)} ({counts})")
    for vol in exp.volumes:
        print_line("")
        print_line(
            f"volume {vol.name}: {vol.verdict.upper()} ({vol.volume_id}, {vol.plugin or '?'})"
        )
        print_line(f"  pod volume: {_status_text(vol.pod_volume, at)}")
        print_line(f"  device:     {_status_text(vol.device, at)}")
        if vol.condition:
            print_line(f"  condition:  ABNORMAL: {vol.condition}")
        if vol.capacity_bytes:
            print_line(
                f"  usage:      {fmt_bytes(vol.used_bytes)} of {fmt_bytes(vol.capacity_bytes)}"
            )
        if vol.operations:
            print_line("  last operations:")
            for a in vol.operations:
                print_line(f"    {_attempt_line(a)}")
        else:
            print_line("  last operations: none")
        b = vol.backoff
        if b is None:
            print_line("  backoff:    none pending")
        else:
            print_line(
                f"  backoff:    {b.operation} after {b.code}: no retry before "
                f"{fmt_ts(b.retry_at_us)} (in {fmt_duration(b.retry_at_us - at)}; "
                f"backoff {b.backoff_s:g}s from {fmt_ts(b.failed_us)})"
            )
        print_line("  waiting for:")
        for item in vol.waiting_for:
            print_line(f"    - {item}")


def explanation_json(exp: PodExplanation) -> dict[str, Any]:
    """The explanation as JSON, ISO times beside the µs ones."""
    doc: dict[str, Any] = msgspec.to_builtins(exp)
    if not exp.waiting:
        doc.pop("waiting", None)  # only a pending pod's
    doc["at"] = fmt_ts(exp.at_us)
    doc["counts"] = exp.counts()
    for vol, item in zip(exp.volumes, doc["volumes"], strict=True):
        for key in ("condition", "capacity_bytes", "used_bytes"):
            if not item.get(key):
                item.pop(key, None)  # only what the log recorded (health and usage)
        for op, op_item in zip(vol.operations, item["operations"], strict=True):
            op_item["retry_at_us"] = op.retry_at_us
        if vol.backoff is not None:
            item["backoff"]["retry_at"] = fmt_ts(vol.backoff.retry_at_us)
            item["backoff"]["retry_in_us"] = vol.backoff.retry_at_us - exp.at_us
    return doc


def load_explanation(log: EventLog, ref: str, at_us: int | None) -> PodExplanation:
    """Fold the log up to `at_us` (or all of it) and explain pod `ref`."""
    until = log.seq_at_time(at_us) if at_us is not None else None
    fold = ExplainFold()
    log.replay(fold.apply, 0, until)
    return explain_folded(fold, ref, at_us)


explain_app = typer.Typer(
    name="explain",
    help="Explain the state of something in the log (offline, read-only).",
    no_args_is_help=True,
)


@explain_app.command("pod")
def explain_pod_cmd(
    pod: Annotated[
        str,
        typer.Argument(help="The pod: NAMESPACE/NAME (the latest pod of that name) or its UID."),
    ],
    at: Annotated[
        str | None,
        typer.Option(
            "--at", help=f"Explain at this moment (default: the end of the log). {TIME_HELP}"
        ),
    ] = None,
    output: OutputOpt = Output.table,
    data_dir: DataDirOpt = None,
    db: DbOpt = None,
) -> None:
    """Why the pod's volumes are or are not mounted.

    Per volume: the pod-volume and device states and why, the last operations
    and errors, a pending backoff (retry allowed when, relative to --at or the
    end of the log), and what the reconciler is waiting for.
    """
    at_us = parse_time(at, option="--at") if at is not None else None
    with open_log(data_dir, db) as log:
        try:
            found = resolve_pods(log, pod)
        except (UnknownNameError, ValueError) as exc:
            fail(str(exc))
        ref = found[0].uid if found[0].uid == pod else found[0].label
        try:
            exp = load_explanation(log, ref, at_us)
        except PodNotFoundError:
            fail(
                f"no pod {pod} in this log at or before {fmt_ts(at_us)}; it was first added "
                f"at seq {found[0].added_seq} (give a later --at)"
            )
    if output is Output.json:
        print_json(explanation_json(exp))
    else:
        print_explanation(exp)


def register(app: typer.Typer) -> None:
    """Add `explain pod` and `explain object` to the CLI."""
    from volfsm.cli import explain_object

    explain_object.register(explain_app)
    app.add_typer(explain_app)
