"""`volfsm serve`: run the node service (options also as VOLFSM_* env and in a TOML file)."""

from __future__ import annotations

import asyncio
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from loguru import logger

from volfsm import faultpoints
from volfsm.cli.common import fail
from volfsm.service.config import CONFIG_ENV, ConfigError, load_config, resolve
from volfsm.service.logging import configure_logging

PANEL_NATS = "NATS"
PANEL_ENGINE = "Engine"


class LogFormat(StrEnum):
    """How the service writes its log lines."""

    auto = "auto"
    json = "json"
    text = "text"


def _opt(help_text: str, panel: str | None = None, metavar: str | None = None) -> Any:
    """An option with no default shown: unset options fall through to env, file, default."""
    return typer.Option(help=help_text, rich_help_panel=panel, metavar=metavar, show_default=False)


def serve(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar=CONFIG_ENV,
            help="TOML file with any of these options (keys like csi_timeout). "
            "Precedence: command line > VOLFSM_<NAME> env > file > defaults.",
            show_default=False,
        ),
    ] = None,
    node: Annotated[
        str | None, _opt("Node name. Default: the data dir's, else the host name.")
    ] = None,
    data_dir: Annotated[
        str | None, _opt("Data dir: the event log, embedded NATS store. Default /var/lib/volfsm.")
    ] = None,
    root_dir: Annotated[
        str | None, _opt("Kubelet-style root dir (pods/, plugins/). Default <data-dir>/root.")
    ] = None,
    nats: Annotated[
        str | None,
        _opt("NATS URL. Default: start an embedded JetStream server on loopback.", PANEL_NATS),
    ] = None,
    nats_user: Annotated[str | None, _opt("NATS user (with --nats-password).", PANEL_NATS)] = None,
    nats_password: Annotated[str | None, _opt("NATS password.", PANEL_NATS)] = None,
    nats_token: Annotated[str | None, _opt("NATS token.", PANEL_NATS)] = None,
    nats_creds: Annotated[str | None, _opt("NATS .creds file.", PANEL_NATS, "FILE")] = None,
    nats_tls_ca: Annotated[str | None, _opt("CA bundle for NATS TLS.", PANEL_NATS, "FILE")] = None,
    nats_tls_cert: Annotated[
        str | None, _opt("Client certificate for NATS TLS.", PANEL_NATS, "FILE")
    ] = None,
    nats_tls_key: Annotated[
        str | None, _opt("Client key for NATS TLS.", PANEL_NATS, "FILE")
    ] = None,
    stream: Annotated[
        str | None, _opt("JetStream stream for the events. Default VOLFSM.", PANEL_NATS)
    ] = None,
    stream_replicas: Annotated[
        int | None, _opt("Replicas of the stream. Default 1.", PANEL_NATS)
    ] = None,
    duplicate_window: Annotated[
        float | None, _opt("Stream duplicate window, seconds. Default 120.", PANEL_NATS)
    ] = None,
    stream_setup: Annotated[
        str | None,
        _opt(
            "create: create the stream if missing and update its settings (needs "
            "stream-management rights); check: the node role, only check it (`volfsm stream "
            "create` makes it). Default create; with --nats only.",
            PANEL_NATS,
            "create|check",
        ),
    ] = None,
    max_command_bytes: Annotated[
        int | None, _opt("Largest command accepted, bytes. Default 4 MiB.", PANEL_NATS)
    ] = None,
    csi: Annotated[
        list[str] | None,
        _opt("A CSI driver as NAME=unix:///PATH.sock (repeat for more).", PANEL_ENGINE),
    ] = None,
    csi_timeout: Annotated[
        float | None, _opt("Seconds each CSI call may take. Default 120.", PANEL_ENGINE)
    ] = None,
    backoff_initial: Annotated[
        float | None, _opt("Backoff after a first failure, seconds. Default 0.5.", PANEL_ENGINE)
    ] = None,
    backoff_max: Annotated[
        float | None, _opt("Backoff cap, seconds. Default 122.", PANEL_ENGINE)
    ] = None,
    reconcile_period: Annotated[
        float | None, _opt("Seconds between reconcile passes. Default 0.1.", PANEL_ENGINE)
    ] = None,
    drain_grace: Annotated[
        float | None,
        _opt("On SIGTERM: seconds for running operations and the flush. Default 10.", PANEL_ENGINE),
    ] = None,
    desired_grace: Annotated[
        float | None,
        _opt(
            "Seconds after start before unmounts may start unless told earlier with "
            "`volfsm apply --complete`; only with an intact log (after a lost log only "
            "`apply --complete` lets them start). Default 30; 0: at once.",
            PANEL_ENGINE,
        ),
    ] = None,
    http: Annotated[
        str | None, _opt("HOST:PORT for /metrics, /healthz, /readyz. Default: off.")
    ] = None,
    log_level: Annotated[str | None, _opt("TRACE..CRITICAL. Default INFO.")] = None,
    restore_from_stream: Annotated[
        bool | None,
        typer.Option(
            "--restore-from-stream",
            help="The log was lost or is an older backup: first copy this node's events it "
            "lacks back from the JetStream stream.",
            rich_help_panel=PANEL_ENGINE,
            show_default=False,
        ),
    ] = None,
    adopt_root_dir: Annotated[
        bool | None,
        typer.Option(
            "--adopt-root-dir",
            help="Claim a root dir that has no volfsm mark of this node (its pods unknown to "
            "the log): handled as after a lost log, nothing in it is unmounted or removed until "
            "`volfsm apply --complete`. Never for a root dir a kubelet uses.",
            rich_help_panel=PANEL_ENGINE,
            show_default=False,
        ),
    ] = None,
    fault_point: Annotated[
        str | None,
        _opt(
            "Crash testing: SIGKILL this process at a fault point, e.g. driver.after/set_up, "
            "append.after/OperationSucceeded@2, driver.during+0.5 (see the README). Default: off.",
            PANEL_ENGINE,
        ),
    ] = None,
    log_format: Annotated[
        LogFormat,
        typer.Option(help="json: one JSON object per line; text; auto: text on a terminal."),
    ] = LogFormat.auto,
) -> None:
    """Run the node service: take commands over NATS, mount volumes, publish every event.

    Every option is also an environment variable VOLFSM_<NAME> (VOLFSM_CSI_TIMEOUT=5,
    VOLFSM_CSI=a=unix:///a.sock,b=unix:///b.sock) and a key in the --config TOML file.
    SIGTERM or SIGINT drains and exits 0.
    """
    cli = {
        "node": node,
        "data_dir": data_dir,
        "root_dir": root_dir,
        "nats": nats,
        "nats_user": nats_user,
        "nats_password": nats_password,
        "nats_token": nats_token,
        "nats_creds": nats_creds,
        "nats_tls_ca": nats_tls_ca,
        "nats_tls_cert": nats_tls_cert,
        "nats_tls_key": nats_tls_key,
        "stream": stream,
        "stream_replicas": stream_replicas,
        "duplicate_window": duplicate_window,
        "stream_setup": stream_setup,
        "max_command_bytes": max_command_bytes,
        "csi": csi,
        "csi_timeout": csi_timeout,
        "backoff_initial": backoff_initial,
        "backoff_max": backoff_max,
        "reconcile_period": reconcile_period,
        "drain_grace": drain_grace,
        "desired_grace": desired_grace,
        "http": http,
        "log_level": log_level,
        "fault_point": fault_point,
        "restore_from_stream": restore_from_stream,
        "adopt_root_dir": adopt_root_dir,
    }
    try:
        settings = resolve(load_config(cli, config_file=config))
    except ConfigError as exc:
        fail(str(exc))
    json_lines = None if log_format is LogFormat.auto else log_format is LogFormat.json
    configure_logging(settings.log_level, node=settings.node, json_lines=json_lines)
    faultpoints.configure(settings.fault_point)
    if settings.fault_point:
        armed = settings.fault_point
        logger.warning("fault point armed: this process SIGKILLs itself at {}", armed)
    if os.geteuid() != 0:
        logger.warning("not running as root: mounts (tmpfs emptyDir, CSI) will fail")
    from volfsm.service.serve import serve as run_service  # the engine, gRPC: only to serve

    code = asyncio.run(run_service(settings))
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add `serve` to the CLI."""
    app.command("serve")(serve)
