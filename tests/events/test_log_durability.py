"""Crash safety and the single-writer lock, with real child processes and SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from events.errors import LogLockedError
from events.log import EventLog
from tests.events.helpers import assert_valid_log, ops

ROOT = Path(__file__).resolve().parents[2]

APPENDER = textwrap.dedent(
    """
    import asyncio, sys, threading
    from events.log import EventLog
    from events.types import OperationStarted

    log = EventLog(sys.argv[1], node="child")
    out = threading.Lock()

    def ack(envs, marker):
        line = f"ack {envs[0].stream} {envs[0].seq} {envs[-1].seq} {envs[-1].version} {marker}"
        with out:
            sys.stdout.write(line + "\\n")
            sys.stdout.flush()

    def bodies(marker, n):
        return [
            OperationStarted(op_id=f"{marker}/{k}", operation="mount", volume_id=marker)
            for k in range(n)
        ]

    def thread_appender(t):
        version, i = 0, 0
        while True:
            marker = f"t{t}-{i}"
            envs = log.append(f"device/t{t}", version, bodies(marker, 1 + i % 3))
            version = envs[-1].version
            ack(envs, marker)
            i += 1

    async def task_appender(t):
        version, i = 0, 0
        while True:
            marker = f"a{t}-{i}"
            envs = await log.append_async(f"podvol/a{t}/data", version, bodies(marker, 1 + i % 2))
            version = envs[-1].version
            ack(envs, marker)
            i += 1

    async def main():
        await asyncio.gather(*(task_appender(t) for t in range(8)))

    print("ready", flush=True)
    for t in range(3):
        threading.Thread(target=thread_appender, args=(t,), daemon=True).start()
    asyncio.run(main())
    """
)

HOLDER = textwrap.dedent(
    """
    import sys, time
    from events.log import EventLog
    log = EventLog(sys.argv[1], node="holder")
    print("ready", flush=True)
    time.sleep(600)
    """
)


@contextmanager
def child(script: str, path: Path) -> Iterator[subprocess.Popen[str]]:
    """Run `script` on `path` in a child Python; always SIGKILLed and reaped at the end."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if first.strip() != "ready":
            proc.kill()
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"child did not start: {first!r} {err}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _read_acks(proc: subprocess.Popen[str], wanted: int) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while len(lines) < wanted and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
    return lines


def test_sigkill_mid_stream_loses_no_acknowledged_event(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with child(APPENDER, path) as proc:
        lines = _read_acks(proc, 400)
        assert len(lines) >= 400, "the child stopped acknowledging appends"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.stdout is not None
        lines += proc.stdout.readlines()  # everything it acknowledged before dying
    acks = [ln.split() for ln in lines if ln.endswith("\n") and ln.startswith("ack ")]
    assert len(acks) >= 400

    rows = assert_valid_log(path)  # gap-free seq, contiguous unique versions per stream
    with EventLog(path, readonly=True) as ro:
        by_seq = {e.seq: e for e in ro.read_after(0)}
    assert len(by_seq) == len(rows)
    for _, stream, first, last, version, marker in acks:
        envs = [by_seq.get(s) for s in range(int(first), int(last) + 1)]
        assert all(e is not None for e in envs), f"acknowledged {marker} is missing"
        assert {e.stream for e in envs if e} == {stream}
        assert [e.body.op_id for e in envs if e] == [  # type: ignore[union-attr]
            f"{marker}/{k}" for k in range(len(envs))
        ]
        assert envs[-1] is not None and envs[-1].version == int(version)
    # Atomicity: every multi-event append is in the log completely or not at all.
    groups: dict[str, list[int]] = {}
    for env in by_seq.values():
        marker, _, k = env.body.op_id.partition("/")  # type: ignore[union-attr]
        groups.setdefault(marker, []).append(int(k))
    for marker, ks in groups.items():
        size = 1 + int(marker.rsplit("-", 1)[1]) % (3 if marker.startswith("t") else 2)
        assert sorted(ks) == list(range(size)), f"{marker} was torn: {ks}"

    # The killed writer's lock is gone and the log takes appends again.
    with EventLog(path) as log:
        end = log.last_seq()
        more = log.append("device/after-crash", 0, ops("x", 2))
        assert [e.seq for e in more] == [end + 1, end + 2]
    assert_valid_log(path)


def test_second_writer_in_another_process_gets_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with child(HOLDER, path) as proc:
        with pytest.raises(LogLockedError) as err:
            EventLog(path)
        message = str(err.value)
        assert str(path) in message
        assert "already open for writing by another process" in message
        assert f"pid {proc.pid}" in message
        # Reading while another process writes is fine.
        with EventLog(path, readonly=True) as ro:
            assert ro.node == "holder"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    # flock dies with its holder: the log opens for writing at once.
    with EventLog(path) as log:
        assert log.append("device/v", 0, ops("a", 1))[0].seq == 1


def test_second_writer_in_the_same_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with EventLog(path), pytest.raises(LogLockedError, match=f"pid {os.getpid()}"):
        EventLog(path)
    with EventLog(path) as again:  # released by close()
        assert again.last_seq() == 0
