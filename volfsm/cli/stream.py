"""`volfsm stream create|check`: the operator's part of the event stream (admin credential).

In a fleet the nodes run as the `node` role (`volfsm serve --stream-setup
check`): they may not create or change the stream. `create` makes it with
the settings volfsm needs (every node's subjects `volfsm.*.events.>`, file
storage, limits retention, the duplicate window, the replicas, direct gets
on), or brings an existing one to them, and says what it did; `check`
changes nothing and prints one line per problem (exit 1), or `ok`.

Exit codes: 0 done / ok, 1 a problem with the stream or with NATS
(unreachable, refused, denied), 2 a bad option. NATS is imported inside the
commands only, so `volfsm --help` stays quick.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from volfsm.bus.credopts import NatsCredentials, with_credentials
from volfsm.cli.common import fail

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.api import StreamInfo

EXIT_FAILED = 1
"""Exit code when the stream has a problem or NATS cannot be used."""
CONNECT_TIMEOUT_S = 5.0
T = TypeVar("T")

app = typer.Typer(
    help="The JetStream stream of every node's events: create it or check it (admin credential).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

NatsOpt = Annotated[
    str,
    typer.Option(
        "--nats",
        envvar="VOLFSM_NATS",
        help="NATS server URL(s), comma-separated.",
        show_default=False,
    ),
]
StreamOpt = Annotated[
    str, typer.Option("--stream", envvar="VOLFSM_STREAM", help="The stream's name.")
]
ReplicasOpt = Annotated[
    int, typer.Option("--replicas", min=1, max=5, help="Replicas (servers holding a copy).")
]
WindowOpt = Annotated[
    float,
    typer.Option(
        "--duplicate-window", min=0.001, help="Duplicate window, seconds (msg-id dedupe)."
    ),
]
TimeoutOpt = Annotated[
    float, typer.Option("--request-timeout", min=0.1, help="Seconds to wait for each reply.")
]


@dataclass(frozen=True)
class StreamTarget:
    """Where the stream is, how to log in, and the settings asked for."""

    url: str
    connect: dict[str, Any]
    stream: str
    replicas: int
    duplicate_window_s: float
    timeout_s: float


def _failed(message: str) -> NoReturn:
    typer.echo(f"volfsm: error: {message}", err=True)
    raise typer.Exit(EXIT_FAILED)


def _target(
    url: str,
    stream: str,
    replicas: int,
    window: float,
    timeout: float,
    credentials: NatsCredentials,
) -> StreamTarget:
    """The checked options; a bad one exits 2."""
    from events.subjects import SubjectError, check_token
    from volfsm.bus.connect import split_servers
    from volfsm.service.config import ConfigError

    try:
        split_servers(url)
        check_token(stream, "stream name")
        connect = credentials.connect_options()
    except (ValueError, SubjectError, ConfigError) as exc:
        fail(str(exc))
    return StreamTarget(url, connect, stream, replicas, window, timeout)


def _stream_options(command: Callable[[StreamTarget], None]) -> Callable[..., None]:
    """Give `command` the options every `volfsm stream` command takes, as one StreamTarget."""

    def wrapper(
        nats: NatsOpt,
        credentials: NatsCredentials,
        stream: StreamOpt = "VOLFSM",
        replicas: ReplicasOpt = 1,
        duplicate_window: WindowOpt = 120.0,
        request_timeout: TimeoutOpt = 10.0,
    ) -> None:
        command(_target(nats, stream, replicas, duplicate_window, request_timeout, credentials))

    wrapper.__name__ = command.__name__
    wrapper.__doc__ = command.__doc__
    return with_credentials(wrapper)


def _run(target: StreamTarget, work: Callable[[JetStreamContext], Awaitable[T]]) -> T:
    """Connect once, run `work` on JetStream (failing fast on a denied request), close."""
    import nats.errors

    from volfsm.bus.connect import Denials, connect_once
    from volfsm.bus.errors import NatsDeniedError, NatsSetupError

    denials = Denials()

    async def on_error(exc: Exception) -> None:
        denials.note(exc)

    async def ignore() -> None:
        return None

    async def main() -> T:
        nc = await connect_once(
            target.url,
            connect_timeout_s=CONNECT_TIMEOUT_S,
            error_cb=on_error,
            disconnected_cb=ignore,
            closed_cb=ignore,
            name="volfsm-stream",
            **target.connect,
        )
        try:
            return await denials.guard(work(nc.jetstream(timeout=target.timeout_s)))
        finally:
            await nc.close()

    try:
        return asyncio.run(main())
    except NatsDeniedError as exc:
        _failed(f"{exc}: this command needs the admin credential (deploy/nats/roles/)")
    except (NatsSetupError, ConnectionError) as exc:
        _failed(str(exc))
    except (nats.errors.Error, TimeoutError) as exc:
        _failed(f"NATS at {target.url}: {exc or type(exc).__name__}")


def describe(info: StreamInfo) -> str:
    """One line: the settings that matter to volfsm, and how much the stream holds."""
    cfg = info.config
    limits = [
        f"{name} {value}"
        for name, value in (
            ("max_age", cfg.max_age),
            ("max_msgs", cfg.max_msgs),
            ("max_bytes", cfg.max_bytes),
            ("max_msgs_per_subject", cfg.max_msgs_per_subject),
        )
        if value and value > 0
    ]
    parts = [
        f"subjects {', '.join(cfg.subjects or [])}",
        f"{cfg.storage} storage",
        f"{cfg.retention} retention",
        f"replicas {cfg.num_replicas or 1}",
        f"duplicate window {cfg.duplicate_window or 0:g}s",
        f"direct get {'on' if cfg.allow_direct else 'off'}",
        f"limits {', '.join(limits)}" if limits else "no limits",
        f"{info.state.messages} messages",
    ]
    return "; ".join(parts)


@app.command("create")
@_stream_options
def create(target: StreamTarget) -> None:
    """Create the event stream, or bring an existing one to volfsm's settings."""

    async def work(js: JetStreamContext) -> list[str]:
        from volfsm.bus.stream import ensure_event_stream

        setup = await ensure_event_stream(
            js,
            target.stream,
            replicas=target.replicas,
            duplicate_window_s=target.duplicate_window_s,
        )
        info = await js.stream_info(target.stream)
        if setup.created:
            first = f"created stream {target.stream}"
        elif setup.changed:
            changes = ", ".join(
                f"{k} {old!r} -> {new!r}" for k, (old, new) in setup.changed.items()
            )
            first = f"updated stream {target.stream}: {changes}"
        else:
            first = f"stream {target.stream} already has volfsm's settings"
        return [first, f"  {describe(info)}"]

    for line in _run(target, work):
        typer.echo(line)


@app.command("check")
@_stream_options
def check(target: StreamTarget) -> None:
    """Check the event stream against these settings: one line per problem (exit 1), or ok."""

    async def work(js: JetStreamContext) -> tuple[list[str], str]:
        import nats.js.errors

        from volfsm.bus.stream import STREAM_CREATE_HINT, stream_problems

        try:
            info = await js.stream_info(target.stream)
        except nats.js.errors.NotFoundError:
            fix = STREAM_CREATE_HINT.format(stream=target.stream)
            return [f"stream {target.stream} does not exist: `{fix}` creates it"], ""
        problems = stream_problems(
            info.config, duplicate_window_s=target.duplicate_window_s, replicas=target.replicas
        )
        return [f"stream {target.stream}: {p}" for p in problems], describe(info)

    problems, summary = _run(target, work)
    if problems:
        for line in problems:
            typer.echo(line)
        raise typer.Exit(EXIT_FAILED)
    typer.echo(f"stream {target.stream} ok: {summary}")


def register(main: typer.Typer) -> None:
    """Add `volfsm stream create|check`."""
    main.add_typer(app, name="stream")
