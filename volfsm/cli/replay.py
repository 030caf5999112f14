"""`volfsm replay`: the story of a window of the log, one line per event, and the end state.

Events before `--from` are folded silently first, so the first line of the
window shows the right from-state. A progress bar (rich, on stderr) shows
on long replays when stdout and stderr are terminals; `--progress` /
`--no-progress` force it on or off.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Annotated, Any, TextIO

import msgspec
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from events.log import EventLog
from events.types import Envelope
from projections.story import (
    OperationFacts,
    StateSummary,
    Story,
    StoryLine,
    summary_lines,
)
from projections.textfmt import TIME_HELP, IsoClock, iso_time
from volfsm.cli.common import DataDirOpt, DbOpt, Output, OutputOpt, open_log, parse_time

PROGRESS_MIN_EVENTS = 20_000
"""Replays shorter than this never show a progress bar unless asked to."""
_PROGRESS_STEP = 4096
_FLUSH_LINES = 2048

_OP_FIELDS = tuple(f.name for f in fields(OperationFacts))


@dataclass(frozen=True, slots=True)
class Window:
    """Which events a replay tells: seq `after` < seq <= `last`, and what was asked."""

    after: int
    last: int
    from_us: int | None
    until_us: int | None

    @property
    def events(self) -> int:
        """How many events the window holds."""
        return max(0, self.last - self.after)


def resolve_window(log: EventLog, from_us: int | None, until_us: int | None) -> Window:
    """The seq range of events stamped at or after `from_us` and at or before `until_us`."""
    after = log.seq_at_time(from_us - 1) if from_us is not None else 0
    last = log.seq_at_time(until_us) if until_us is not None else log.last_seq()
    return Window(after=after, last=max(after, last), from_us=from_us, until_us=until_us)


# ------------------------------------------------------------------ output


class _Lines:
    """Buffers output text and writes it to the current `sys.stdout` (or `out`) in chunks."""

    def __init__(self, out: TextIO | None) -> None:
        self._out = out
        self.buf: list[str] = []

    def flush(self) -> None:
        if self.buf:
            target = self._out if self._out is not None else sys.stdout
            target.write("".join(self.buf))
            self.buf.clear()


def _text_emitter(story: Story, lines: _Lines) -> Callable[[Envelope], None]:
    tell = story.tell
    clock = IsoClock()
    buf = lines.buf
    add = buf.append
    flush = lines.flush

    def emit(env: Envelope) -> None:
        line = tell(env)
        add(f"{clock(line.ts)}  #{line.seq}  {line.subject}: {line.text}\n")
        if len(buf) >= _FLUSH_LINES:
            flush()

    return emit


def line_json(line: StoryLine) -> dict[str, Any]:
    """A story line as one flat JSON object: every field, operation facts inlined.

    Keys are the same on every line (null where they do not apply), plus ISO
    `time` and `retry_at`.
    """
    item: dict[str, Any] = {
        "seq": line.seq,
        "ts": line.ts,
        "time": iso_time(line.ts),
        "stream": line.stream,
        "type": line.type,
        "subject": line.subject,
        "text": line.text,
        "from_state": line.from_state,
        "to_state": line.to_state,
    }
    op = line.op
    for name in _OP_FIELDS:
        item[name] = getattr(op, name) if op is not None else None
    if op is None:
        item["calls"] = []
    item["retry_at"] = iso_time(op.retry_at_us) or None if op is not None else None
    return item


def _json_emitter(story: Story, lines: _Lines) -> Callable[[Envelope], None]:
    tell = story.tell
    encode = msgspec.json.Encoder().encode
    buf = lines.buf
    first = [True]

    def emit(env: Envelope) -> None:
        text = encode(line_json(tell(env))).decode()
        buf.append(("    " if first[0] else ",\n    ") + text)
        first[0] = False
        if len(buf) >= _FLUSH_LINES:
            lines.flush()

    return emit


def summary_json(summary: StateSummary) -> dict[str, Any]:
    """The end state as JSON (µs times plus ISO strings)."""
    doc: dict[str, Any] = msgspec.to_builtins(summary)
    doc["time"] = iso_time(summary.ts) or None
    for entry in doc["entries"]:
        entry["since"] = iso_time(entry["since_us"])
        entry["retry_at"] = iso_time(entry["retry_at_us"]) or None
    return doc


def window_header(node: str, window: Window) -> str:
    """The first line of a text replay."""
    start = iso_time(window.from_us) if window.from_us is not None else "the start"
    end = iso_time(window.until_us) if window.until_us is not None else "the end"
    seqs = f"seq {window.after + 1}-{window.last}" if window.events else "no events"
    return (
        f"replay of node {node or '?'} from {start} to {end}: {window.events} events ({seqs}); "
        f"{window.after} earlier events folded first"
    )


def window_json(node: str, window: Window) -> dict[str, Any]:
    """What the window is, for the JSON document."""
    return {
        "node": node,
        "from": iso_time(window.from_us) or None,
        "until": iso_time(window.until_us) or None,
        "first_seq": window.after + 1 if window.events else None,
        "last_seq": window.last if window.events else None,
        "events": window.events,
        "folded_before": window.after,
    }


# ---------------------------------------------------------------- progress


def progress_wanted(forced: bool | None, events: int) -> bool:
    """Whether to draw a progress bar: forced, or long and both outputs are terminals."""
    if forced is not None:
        return forced
    return events >= PROGRESS_MIN_EVENTS and sys.stdout.isatty() and sys.stderr.isatty()


@contextmanager
def progress_bar(
    enabled: bool, total: int, label: str = "replaying"
) -> Iterator[Callable[[Callable[[Envelope], None]], Callable[[Envelope], None]]]:
    """A wrapper for fold callbacks that advances a bar on stderr (identity when disabled)."""
    if not enabled:
        yield lambda apply: apply
        return
    console = Console(stderr=True)
    bar = Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        redirect_stdout=sys.stdout.isatty(),
        redirect_stderr=False,
    )
    task = bar.add_task("replay", total=total)

    def wrap(apply: Callable[[Envelope], None]) -> Callable[[Envelope], None]:
        count = [0]

        def counted(env: Envelope) -> None:
            apply(env)
            count[0] += 1
            if count[0] % _PROGRESS_STEP == 0:
                bar.update(task, advance=_PROGRESS_STEP)

        return counted

    with bar:
        yield wrap
        bar.update(task, completed=total)


# ------------------------------------------------------------------- replay


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic GC while folding: the fold makes many small objects and no cycles.

    Without this the collector walks the growing ASW again and again (a
    third of the replay time on 300,000 events). Restored on the way out.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_replay(
    log: EventLog,
    window: Window,
    output: Output = Output.table,
    *,
    progress: bool = False,
    out: TextIO | None = None,
) -> StateSummary:
    """Fold what precedes the window, tell the window, write the end state; the summary.

    This is exactly what `volfsm replay` runs (the benchmark calls it too).
    Output goes to `out`, or to `sys.stdout` as it is at each write.
    """
    story = Story()
    lines = _Lines(out)
    with _gc_paused(), progress_bar(progress, window.last) as counted:
        if window.after:
            log.replay(counted(story.absorb), 0, window.after)
        if output is Output.json:
            head = msgspec.json.encode(window_json(log.node, window)).decode()
            lines.buf.append('{\n  "window": ' + head + ',\n  "lines": [\n')
            emit = _json_emitter(story, lines)
        else:
            lines.buf.append(window_header(log.node, window) + "\n")
            emit = _text_emitter(story, lines)
        if window.events:
            log.replay(counted(emit), window.after, window.last)
    summary = story.summary()
    if output is Output.json:
        state = msgspec.json.format(msgspec.json.encode(summary_json(summary)), indent=2)
        lines.buf.append('\n  ],\n  "state": ' + state.decode().replace("\n", "\n  ") + "\n}\n")
    else:
        lines.buf.append("\n" + "\n".join(summary_lines(summary)) + "\n")
    lines.flush()
    return summary


def replay(
    since: Annotated[
        str | None,
        typer.Option("--since", help=f"Tell events at or after this time. {TIME_HELP}"),
    ] = None,
    from_: Annotated[str | None, typer.Option("--from", hidden=True)] = None,  # old --since
    until: Annotated[
        str | None, typer.Option("--until", help="Tell events at or before this time (same forms).")
    ] = None,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress",
            help="Progress bar on stderr (default: on long replays when stdout and stderr "
            "are terminals).",
            show_default=False,
        ),
    ] = None,
    output: OutputOpt = Output.table,
    data_dir: DataDirOpt = None,
    db: DbOpt = None,
) -> None:
    """Tell the story of the log (or a window of it), one line per event, then the end state.

    Each line says what happened and why: desired changes, operations started
    (with the reconciler's reason and the driver calls), errors with code and
    message and the backoff until when, transitions from -> to.
    """
    since = since if since is not None else from_
    from_us = parse_time(since, option="--since") if since is not None else None
    until_us = parse_time(until, option="--until") if until is not None else None
    if from_us is not None and until_us is not None and until_us < from_us:
        raise typer.BadParameter("--until is before --since", param_hint="--until")
    with open_log(data_dir, db) as log:
        window = resolve_window(log, from_us, until_us)
        run_replay(log, window, output, progress=progress_wanted(progress, window.last))


def register(app: typer.Typer) -> None:
    """Add `replay` to the CLI."""
    app.command("replay")(replay)
