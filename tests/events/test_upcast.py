"""The OperationFailed v1 -> v2 upcaster: a hand-written golden file and a real log row."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest

from events.codec import decode_body, envelope_from_json, envelope_to_json
from events.log import EventLog
from events.types import DeviceAttached, Envelope, OperationFailed, OperationStarted
from events.upcast import OperationFailedV1
from projections.asw import Asw, fold
from tests.events.helpers import T0, FakeClock, started

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden_v1_events.ndjson"


def _failed(
    op_id: str, operation: str, code: str, message: str, final: bool, backoff_s: float
) -> OperationFailed:
    return OperationFailed(
        op_id=op_id,
        operation=operation,
        code=code,
        message=message,
        final=final,
        backoff_s=backoff_s,
    )


# (seq, stream, version, ts, body): what each golden line must decode to.
EXPECTED = [
    (
        1,
        "device/pvc-1",
        1,
        1700000000000000,
        _failed(
            "op-1", "mount_device", "DeadlineExceeded", "context deadline exceeded", False, 0.5
        ),
    ),
    (
        2,
        "device/pvc-1",
        2,
        1700000001000000,
        _failed("op-2", "mount_device", "Internal", "mount failed: exit status 32", True, 0.0),
    ),
    (
        3,
        "podvol/uid-7/data",
        1,
        1700000002000000,
        _failed("op-3", "setup", "Unknown", "device is busy", False, 1.5),
    ),
    (
        4,
        "podvol/uid-7/data",
        2,
        1700000003000000,
        _failed(
            "op-4",
            "setup",
            "Unknown",
            "rpc error: code = Unavailable desc = connection refused",
            False,
            0.25,
        ),
    ),
    (
        5,
        "device/pvc-2",
        1,
        1700000004000000,
        _failed("op-5", "attach", "NotFound", "volume pvc-2 not found", True, 0.0),
    ),
    (
        6,
        "device/pvc-2",
        2,
        1700000005000000,
        _failed("op-6", "attach", "ResourceExhausted", "too many mounts", False, 120.0),
    ),
    (
        7,
        "device/pvc-2",
        3,
        1700000006000000,
        _failed("op-7", "unmount_device", "Unknown", ": no code before the colon", True, 0.01),
    ),
    (
        8,
        "device/pvc-2",
        4,
        1700000007000000,
        _failed("op-8", "unmount_device", "Unknown", "Aborted:", False, 0.001),
    ),
    (
        9,
        "device/pvc-3",
        1,
        1700000008000000,
        OperationFailed(
            op_id="op-9",
            operation="unmount",
            code="Aborted",
            message="operation pending",
            final=False,
            backoff_s=2.5,
            duration_s=0.25,
        ),
    ),
    (
        10,
        "device/pvc-3",
        2,
        1700000009000000,
        DeviceAttached(
            volume_id="pvc-3", plugin="kubernetes.io/csi", attachable=True, device_path="/dev/vdc"
        ),
    ),
    (
        11,
        "podvol/uid-7/data",
        3,
        1700000010000000,
        OperationStarted(op_id="op-11", operation="setup", volume_id="pvc-1", pod_uid="uid-7"),
    ),
]


def _golden_lines() -> list[bytes]:
    return [ln for ln in GOLDEN.read_bytes().splitlines() if ln.strip()]


def test_golden_file_decodes_to_current_types() -> None:
    envs = [envelope_from_json(line) for line in _golden_lines()]
    assert len(envs) == len(EXPECTED)
    for env, (seq, stream, version, ts, body) in zip(envs, EXPECTED, strict=True):
        assert (env.seq, env.stream, env.version, env.ts, env.node) == (
            seq,
            stream,
            version,
            ts,
            "node-1",
        )
        assert env.body == body
        assert type(env.body) is type(body)
        assert env.type == type(body).__name__
        assert env.schema == type(body).SCHEMA  # upcast envelopes carry the current schema


def test_golden_v1_lines_really_are_v1() -> None:
    """The file must keep exercising the upcaster: 8 lines of schema 1 OperationFailed."""
    raw = [msgspec.json.decode(line) for line in _golden_lines()]
    v1 = [r for r in raw if r["type"] == "OperationFailed" and r["schema"] == 1]
    assert len(v1) == 8
    assert all("error" in r["body"] and "code" not in r["body"] for r in v1)


def test_upcast_envelopes_re_encode_as_current_schema() -> None:
    env = envelope_from_json(_golden_lines()[0])
    again = msgspec.json.decode(envelope_to_json(env))
    assert again["schema"] == 2
    assert again["body"]["code"] == "DeadlineExceeded"
    assert "error" not in again["body"]
    assert envelope_from_json(envelope_to_json(env)) == env


@pytest.mark.parametrize("tagged", [True, False], ids=["tagged-body", "bare-v1-struct"])
def test_msgpack_v1_body_decodes_to_current(tagged: bool) -> None:
    old = OperationFailedV1(
        op_id="o", operation="attach", error="Unavailable: try later", retriable=True
    )
    data = msgspec.msgpack.encode(
        {"type": "OperationFailed", **msgspec.structs.asdict(old)} if tagged else old
    )
    assert decode_body("OperationFailed", 1, data) == _failed(
        "o", "attach", "Unavailable", "try later", False, 0.0
    )


def test_v1_row_in_a_real_log_reads_back_as_current_type(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    stream = "device/pvc-1"
    with EventLog(path, node="node-1", clock=FakeClock()) as log:
        log.append(stream, 0, [started("op-1", "pvc-1")])
    v1_body = msgspec.msgpack.encode(
        OperationFailedV1(
            op_id="op-1",
            operation="mount_device",
            error="DeadlineExceeded: context deadline exceeded",
            retriable=True,
            retry_after_ms=500,
        )
    )
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO events (seq, stream, version, type, schema, ts, node, body) "
        "VALUES (2, ?, 2, 'OperationFailed', 1, ?, 'node-1', ?)",
        (stream, T0 + 1, v1_body),
    )
    conn.commit()
    conn.close()

    want = _failed(
        "op-1", "mount_device", "DeadlineExceeded", "context deadline exceeded", False, 0.5
    )
    with EventLog(path, clock=FakeClock(T0 + 2)) as log:
        envs = list(log.read_after(0))
        assert [e.type for e in envs] == ["OperationStarted", "OperationFailed"]
        upcast = envs[1]
        assert upcast.body == want
        assert (upcast.seq, upcast.version, upcast.schema) == (2, 2, 2)
        assert log.read_stream(stream)[1] == upcast
        assert list(log.read_time_range(T0 + 1, T0 + 2)) == [upcast]
        replayed: list[Envelope] = []
        log.replay(replayed.append)
        assert replayed == envs
        with log.scan_rows() as rows:  # the engine start's fold decodes these itself
            assert [r[:6] for r in rows] == [
                (e.seq, e.stream, e.version, e.type, 1, e.ts) for e in envs
            ]
        folded = Asw()
        with log.scan_fold() as rows:
            assert folded.fold_rows(rows) == (2, 2)  # the v1 row upcast on the way
        assert folded == fold(envs)
        assert folded.devices["pvc-1"].last_error is not None
        assert [r[4] for r in log.rows_after(0)] == [1, 1]  # stored as written: schema 1
        # The log goes on after the old row.
        assert log.append(stream, 2, [started("op-2", "pvc-1")])[0].seq == 3
