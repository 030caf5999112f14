"""The `volfsm` command line (Typer on click), loaded one command at a time.

`ENTRIES` lists every top-level command: the module that has its
`register(app)`, its help panel and its one-line help. Only the command
that runs is imported (`volfsm.cli.lazy`), so `volfsm --help` and a client
command start within a small factor of a bare Python (bench/cli.py).
Adding a command means adding a module with `register(app)` and one entry.

`volfsm analytics ...` is the Typer app of `volfsm.analytics.cli`, added as
a sub-command group (`volfsm.cli.analytics`); that package never imports
`volfsm.cli`, so `python -m volfsm.analytics` runs the same commands alone.
"""

from __future__ import annotations

import typer

from volfsm.cli.lazy import Entry, LazyGroup

NODE_PANEL = "Node service (talk to a running volfsm serve)"
LOG_PANEL = "A node's log (offline, read-only: --data-dir DIR or --db FILE)"
OTHER_PANEL = "Cluster analytics, the bus and tools"
PANELS = (NODE_PANEL, LOG_PANEL, OTHER_PANEL)

ENTRIES: tuple[Entry, ...] = (
    Entry("serve", "volfsm.cli.serve", NODE_PANEL, "Run the node service."),
    Entry("apply", "volfsm.cli.ops", NODE_PANEL, "Apply objects to the node's desired state."),
    Entry("get", "volfsm.cli.ops", NODE_PANEL, "List the node's pods or volumes, live."),
    Entry("delete", "volfsm.cli.ops", NODE_PANEL, "Remove a pod from the desired state."),
    Entry("wait", "volfsm.cli.ops", NODE_PANEL, "Wait until a pod is mounted or unmounted."),
    Entry("events", "volfsm.cli.events", NODE_PANEL, "Follow the node's events as they happen."),
    Entry("state", "volfsm.cli.state", LOG_PANEL, "The actual state of world (now or --at)."),
    Entry("history", "volfsm.cli.history", LOG_PANEL, "Events in log order, filtered."),
    Entry("timeline", "volfsm.cli.timeline", LOG_PANEL, "Time in each state, operations."),
    Entry("replay", "volfsm.cli.replay", LOG_PANEL, "The story of the log, one line per event."),
    Entry("diff", "volfsm.cli.diff", LOG_PANEL, "What changed between two moments."),
    Entry("explain", "volfsm.cli.explain", LOG_PANEL, "Why a pod's volumes are (not) mounted."),
    Entry("validate", "volfsm.cli.validate", LOG_PANEL, "Check the log against the state tables."),
    Entry("export", "volfsm.cli.export", LOG_PANEL, "The log as NDJSON or Parquet."),
    Entry("demo", "volfsm.cli.demo", LOG_PANEL, "Write a sample node history to try these on."),
    Entry("analytics", "volfsm.cli.analytics", OTHER_PANEL, "Cluster-wide storage analytics."),
    Entry("stream", "volfsm.cli.stream", OTHER_PANEL, "Create or check the JetStream stream."),
    Entry("diagram", "volfsm.cli.diagram", OTHER_PANEL, "The state machines as mermaid."),
)


class VolfsmGroup(LazyGroup):
    """The `volfsm` group."""

    entries = ENTRIES
    panels = PANELS


app = typer.Typer(
    name="volfsm",
    cls=VolfsmGroup,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


@app.callback()
def volfsm() -> None:
    """volfsm: a node volume manager as an event-sourced state machine.

    Exit codes: 0 done; 1 the service refused or could not be reached, a wait
    timed out, or validate found a violation; 2 a mistake on the command line,
    an unknown pod, volume or stream, or an unusable log file (one line on stderr).
    """


def main() -> None:
    """Console-script entry point."""
    app()
