"""Every command's --help renders: rich markup in an option's help text must not break it."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from volfsm.cli import app


def command_paths() -> list[tuple[str, ...]]:
    """Every command and sub-command of the main CLI, as argument prefixes."""
    root = typer.main.get_command(app)
    paths: list[tuple[str, ...]] = []

    def walk(cmd: object, prefix: tuple[str, ...]) -> None:
        paths.append(prefix)
        # Typer vendors its own click: a group is whatever has sub-commands.
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, (*prefix, name))

    walk(root, ())
    return paths


PATHS = command_paths()


def test_the_cli_has_the_commands_the_readme_documents() -> None:
    names = {p[0] for p in PATHS if p}
    assert {"serve", "apply", "replay", "state", "diff", "explain", "timeline"} <= names
    assert ("analytics", "report") in PATHS


@pytest.mark.parametrize("path", PATHS, ids=[" ".join(p) or "volfsm" for p in PATHS])
def test_help_renders(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    assert "Usage:" in result.output


def test_serve_help_lists_the_fault_point_option() -> None:
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert "--fault-point" in result.output and "--desired-grace" in result.output
