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
    DEFAULT_NEAR_FULL,
    DEFAULT_PARTITIONS,
    DEFAULT_STUCK_THRESHOLD_S,
    DEFAULT_TOP_VOLUMES,
    EVENT_SUBJECTS,
    partition_durable,
    partition_subjects,
)
from volfsm.bus.credopts import NatsCredentials, with_credentials

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


DbOpt = Annotated[Path, typer.Option("--db", help="The analytics store (a directory).")]
DbsOpt = Annotated[
    list[Path],
    typer.Option(
        "--db", help="The analytics store (a directory); repeat to read several together."
    ),
]
SinceOpt = Annotated[
    str | None, typer.Option("--since", help=f"Only events since TIME. {TIME_HELP}")
]
UntilOpt = Annotated[
    str | None, typer.Option("--until", help=f"Only events before TIME. {TIME_HELP}")
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
@with_credentials
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
    partition: Annotated[
        int | None,
        typer.Option(
            "--partition",
            min=0,
            help="Own this ingest partition only (the stream must be partitioned: see "
            "`partition`).",
        ),
    ] = None,
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, help="How many ingest partitions there are.")
    ] = DEFAULT_PARTITIONS,
    lag_threshold: LagOpt = DEFAULT_LAG_THRESHOLD_S,
    stuck_threshold: StuckOpt = DEFAULT_STUCK_THRESHOLD_S,
    *,
    credentials: NatsCredentials,
) -> None:
    """Consume every node's events into the store, exactly once; optionally serve HTTP.

    With NATS credentials, those of the aggregator role (deploy/nats/roles/).
    """
    from volfsm.analytics.aggregator import AggregatorConfig, StartFrom
    from volfsm.analytics.partition import PartitionError
    from volfsm.analytics.report import ReportOptions
    from volfsm.analytics.run import serve as run_serve
    from volfsm.analytics.store import StoreError
    from volfsm.bus.urls import split_servers
    from volfsm.service.config import ConfigError

    if from_start and since is not None:
        fail("--from-start and --since exclude each other")
    try:
        connect = credentials.connect_options()
    except ConfigError as exc:
        fail(str(exc))
    try:
        split_servers(nats_url)
    except ValueError as exc:
        fail(f"--nats: {exc}")
    if partition is not None and partition >= partitions:
        fail(f"--partition {partition} of --partitions {partitions} does not exist")
    config = AggregatorConfig(
        durable=partition_durable(durable, partition),
        stream=stream,
        subjects=partition_subjects(partition),
        batch=batch,
        partition=partition,
        partitions=partitions if partition is not None else 1,
    )
    if from_start:
        config.start = StartFrom.BEGINNING
    elif since is not None:
        config.start = StartFrom.TIME
        config.start_time_us = time_option(since, "--since")
    address = _host_port(http) if http is not None else None
    options = ReportOptions(lag_threshold_s=lag_threshold, stuck_threshold_s=stuck_threshold)
    try:
        asyncio.run(run_serve(nats_url, db, config, address, options, connect))
    except (StoreError, PartitionError) as exc:
        fail(str(exc))


@app.command()
def report(
    db: DbsOpt,
    since: SinceOpt = None,
    until: UntilOpt = None,
    output: Annotated[
        Format, typer.Option("--output", "-o", help="Output format.", case_sensitive=False)
    ] = Format.table,
    lag_threshold: LagOpt = DEFAULT_LAG_THRESHOLD_S,
    stuck_threshold: StuckOpt = DEFAULT_STUCK_THRESHOLD_S,
    top: Annotated[
        int,
        typer.Option(
            "--top", min=0, help="Volumes listed under time Uncertain, near full and abnormal."
        ),
    ] = DEFAULT_TOP_VOLUMES,
    near_full: Annotated[
        float,
        typer.Option(
            "--near-full",
            min=0.0,
            max=1.0,
            help="Used share (of bytes or inodes) from which a volume is near full.",
        ),
    ] = DEFAULT_NEAR_FULL,
    at: Annotated[
        str | None, typer.Option("--at", help=f"Compute as of TIME (default: now). {TIME_HELP}")
    ] = None,
    now: Annotated[str | None, typer.Option("--now", hidden=True)] = None,  # old name of --at
) -> None:
    """The analytics report: operations, failures, Uncertain, nodes, volume health, pods.

    Reads only the Parquet files of the --since/--until window; several --db
    (the partitions of a fleet) are read together.
    """
    from volfsm.analytics.report import (
        ReportOptions,
        print_report,
        report_and_counters,
        report_document,
    )
    from volfsm.analytics.store import AnalyticsStore, StoreError
    from volfsm.render import print_json

    options = ReportOptions(
        since_us=time_option(since, "--since"),
        until_us=time_option(until, "--until"),
        lag_threshold_s=lag_threshold,
        stuck_threshold_s=stuck_threshold,
        top=top,
        near_full_threshold=near_full,
    )
    now_us = time_option(at if at is not None else now, "--at")
    try:
        with AnalyticsStore(db, read_only=True) as store:
            missing = sorted(set(range(store.partitions)) - store.partitions_read)
            rep, counters = report_and_counters(store, options, now_us=now_us)
    except StoreError as exc:
        fail(str(exc))
    if missing:
        typer.echo(
            f"volfsm: warning: partitions {missing} of {store.partitions} are not in the "
            "stores read",
            err=True,
        )
    if output is Format.json:
        print_json(report_document(rep, counters))
    else:
        print_report(rep, counters)


@app.command("export")
def export_cmd(
    db: DbsOpt,
    out_file: Annotated[
        Path | None, typer.Option("--out-file", help="The Parquet file to write.")
    ] = None,
    since: SinceOpt = None,
    out: Annotated[Path | None, typer.Option("--out", hidden=True)] = None,  # old --out-file
) -> None:
    """Write the flattened events to one Parquet file (times as UTC timestamps)."""
    from volfsm.analytics.export import ExportUnavailableError, export_parquet
    from volfsm.analytics.store import AnalyticsStore, StoreError

    out = out_file if out_file is not None else out
    if out is None:
        raise typer.BadParameter("give the file to write", param_hint="--out-file")

    since_us = time_option(since, "--since")
    try:
        with AnalyticsStore(db, read_only=True) as store:
            rows = export_parquet(store, out, since_us=since_us)
    except (StoreError, ExportUnavailableError) as exc:
        fail(str(exc))
    print(f"{rows} events written to {out}", file=sys.stderr)


@app.command()
def migrate(
    old: Annotated[
        Path, typer.Option("--from", help="A store of an earlier volfsm (one SQLite file).")
    ],
    new: Annotated[Path, typer.Option("--to", help="The new store directory (new or empty).")],
) -> None:
    """Convert an analytics store of an earlier volfsm; the old file is only read."""
    from volfsm.analytics.migrate import migrate as run_migrate
    from volfsm.analytics.store import StoreError

    try:
        result = run_migrate(old, new)
    except StoreError as exc:
        fail(str(exc))
    print(
        f"{result.events} events, {result.samples} operations, {result.spans} Uncertain spans, "
        f"{result.ready} ready pods of {result.nodes} nodes moved to {new}",
        file=sys.stderr,
    )


@app.command()
@with_credentials
def partition(
    nats_url: Annotated[str, typer.Option("--nats", help="NATS server URL(s), comma-separated.")],
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, help="How many ingest partitions.")
    ],
    stream: Annotated[
        str | None,
        typer.Option(
            "--stream", help=f"JetStream stream (default: the one holding {EVENT_SUBJECTS})."
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Also when the stream holds messages (they stay unpartitioned)."
        ),
    ] = False,
    *,
    credentials: NatsCredentials,
) -> None:
    """Split the event stream into ingest partitions by node (a stream subject transform).

    Needs a role that may update the stream (admin). Then run one
    `serve --partition P --partitions N` per partition.
    """
    from volfsm.analytics.partition import PartitionError, set_stream_partitions
    from volfsm.service.config import ConfigError

    try:
        connect = credentials.connect_options()
    except ConfigError as exc:
        fail(str(exc))

    async def run() -> str:
        import nats

        nc = await nats.connect(servers=nats_url.split(","), **connect)
        try:
            js = nc.jetstream()
            name = stream or await js.find_stream_name_by_subject(EVENT_SUBJECTS)
            config = await set_stream_partitions(js, name, partitions, force=force)
            transform = config.subject_transform
            return f"stream {name}: {transform.src if transform else ''} -> " + (
                transform.dest if transform else ""
            )
        finally:
            await nc.close()

    try:
        print(asyncio.run(run()), file=sys.stderr)
    except PartitionError as exc:
        fail(str(exc))
