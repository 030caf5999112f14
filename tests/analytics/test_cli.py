"""`volfsm analytics report|export|serve` through the Typer app."""

from __future__ import annotations

import importlib
import json
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
    from volfsm.analytics.timearg import parse_time

    now = 1_700_000_000_000_000
    assert parse_time("now", now) == now
    assert parse_time("-5m", now) == now - 300_000_000
    assert parse_time("-1.5h", now) == now - 5_400_000_000
    assert parse_time("2023-11-14T22:13:20Z") == now
    assert parse_time("2023-11-14T23:13:20.5+01:00") == now + 500_000
    assert parse_time("2023-11-14T22:13:20") == now  # no offset: UTC
    with pytest.raises(ValueError, match="not a time"):
        parse_time("yesterday")
