"""`volfsm serve`: run the node service (options also as VOLFSM_* env and in a TOML file)."""

from __future__ import annotations

import asyncio
import inspect
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, get_args

import typer
from loguru import logger

from volfsm import faultpoints
from volfsm.cli.common import fail
from volfsm.service.config import CONFIG_ENV, FIELDS, ConfigError, load_config, resolve
from volfsm.service.logging import configure_logging


class LogFormat(StrEnum):
    """How the service writes its log lines."""

    auto = "auto"
    json = "json"
    text = "text"


def _parameter(name: str, declared: Any) -> inspect.Parameter:
    """The Typer parameter of one `ServeConfig` option (None = not given: env, file, default)."""
    base, meta = get_args(declared)[0], get_args(declared)[1]
    extra = meta.extra or {}
    kind: Any = bool if base is bool else int if base is int else float if base is float else None
    if base == list[str]:
        kind = list[str]
    elif kind is None:
        kind = str
    decls = [f"--{name.replace('_', '-')}"] if base is bool else []
    opt = typer.Option(
        *decls,
        help=meta.description,
        rich_help_panel=extra.get("panel"),
        metavar=extra.get("metavar"),
        show_default=False,
    )
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[kind | None, opt],
    )


def serve(
    config: Path | None = None,
    log_format: LogFormat = LogFormat.auto,
    **options: Any,
) -> None:
    """Run the node service: take commands over NATS, mount volumes, publish every event.

    Every option is also an environment variable VOLFSM_<NAME> (VOLFSM_CSI_TIMEOUT=5,
    VOLFSM_CSI=a=unix:///a.sock,b=unix:///b.sock) and a key in the --config TOML file.
    SIGTERM or SIGINT drains and exits 0.
    """
    try:
        settings = resolve(load_config(options, config_file=config))
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


_OWN = [
    inspect.Parameter(
        "config",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            Path | None,
            typer.Option(
                "--config",
                envvar=CONFIG_ENV,
                help="TOML file with any of these options (keys like csi_timeout). "
                "Precedence: command line > VOLFSM_<NAME> env > file > defaults.",
                show_default=False,
            ),
        ],
    ),
    *(_parameter(name, declared) for name, declared in FIELDS.items()),
    inspect.Parameter(
        "log_format",
        inspect.Parameter.KEYWORD_ONLY,
        default=LogFormat.auto,
        annotation=Annotated[
            LogFormat,
            typer.Option(help="json: one JSON object per line; text; auto: text on a terminal."),
        ],
    ),
]
serve.__signature__ = inspect.Signature(_OWN, return_annotation=None)  # type: ignore[attr-defined]
"""Typer reads the options from here: one per `ServeConfig` field, declared there once."""


def register(app: typer.Typer) -> None:
    """Add `serve` to the CLI."""
    app.command("serve")(serve)
