"""`volfsm events [--follow]`: the node's events as its JetStream stream holds them, live.

An ephemeral pull consumer on `volfsm.<node>.events.>` (deleted on exit)
reads the stream: by default everything it holds,
then exits; with `--follow` only what comes next, until Ctrl-C or SIGTERM
(exit 0). `--since TIME` starts at that time either way. Filters: `--pod`
(NAMESPACE/NAME or uid; a name is matched through the PodAdded events read
and, at the start, the pods the node has now), `--volume`, `--type`
(event type) and `--kind` (desired, device, podvol, operation,
observation); all given must match. `-o json` prints one envelope per line
(the JSON NATS carries).

Reading the stream takes a consumer: with the bus roles of
`volfsm.bus.roles`, the `client` role may make it (under one of the names
`volfsm_events_<k>`, filtered on node events); the embedded server has no
roles.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

import typer

from projections.textfmt import TIME_HELP
from volfsm.cli.common import fail, parse_time
from volfsm.cli.ops import ServiceOptions, service_command
from volfsm.cli.refs import PodRef, parse_pod
from volfsm.render import fmt_ts, print_line

EVENT_KINDS = ("desired", "device", "podvol", "operation", "observation")
IDLE_S = 30.0
"""Without --follow: give up on a stream that delivers nothing for this long."""


class EventsOutput(StrEnum):
    """How each event is printed."""

    table = "table"
    json = "json"


@dataclass
class EventFilter:
    """What `volfsm events` keeps, and the pod names it has learnt."""

    pod: PodRef | None = None
    volume: str | None = None
    types: frozenset[str] = frozenset()
    kinds: frozenset[str] = frozenset()
    pod_uids: set[str] = field(default_factory=set)

    def learn(self, env: Any) -> None:
        """A PodAdded of the pod asked for by name: its uid is in from now on."""
        body, ref = env.body, self.pod
        if ref is None or type(body).__name__ != "PodAdded":
            return
        if (body.namespace, body.name) == (ref.namespace, ref.name) or body.pod_uid == ref.text:
            self.pod_uids.add(body.pod_uid)

    def keeps(self, env: Any) -> bool:
        """Whether every given filter matches the envelope."""
        body = env.body
        if self.types and env.type not in self.types:
            return False
        if self.kinds and type(body).KIND not in self.kinds:
            return False
        if self.volume is not None and not _of_volume(env, self.volume):
            return False
        if self.pod is not None:
            uid = getattr(body, "pod_uid", "") or _stream_pod(env.stream)
            return uid in self.pod_uids or uid == self.pod.text
        return True


def _of_volume(env: Any, volume: str) -> bool:
    return env.stream == f"device/{volume}" or getattr(env.body, "volume_id", "") == volume


def _stream_pod(stream: str) -> str:
    for prefix in ("pod/", "podvol/"):
        if stream.startswith(prefix):
            return stream[len(prefix) :].split("/", 1)[0]
    return ""


def _line(env: Any) -> str:
    from volfsm.cli.history import event_details

    return f"{fmt_ts(env.ts)}  #{env.seq}  {env.type}  {env.stream}  {event_details(env)}"


@service_command
def events(
    follow_: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Keep printing events as they come (until Ctrl-C or SIGTERM)."
        ),
    ] = False,
    since: Annotated[
        str | None, typer.Option("--since", help=f"Start at this time. {TIME_HELP}")
    ] = None,
    pod: Annotated[
        str | None, typer.Option("--pod", help="Only this pod's events: NAMESPACE/NAME or uid.")
    ] = None,
    volume: Annotated[str | None, typer.Option("--volume", help="Only this volume's events.")] = (
        None
    ),
    type_: Annotated[
        list[str] | None,
        typer.Option("--type", help="Only this event type, e.g. OperationFailed (repeatable)."),
    ] = None,
    kind: Annotated[
        list[str] | None,
        typer.Option("--kind", help=f"Only this kind: {', '.join(EVENT_KINDS)} (repeatable)."),
    ] = None,
    stream: Annotated[str, typer.Option("--stream", help="The JetStream stream.")] = "VOLFSM",
    output: Annotated[
        EventsOutput,
        typer.Option("--output", "-o", help="table: one line each; json: one envelope per line."),
    ] = EventsOutput.table,
    *,
    opts: ServiceOptions,
) -> None:
    """Print the node's events from its JetStream stream; --follow keeps printing new ones."""
    from events.types import EVENT_TYPES

    unknown = [t for t in type_ or () if t not in EVENT_TYPES]
    if unknown:
        raise typer.BadParameter(
            f"unknown event type(s) {', '.join(unknown)}; known: {', '.join(EVENT_TYPES)}",
            param_hint="--type",
        )
    bad_kinds = [k for k in kind or () if k not in EVENT_KINDS]
    if bad_kinds:
        raise typer.BadParameter(
            f"unknown kind(s) {', '.join(bad_kinds)}; known: {', '.join(EVENT_KINDS)}",
            param_hint="--kind",
        )
    try:
        ref = parse_pod(pod) if pod is not None else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--pod") from None
    since_us = parse_time(since, option="--since") if since is not None else None
    flt = EventFilter(ref, volume, frozenset(type_ or ()), frozenset(kind or ()))
    show = _json_line if output is EventsOutput.json else _text_line
    target = opts.target()
    from volfsm.cli.tail import TailError, tail

    try:
        tail(target, stream, flt, show, since_us=since_us, follow=follow_, idle_s=IDLE_S)
    except TailError as exc:
        if exc.usage:
            fail(str(exc))
        typer.echo(f"volfsm: error: {exc}", err=True)
        raise typer.Exit(1) from None


def _text_line(env: Any, _raw: bytes) -> None:
    print_line(_line(env))


def _json_line(_env: Any, raw: bytes) -> None:
    sys.stdout.write(raw.decode() + "\n")


def register(app: typer.Typer) -> None:
    """Add `events` to the CLI."""
    app.command("events")(events)
