"""The command tree, loaded one command at a time, with plain help and one-line errors.

`volfsm --help` must start about as fast as a bare Python, so the root
group knows its commands only as `Entry` rows (name, module, help panel,
one-line help) and imports a command's module when that command runs or
its help is asked for. Help is click's plain text (rich's is several times
slower to import), grouped into panels: commands by `Entry.panel`, options
by their `rich_help_panel`. A value's metavar says what it is (TIME, POD,
SECONDS), never a type name. Every mistake on the command line is one line
on stderr, `volfsm: error: <command>: <what>`, exit code 2.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import typer
import typer.main
from typer import _click as click  # Typer vendors its own click
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from volfsm.cli.coerce import plain_param

EXIT_USAGE = 2
PROG = "volfsm"


@dataclass(frozen=True)
class Entry:
    """One top-level command: where it lives, its help panel, its one-line help."""

    name: str
    module: str
    panel: str
    help: str


# ----------------------------------------------------------------- metavars

_METAVAR_BY_NAME = {
    "since": "TIME",
    "until": "TIME",
    "at": "TIME",
    "end": "TIME",
    "now": "TIME",
    "from": "TIME",
    "to": "TIME",
    "pod": "POD",
    "volume": "VOLUME",
    "stream": "STREAM",
    "type": "TYPE",
    "kind": "KIND",
    "node": "NAME",
    "nats": "URL",
    "data-dir": "DIR",
    "root-dir": "DIR",
    "db": "FILE",
    "out-file": "FILE",
    "html": "FILE",
    "config": "FILE",
    "filename": "FILE",
    "uid": "UID",
    "http": "HOST:PORT",
    "log-level": "LEVEL",
    "nats-user": "USER",
    "nats-password": "PASSWORD",
    "nats-token": "TOKEN",
    "max-command-bytes": "BYTES",
    "nats-creds": "FILE",
    "nats-tls-ca": "FILE",
    "nats-tls-cert": "FILE",
    "nats-tls-key": "FILE",
}
_SECONDS_WORDS = (
    "timeout",
    "period",
    "grace",
    "threshold",
    "interval",
    "wait",
    "window",
    "backoff",
)


def _metavar(param: click.Parameter) -> str | None:
    """What the help shows for a value: its meaning, not its type (None: leave it)."""
    if not isinstance(param, TyperOption) or param.is_flag or param.count:
        return None
    kind = param.type_descriptor
    if kind.is_choice:
        return None
    name = (param.opts[0] if param.opts else param.name or "").lstrip("-")
    if name in _METAVAR_BY_NAME:
        return _METAVAR_BY_NAME[name]
    if kind.annotation is float:
        return "SECONDS" if any(w in name for w in _SECONDS_WORDS) else "NUMBER"
    if kind.annotation is int:
        return "N"
    return name.upper().replace("-", "_") or None


# -------------------------------------------------------------------- help


def _plain_help(option: Any) -> Any:
    """The `--help` option (made anew for each parse) with the plain coercion too."""
    if option is not None:
        plain_param(option)
    return option


class PanelCommand(TyperCommand):
    """A command whose help groups its options by panel, in plain text."""

    def get_help_option(self, ctx: click.Context) -> Any:
        """The help option (plain coercion)."""
        return _plain_help(super().get_help_option(ctx))

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Options grouped: 'Options' first, then each `rich_help_panel` in order."""
        _format_params(self.get_params(ctx), ctx, formatter)


class PanelGroup(TyperGroup):
    """A sub-command group (`delete`, `wait`, `explain`, `stream`, `analytics`)."""

    def get_help_option(self, ctx: click.Context) -> Any:
        """The help option (plain coercion)."""
        return _plain_help(super().get_help_option(ctx))

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Its options by panel, then its commands."""
        _format_params(self.get_params(ctx), ctx, formatter)
        self.format_commands(ctx, formatter)


def _format_params(
    params: Sequence[click.Parameter], ctx: click.Context, formatter: click.HelpFormatter
) -> None:
    panels: dict[str, list[tuple[str, str]]] = {}
    for param in params:
        if isinstance(param, TyperArgument):
            if param.help and not param.hidden:
                panels.setdefault("Arguments", []).append((param.metavar or "", param.help))
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        panel = getattr(param, "rich_help_panel", None) or "Options"
        panels.setdefault(panel, []).append(record)
    order = {"Arguments": 0, "Options": 1}
    for panel in sorted(panels, key=lambda p: order.get(p, 2)):
        with formatter.section(panel):
            formatter.write_dl(panels[panel])


def adapt(cmd: click.Command) -> click.Command:
    """Plain help with panels and meaningful metavars for `cmd` and everything under it."""
    if isinstance(cmd, TyperGroup):
        cmd.__class__ = PanelGroup
        for sub in cmd.commands.values():
            adapt(sub)
    elif isinstance(cmd, TyperCommand):
        cmd.__class__ = PanelCommand
    if hasattr(cmd, "rich_markup_mode"):
        cmd.rich_markup_mode = None
    for param in cmd.params:
        if param.metavar is None:
            param.metavar = _metavar(param)
        if isinstance(param, TyperArgument) and param.metavar is None and param.name:
            param.metavar = param.name.upper()
        plain_param(param)
    return cmd


# ------------------------------------------------------------------ errors


def usage_line(exc: click.ClickException) -> str:
    """A click error as one line: 'volfsm: error: get: Invalid value for WHAT: ...'."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    where = ""
    if ctx is not None:
        path = ctx.command_path.split(" ", 1)
        where = path[1] + ": " if len(path) > 1 else ""
    hint = ""
    if isinstance(exc, click.exceptions.UsageError) and ctx is not None:
        hint = f" (see '{ctx.command_path} --help')"
    return f"{PROG}: error: {where}{message}{hint}"


def fail_usage(message: str) -> NoReturn:
    """End the command with one line on stderr and exit code 2."""
    click.echo(f"{PROG}: error: {message}", err=True)
    raise typer.Exit(EXIT_USAGE)


# -------------------------------------------------------------------- root


class LazyGroup(TyperGroup):
    """The root group: commands from `entries`, imported when used."""

    entries: tuple[Entry, ...] = ()
    panels: tuple[str, ...] = ()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rich_markup_mode = None
        self.commands = _LoadedOnUse(self)
        for param in self.params:
            plain_param(param)

    def get_help_option(self, ctx: click.Context) -> Any:
        """The help option (plain coercion)."""
        return _plain_help(super().get_help_option(ctx))

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command name, in panel order."""
        return [e.name for e in self.entries]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command `cmd_name`, its module imported now (None if there is none)."""
        try:
            return self.commands[cmd_name]
        except KeyError:
            return None

    def load_entry(self, cmd_name: str) -> click.Command:
        """Import and adapt the command `cmd_name` (KeyError if there is no such entry)."""
        entry = next((e for e in self.entries if e.name == cmd_name), None)
        if entry is None:
            raise KeyError(cmd_name)
        return adapt(load(entry))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """One section per panel, with each command's one-line help (nothing imported)."""
        for panel in self.panels:
            rows = [(e.name, e.help) for e in self.entries if e.panel == panel]
            if rows:
                with formatter.section(panel):
                    formatter.write_dl(rows)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The root's own options, then the command panels."""
        _format_params(self.get_params(ctx), ctx, formatter)
        self.format_commands(ctx, formatter)

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run; a command-line mistake is one line on stderr and exit code 2."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        code = run_quietly(
            lambda: super(LazyGroup, self).main(
                args, prog_name or PROG, complete_var, standalone_mode=False, **extra
            )
        )
        sys.exit(code)


class _LoadedOnUse(dict[str, click.Command]):
    """The root's `commands`: a command is imported on its first lookup by name."""

    def __init__(self, group: LazyGroup) -> None:
        super().__init__()
        self.group = group

    def __missing__(self, name: str) -> click.Command:
        command = self.group.load_entry(name)
        self[name] = command
        return command


def run_quietly(call: Callable[[], Any]) -> int:
    """Run a non-standalone click main; its exit code, errors written as one line."""
    try:
        result = call()
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.format_message())
        return 0
    except click.ClickException as exc:
        click.echo(usage_line(exc), err=True)
        return exc.exit_code
    except typer.Abort:
        click.echo(f"{PROG}: aborted", err=True)
        return 1
    return result if isinstance(result, int) else 0


def load(entry: Entry) -> click.Command:
    """Import an entry's module and build its click command (`register(app)` of the module)."""
    module = importlib.import_module(entry.module)
    app = typer.Typer(add_completion=False, rich_markup_mode=None)
    module.register(app)
    group = typer.main.get_group(app)
    ctx = click.Context(group)
    command = group.get_command(ctx, entry.name)
    if command is None:
        raise LookupError(f"{entry.module}.register adds no command {entry.name!r}")
    return command


def walk(group: TyperGroup, ctx: click.Context) -> Iterator[tuple[str, ...]]:
    """Every command path under `group` (loading each), as argument prefixes."""
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None:
            continue
        yield (name,)
        if isinstance(cmd, TyperGroup):
            sub = click.Context(cmd, parent=ctx, info_name=name)
            yield from ((name, *rest) for rest in walk(cmd, sub))
