"""Output helpers and TIME parsing."""

from __future__ import annotations

import io

import pytest
import typer

from volfsm.cli.common import parse_time
from volfsm.render import fmt_bytes, fmt_duration, fmt_ts, print_table

T = 1_714_532_400_123_456  # 2024-05-01T03:00:00.123456Z


def test_timestamps_are_iso_utc_with_milliseconds() -> None:
    assert fmt_ts(T) == "2024-05-01T03:00:00.123Z"
    assert fmt_ts(0) == "1970-01-01T00:00:00.000Z"
    assert fmt_ts(None) == ""


def test_durations_and_sizes() -> None:
    assert fmt_duration(450_000) == "0.450s"
    assert fmt_duration(123_500_000) == "2m03.500s"
    assert fmt_duration(3_723_000_000) == "1h02m03s"
    assert fmt_bytes(None) == ""
    assert fmt_bytes(512) == "512B"
    assert fmt_bytes(20 * 1024**3) == "20GiB"
    assert fmt_bytes(1536) == "1.5KiB"


def test_time_arguments() -> None:
    assert parse_time("2024-05-01T03:00:00.123456Z", option="--at") == T
    assert parse_time("2024-05-01T05:00:00.123456+02:00", option="--at") == T
    assert parse_time("2024-05-01T03:00:00.123456", option="--at") == T  # naive: UTC
    assert parse_time("now", option="--at", now_us=T) == T
    assert parse_time("-5m", option="--at", now_us=T) == T - 300_000_000
    assert parse_time("-1.5h", option="--at", now_us=T) == T - 5_400_000_000
    assert parse_time("-2d", option="--at", now_us=T) == T - 172_800_000_000
    with pytest.raises(typer.BadParameter, match="not a time"):
        parse_time("5 minutes ago", option="--at")


def test_plain_table_is_aligned_and_says_none_when_empty() -> None:
    out = io.StringIO()
    print_table("Things", ["A", "LONGER"], [["x", "1"], ["yyyy", "22"]], out=out)
    assert out.getvalue().splitlines() == ["Things", "A     LONGER", "x     1", "yyyy  22"]
    empty = io.StringIO()
    print_table("", ["A", "B"], [], out=empty)
    assert empty.getvalue().splitlines() == ["A  B", "(none)"]
