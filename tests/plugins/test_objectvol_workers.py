"""The object plugins' SetUp threads: results reach the loop in batches, errors too."""

from __future__ import annotations

import asyncio
import threading
import time
from functools import partial

import pytest

from volfsm.plugins.objectvol.workers import Workers


async def test_results_that_finish_while_the_loop_is_busy_reach_it_in_one_wake_up() -> None:
    workers = Workers(2, "test-workers")
    wakeups = 0
    deliver = workers._deliver

    def counted(target: asyncio.AbstractEventLoop) -> None:
        nonlocal wakeups
        wakeups += 1
        deliver(target)

    workers._deliver = counted  # type: ignore[method-assign,assignment]
    gate = threading.Event()

    def call(i: int) -> int:
        gate.wait(5)
        return i * i

    calls = [asyncio.ensure_future(workers.run(partial(call, i))) for i in range(50)]
    await asyncio.sleep(0)  # every call queued
    gate.set()
    deadline = time.monotonic() + 10
    while _handed_over(workers) < 50 and time.monotonic() < deadline:
        time.sleep(0.001)  # the loop is busy: finished calls pile up for it
    assert await asyncio.gather(*calls) == [i * i for i in range(50)]
    assert wakeups == 1


def _handed_over(workers: Workers) -> int:
    with workers._done_lock:
        return sum(len(done) for done in workers._done.values())


async def test_an_error_is_raised_to_the_caller_and_the_threads_go_on() -> None:
    workers = Workers(1, "test-workers")

    def fail() -> int:
        raise OSError(5, "disk said no")

    with pytest.raises(OSError, match="disk said no"):
        await workers.run(fail)
    assert await workers.run(lambda: 7) == 7


async def test_a_call_cancelled_before_a_thread_took_it_never_runs() -> None:
    workers = Workers(1, "test-workers")
    gate = threading.Event()
    ran: list[str] = []
    first = asyncio.ensure_future(workers.run(lambda: gate.wait(5)))
    second = asyncio.ensure_future(workers.run(lambda: ran.append("second")))
    await asyncio.sleep(0.05)
    second.cancel()
    gate.set()
    assert await first is True
    with pytest.raises(asyncio.CancelledError):
        await second
    assert await workers.run(lambda: "after") == "after"  # the one thread took the next call
    assert ran == []
