"""`volfsm analytics ...`: the aggregator's commands (`volfsm.analytics.cli`) under the main CLI."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add `volfsm analytics serve|report|export|...`."""
    from volfsm.analytics import cli as analytics_cli

    app.add_typer(analytics_cli.app, name="analytics")
