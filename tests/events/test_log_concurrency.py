"""Many threads and asyncio tasks appending to the same stream with expected versions.

Each appender reads the version it believes is current and tries; on a
conflict it re-reads and tries again. Exactly one appender must win each
version, and the log must stay gap-free and contiguous.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path

from events.errors import ConflictError
from events.log import EventLog
from events.types import OperationStarted
from tests.events.helpers import assert_valid_log

STREAM = "device/contended"


def _body(who: str, n: int) -> OperationStarted:
    return OperationStarted(op_id=f"{who}#{n}", operation="mount_device", volume_id="contended")


def _thread_appender(
    log: EventLog, who: str, wins: int, won: list[tuple[int, str]], lost: Counter[str]
) -> None:
    done = 0
    while done < wins:
        version = log.stream_version(STREAM)
        try:
            envs = log.append(STREAM, version, [_body(who, done)])
        except ConflictError as err:
            assert err.expected == version and err.actual > version
            lost[who] += 1
            continue
        assert envs[0].version == version + 1
        won.append((envs[0].version, envs[0].body.op_id))  # type: ignore[union-attr]
        done += 1


async def _task_appender(
    log: EventLog, who: str, wins: int, won: list[tuple[int, str]], lost: Counter[str]
) -> None:
    done = 0
    version = log.stream_version(STREAM)
    while done < wins:
        try:
            envs = await log.append_async(STREAM, version, [_body(who, done)])
        except ConflictError as err:
            lost[who] += 1
            version = err.actual  # what the log says now: try again from there
            continue
        assert envs[0].version == version + 1
        won.append((envs[0].version, envs[0].body.op_id))  # type: ignore[union-attr]
        version = envs[0].version
        done += 1


def _check(path: Path, won: list[tuple[int, str]], total: int) -> None:
    versions = sorted(v for v, _ in won)
    assert versions == list(range(1, total + 1)), "each version must have exactly one winner"
    assert len({op for _, op in won}) == total
    rows = assert_valid_log(path)
    assert [r[0] for r in rows] == list(range(1, total + 1))
    assert [r[2] for r in rows] == list(range(1, total + 1))
    with EventLog(path, readonly=True) as ro:
        stored = [(e.version, e.body.op_id) for e in ro.read_stream(STREAM)]  # type: ignore[union-attr]
    assert stored == sorted(won)


def test_threads_race_on_one_stream(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    won: list[tuple[int, str]] = []
    lost: Counter[str] = Counter()
    threads, wins = 16, 25
    with EventLog(path) as log:
        workers = [
            threading.Thread(target=_thread_appender, args=(log, f"t{i}", wins, won, lost))
            for i in range(threads)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=120)
        assert not any(w.is_alive() for w in workers)
    _check(path, won, threads * wins)
    assert sum(lost.values()) > 0  # they really did race


async def test_asyncio_tasks_race_on_one_stream(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    won: list[tuple[int, str]] = []
    lost: Counter[str] = Counter()
    tasks, wins = 64, 10
    with EventLog(path) as log:
        await asyncio.wait_for(
            asyncio.gather(*(_task_appender(log, f"a{i}", wins, won, lost) for i in range(tasks))),
            timeout=120,
        )
    _check(path, won, tasks * wins)
    assert sum(lost.values()) > 0


async def test_threads_and_tasks_race_together(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    won: list[tuple[int, str]] = []
    lost: Counter[str] = Counter()
    with EventLog(path) as log:
        workers = [
            threading.Thread(target=_thread_appender, args=(log, f"t{i}", 10, won, lost))
            for i in range(8)
        ]
        for w in workers:
            w.start()
        await asyncio.wait_for(
            asyncio.gather(*(_task_appender(log, f"a{i}", 10, won, lost) for i in range(32))),
            timeout=120,
        )
        for w in workers:
            await asyncio.to_thread(w.join, 120)
        assert not any(w.is_alive() for w in workers)
    _check(path, won, 40 * 10)


async def test_many_streams_and_multi_event_appends_stay_contiguous(tmp_path: Path) -> None:
    """Group commits mixing streams, sizes and conflicts keep every invariant."""
    path = tmp_path / "events.db"

    async def writer(stream: str, rounds: int) -> int:
        version = 0
        for r in range(rounds):
            bodies = [_body(stream, r * 10 + k) for k in range(1 + r % 4)]
            try:
                envs = await log.append_async(stream, version, bodies)
            except ConflictError as err:  # two writers share each stream
                version = err.actual
                continue
            assert [e.version for e in envs] == list(range(version + 1, version + 1 + len(bodies)))
            assert [e.seq for e in envs] == list(range(envs[0].seq, envs[0].seq + len(bodies)))
            version = envs[-1].version
        return version

    with EventLog(path) as log:
        await asyncio.gather(*(writer(f"device/s{i % 20}", 15) for i in range(40)))
        streams = log.streams()
    assert len(streams) == 20
    assert_valid_log(path)
