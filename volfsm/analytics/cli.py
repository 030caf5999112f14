"""`volfsm analytics ...`: the aggregator service, the report and the Parquet export.

A Typer sub-app (`app`); the main CLI adds it with
`app.add_typer(analytics.cli.app, name="analytics")`.
"""

from __future__ import annotations

import asyncio
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from projections.textfmt import TIME_HELP, parse_time
from volfsm.analytics.defaults import (
    DEFAULT_DURABLE,
    DEFAULT_LAG_THRESHOLD_S,
    DEFAULT_STUCK_THRESHOLD_S,
    EVENT_SUBJECTS,
)

app = typer.Typer(
    help="Cluster-wide storage analytics over every node's events in JetStream.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


EXIT_USAGE = 2


def fail(message: str) -> NoReturn:
    """Print `volfsm: error: <message>` to stderr and exit with code 2."""
    typer.echo(f"volfsm: error: {message}", err=True)
    raise typer.Exit(EXIT_USAGE)


def time_option(text: str | None, option: str) -> int | None:
    """A TIME option as UTC µs (None if not given); a bad one is a usage error."""
    if text is None:
        return None
    try:
        return parse_time(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


class Format(StrEnum):
    """Report output format."""

    table = "table"
    json = "json"


DbOpt = Annotated[Path, typer.Option("--db", help="The analytics store (SQLite file).")]
SinceOpt = Annotated[
    str | None, typer.Option("--since", help=f"Only events since TIME. {TIME_HELP}")
]
LagOpt = Annotated[
    float,
    typer.Option("--lag-threshold", help="A node silent longer than this (s) is lagging."),
]
StuckOpt = Annotated[
    float,
    typer.Option("--stuck-threshold", help="An entry Uncertain longer than this (s) is stuck."),
]


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise typer.BadParameter(f"{text!r} is not HOST:PORT", param_hint="--http")
    return host.strip("[]") or "127.0.0.1", int(port)


@app.command()
def serve(
    nats_url: Annotated[str, typer.Option("--nats", help="NATS server URL(s), comma-separated.")],
    db: DbOpt,
    http: Annotated[
        str | None,
        typer.Option("--http", help="Serve the dashboard, /api/report and /metrics on HOST:PORT."),
    ] = None,
    from_start: Annotated[
        bool, typer.Option("--from-start", help="(Re)start the consumer at the stream's start.")
    ] = False,
    since: Annotated[
        str | None,
        typer.Option(
            "--since", help=f"(Re)start the consumer at messages stored since TIME. {TIME_HELP}"
        ),
    ] = None,
    durable: Annotated[str, typer.Option("--durable", help="Durable consumer name.")] = (
        DEFAULT_DURABLE
    ),
    stream: Annotated[
        str | None,
        typer.Option(
            "--stream", help=f"JetStream stream (default: the one holding {EVENT_SUBJECTS})."
        ),
    ] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Messages per fetch.")] = 1000,
    lag_threshold: LagOpt = DEFAULT_LAG_THRESHOLD_S,
    stuck_threshold: StuckOpt = DEFAULT_STUCK_THRESHOLD_S,
) -> None:
    """Consume every node's events into the store, exactly once; optionally serve HTTP."""
    from volfsm.analytics.aggregator import AggregatorConfig, StartFrom
    from volfsm.analytics.report import ReportOptions
    from volfsm.analytics.run import serve as run_serve
    from volfsm.analytics.store import StoreError

    if from_start and since is not None:
        fail("--from-start and --since exclude each other")
    config = AggregatorConfig(durable=durable, stream=stream, batch=batch)
    if from_start:
        config.start = StartFrom.BEGINNING
    elif since is not None:
        config.start = StartFrom.TIME
        config.start_time_us = time_option(since, "--since")
    address = _host_port(http) if http is not None else None
    options = ReportOptions(lag_threshold_s=lag_threshold, stuck_threshold_s=stuck_threshold)
    try:
        asyncio.run(run_serve(nats_url, db, config, address, options))
    except StoreError as exc:
        fail(str(exc))


@app.command()
def report(
    db: DbOpt,
    since: SinceOpt = None,
    output: Annotated[
        Format, typer.Option("--output", "-o", help="Output format.", case_sensitive=False)
    ] = Format.table,
    lag_threshold: LagOpt = DEFAULT_LAG_THRESHOLD_S,
    stuck_threshold: StuckOpt = DEFAULT_STUCK_THRESHOLD_S,
    now: Annotated[
        str | None, typer.Option("--now", help=f"Compute as of TIME (default: now). {TIME_HELP}")
    ] = None,
) -> None:
    """The analytics report from a store: operations, failures, Uncertain, nodes, pods."""
    from volfsm.analytics.report import (
        ReportOptions,
        print_report,
        report_document,
        store_report,
    )
    from volfsm.analytics.store import AnalyticsStore, StoreError
    from volfsm.render import print_json

    options = ReportOptions(
        since_us=time_option(since, "--since"),
        lag_threshold_s=lag_threshold,
        stuck_threshold_s=stuck_threshold,
    )
    now_us = time_option(now, "--now")
    try:
        with AnalyticsStore(db, read_only=True) as store:
            rep = store_report(store, options, now_us=now_us)
            counters = store.counters()
    except StoreError as exc:
        fail(str(exc))
    if output is Format.json:
        print_json(report_document(rep, counters))
    else:
        print_report(rep, counters)


@app.command("export")
def export_cmd(
    db: DbOpt,
    out: Annotated[Path, typer.Option("--out", help="The Parquet file to write.")],
    since: SinceOpt = None,
) -> None:
    """Write the flattened events to a Parquet file (needs pyarrow)."""
    from volfsm.analytics.export import ExportUnavailableError, export_parquet
    from volfsm.analytics.store import AnalyticsStore, StoreError

    since_us = time_option(since, "--since")
    try:
        with AnalyticsStore(db, read_only=True) as store:
            rows = export_parquet(store, out, since_us=since_us)
    except (StoreError, ExportUnavailableError) as exc:
        fail(str(exc))
    print(f"{rows} events written to {out}", file=sys.stderr)
