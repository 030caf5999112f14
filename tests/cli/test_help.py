"""Every command's --help renders, grouped, without type names; the root help imports nothing."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import typer
from typer import _click as click
from typer.testing import CliRunner

from volfsm.cli import ENTRIES, LOG_PANEL, NODE_PANEL, app
from volfsm.cli.lazy import walk


def command_paths() -> list[tuple[str, ...]]:
    """Every command and sub-command of the main CLI, as argument prefixes."""
    root = typer.main.get_command(app)
    assert isinstance(root, typer.core.TyperGroup)
    return [(), *walk(root, click.Context(root, info_name="volfsm"))]


PATHS = command_paths()
TYPE_NAMES = re.compile(
    r"(--[a-z-]+|[A-Z]) (TEXT|FLOAT|INTEGER|BOOLEAN|PATH)\b|<class |Output\.|<(str|int|float)>"
)


def test_the_cli_has_the_commands_the_readme_documents() -> None:
    names = {p[0] for p in PATHS if p}
    assert {"serve", "apply", "replay", "state", "diff", "explain", "timeline", "events"} <= names
    assert ("analytics", "report") in PATHS


@pytest.mark.parametrize("path", PATHS, ids=[" ".join(p) or "volfsm" for p in PATHS])
def test_help_renders_without_type_names(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    assert "Usage:" in result.output
    assert not TYPE_NAMES.search(result.output), result.output


def test_root_help_groups_node_service_apart_from_offline_log_commands() -> None:
    text = CliRunner().invoke(app, ["--help"]).output
    node, log = text.index(NODE_PANEL + ":"), text.index(LOG_PANEL + ":")
    assert node < text.index("  get ") < log < text.index("  history ")
    assert text.index("  serve ") < log and text.index("  replay ") > log


def test_each_entry_help_is_its_commands_first_line() -> None:
    root = typer.main.get_command(app)
    ctx = click.Context(root, info_name="volfsm")
    for entry in ENTRIES:
        cmd = root.get_command(ctx, entry.name)
        assert cmd is not None, entry.name
        assert entry.help, entry.name


def test_root_help_imports_no_command() -> None:
    """`volfsm --help` loads no command module (that is what makes it fast)."""
    code = (
        "import sys; from volfsm.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "loaded = [m for m in sys.modules if m.startswith(('volfsm.cli.', 'events.log', 'nats',"
        " 'pydantic', 'rich', 'sqlite_utils')) and m not in ('volfsm.cli.lazy',"
        " 'volfsm.cli.coerce')]\n"
        "print(loaded, file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.stderr.strip() == "[]"


def test_client_commands_load_no_nats_client_for_a_plain_url() -> None:
    """`volfsm get` on a plain nats:// URL uses the socket client: no nats-py, no asyncio."""
    code = (
        "import sys; sys.argv = ['volfsm', 'get', 'pods', '--nats', 'nats://127.0.0.1:1']\n"
        "from volfsm.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print([m for m in ('nats', 'asyncio', 'pydantic', 'rich') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]"
    assert "cannot reach NATS at nats://127.0.0.1:1" in done.stderr


def test_serve_help_lists_the_fault_point_option() -> None:
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert "--fault-point" in result.output and "--desired-grace" in result.output
    assert "--volume-stats-agg-period DURATION" in result.output
