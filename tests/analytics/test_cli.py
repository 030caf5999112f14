"""`volfsm analytics report|export|serve` through the Typer app."""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.analytics.feed import feed
from tests.analytics.scenario import E, node1, node2
from tests.analytics.sim import interleave
from volfsm.analytics.cli import app
from volfsm.analytics.store import AnalyticsStore

NOW = "2023-11-14T22:15:00Z"  # T0 + 100 s
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "a.db"
    with AnalyticsStore(path) as store:
        feed(store, interleave([node1(), node2()]))
    return path


def test_report_json(db: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "report",
            "--db",
            str(db),
            "-o",
            "json",
            "--now",
            NOW,
            "--lag-threshold",
            "55",
            "--stuck-threshold",
            "30",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["events"] == 51 and doc["ingest"]["applied"] == 51
    mount = [f for f in doc["latency"] if (f["driver"], f["operation"]) == (E, "volume_mount")]
    assert mount[0]["p50_s"] == 3.0 and mount[0]["p90_s"] == 10.0
    assert [n["lagging"] for n in doc["nodes"]] == [True, False]
    assert doc["uncertain_now"][0]["stuck"] is True


def test_report_since(db: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["report", "--db", str(db), "-o", "json", "--now", NOW, "--since", "2023-11-14T22:13:40Z"],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["events"] == 21


def test_report_tables(db: Path) -> None:
    result = CliRunner().invoke(app, ["report", "--db", str(db), "--now", NOW])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "events: 51, nodes: 2" in out
    for heading in (
        "Operations",
        "Failures",
        "Uncertain now",
        "Nodes",
        "Gaps",
        "Pod mount-to-ready: 4 pods ready, 0 pending",
    ):
        assert heading in out
    [row] = [
        line
        for line in out.splitlines()
        if "volume_mount" in line and E in line and "publish" in line
    ]
    assert row.split()[3:] == ["6", "2", "3.000", "10.000", "10.000"]


def test_report_on_a_missing_store_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", "--db", str(tmp_path / "none.db")])
    assert result.exit_code == 2
    assert "no analytics store" in result.stderr


def test_export_parquet_round_trips(db: Path, tmp_path: Path) -> None:
    pq: Any = importlib.import_module("pyarrow.parquet")  # optional for users, needed here

    out = tmp_path / "events.parquet"
    result = CliRunner().invoke(app, ["export", "--db", str(db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    assert table.num_rows == 51
    rows = table.to_pylist()
    first = next(r for r in rows if (r["node"], r["seq"]) == ("n1", 2))
    assert (first["type"], first["driver"], first["operation"]) == (
        "OperationStarted",
        E,
        "volume_mount",
    )
    failed = [r for r in rows if r["type"] == "OperationFailed"]
    assert {(r["code"], r["final"]) for r in failed} == {
        ("DeadlineExceeded", False),
        ("Internal", False),
        ("InvalidArgument", True),
    }
    assert str(table.schema.field("ts_us").type) == "timestamp[us, tz=UTC]"


def test_serve_refuses_from_start_with_since(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "serve",
            "--nats",
            "nats://127.0.0.1:1",
            "--db",
            str(tmp_path / "a.db"),
            "--from-start",
            "--since",
            "-1h",
        ],
    )
    assert result.exit_code == 2
    assert "exclude each other" in result.stderr


def test_time_arguments() -> None:
    from projections.textfmt import parse_time

    now = 1_700_000_000_000_000
    assert parse_time("now", now) == now
    assert parse_time("-5m", now) == now - 300_000_000
    assert parse_time("-1.5h", now) == now - 5_400_000_000
    assert parse_time("2023-11-14T22:13:20Z") == now
    assert parse_time("2023-11-14T23:13:20.5+01:00") == now + 500_000
    assert parse_time("2023-11-14T22:13:20") == now  # no offset: UTC
    with pytest.raises(ValueError, match="not a time"):
        parse_time("yesterday")


def test_main_cli_runs_the_analytics_commands(db: Path) -> None:
    from volfsm.cli import app as main_app

    args = ["report", "--db", str(db), "-o", "json", "--now", NOW]
    alone = CliRunner().invoke(app, args)
    through_main = CliRunner().invoke(main_app, ["analytics", *args])
    assert through_main.exit_code == 0, through_main.output
    assert json.loads(through_main.stdout) == json.loads(alone.stdout)
    assert json.loads(through_main.stdout)["events"] == 51
    usage = CliRunner().invoke(main_app, ["analytics", "serve", "--db", str(db)])
    assert usage.exit_code == 2 and "--nats" in usage.stderr


@pytest.mark.parametrize("module", ["volfsm.cli", "volfsm.analytics"])
def test_both_entry_points_list_the_analytics_commands(module: str) -> None:
    prefix = ["analytics"] if module == "volfsm.cli" else []
    done = subprocess.run(
        [sys.executable, "-m", module, *prefix, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for command in ("serve", "report", "export"):
        assert f" {command} " in done.stdout


def test_analytics_does_not_import_the_main_cli() -> None:
    package = ROOT / "volfsm" / "analytics"
    imports = {
        name
        for path in package.rglob("*.py")
        for name in imported_modules(path)
        if name == "volfsm.cli" or name.startswith("volfsm.cli.")
    }
    assert imports == set()


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports (absolute imports)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names
