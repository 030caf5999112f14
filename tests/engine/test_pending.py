"""nestedpendingoperations: the key matrix, refusal instead of queueing, backoff (fake clock)."""

from __future__ import annotations

import asyncio

import pytest

from volfsm.engine.pending import (
    AlreadyPendingError,
    BackoffPolicy,
    ExponentialBackoffError,
    NestedPendingOperations,
    OperationKey,
)

VOL = "vol-1"


class FakeClock:
    """Monotonic seconds that only move when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ops(clock: FakeClock) -> NestedPendingOperations:
    return NestedPendingOperations(clock=clock)


# --------------------------------------------------------------- key matrix


@pytest.mark.parametrize(
    ("first", "second", "blocked"),
    [
        ((VOL, ""), (VOL, ""), True),  # Volume -> Volume
        ((VOL, ""), (VOL, "pod-a"), True),  # Volume -> VolumePod
        ((VOL, "pod-a"), (VOL, ""), True),  # VolumePod -> Volume
        ((VOL, "pod-a"), (VOL, "pod-a"), True),  # VolumePod -> same VolumePod
        ((VOL, "pod-a"), (VOL, "pod-b"), False),  # VolumePod -> other pod: parallel
        ((VOL, ""), ("vol-2", ""), False),  # other volume: independent
        (("", ""), ("", ""), False),  # no volume: never conflicts
        ((VOL, ""), ("", ""), False),
        (("", ""), (VOL, ""), False),
    ],
    ids=[
        "volume-blocks-volume",
        "volume-blocks-volume-pod",
        "volume-pod-blocks-volume",
        "volume-pod-blocks-same-volume-pod",
        "volume-pod-allows-other-pod",
        "other-volume-independent",
        "no-volume-never-conflicts",
        "volume-then-no-volume",
        "no-volume-then-volume",
    ],
)
def test_key_matrix_of_the_reference(
    ops: NestedPendingOperations,
    first: tuple[str, str],
    second: tuple[str, str],
    blocked: bool,
) -> None:
    ops.start(*first, "op_one")
    if blocked:
        with pytest.raises(AlreadyPendingError):
            ops.start(*second, "op_two")
    else:
        ops.start(*second, "op_two")
        assert ops.running == 2


def test_conflicting_request_is_refused_not_queued(ops: NestedPendingOperations) -> None:
    key = ops.start(VOL, "", "volume_mount")
    with pytest.raises(AlreadyPendingError) as refused:
        ops.start(VOL, "pod-a", "volume_unmount")
    assert refused.value.running == OperationKey(VOL, "")
    ops.complete(key)
    assert ops.running == 0
    assert len(ops) == 0  # the refused request left nothing behind to run later


def test_pending_means_running_not_backing_off(
    ops: NestedPendingOperations, clock: FakeClock
) -> None:
    key = ops.start(VOL, "pod-a", "volume_unmount")
    assert ops.is_operation_pending(VOL)
    assert ops.is_operation_pending(VOL, "pod-a")
    assert not ops.is_operation_pending(VOL, "pod-b")
    ops.complete(key, "boom")
    assert len(ops) == 1
    assert not ops.is_operation_pending(VOL)
    assert not ops.is_operation_pending(VOL, "pod-a")


# ------------------------------------------------------------------ backoff


def test_backoff_grows_from_half_a_second_doubling_to_two_minutes_two_seconds(
    ops: NestedPendingOperations, clock: FakeClock
) -> None:
    seen = []
    for _ in range(11):
        key = ops.start(VOL, "", "volume_mount")
        seen.append(ops.complete(key, "boom"))
        clock.advance(seen[-1] + 0.001)
    assert seen == [0.5, 1, 2, 4, 8, 16, 32, 64, 122, 122, 122]


def test_backoff_refuses_the_same_operation_until_it_has_passed(
    ops: NestedPendingOperations, clock: FakeClock
) -> None:
    ops.complete(ops.start(VOL, "", "volume_mount"), "boom")
    clock.advance(0.5)  # kubelet: retry only once now - lastErrorTime > durationBeforeRetry
    with pytest.raises(ExponentialBackoffError) as backing_off:
        ops.start(VOL, "", "volume_mount")
    assert backing_off.value.duration == 0.5
    assert backing_off.value.retry_at == 100.5
    assert not ops.is_operation_safe_to_retry(VOL, "", "volume_mount")
    clock.advance(0.001)
    assert ops.is_operation_safe_to_retry(VOL, "", "volume_mount")
    ops.start(VOL, "", "volume_mount")


def test_backoff_resets_when_another_operation_comes_during_the_window(
    ops: NestedPendingOperations, clock: FakeClock
) -> None:
    for _ in range(3):  # 0.5, 1, 2
        ops.complete(ops.start(VOL, "", "volume_mount"), "boom")
        clock.advance(10)
    ops.complete(ops.start(VOL, "", "volume_mount"), "boom")  # 4 s now
    assert ops.is_operation_safe_to_retry(VOL, "pod-a", "volume_unmount")
    key = ops.start(VOL, "pod-a", "volume_unmount")  # different name: reset, runs
    assert ops.complete(key, "boom") == 0.5
    with pytest.raises(ExponentialBackoffError):
        ops.start(VOL, "pod-a", "volume_unmount")


def test_after_the_window_an_entry_keeps_its_name_and_duration_as_in_kubelet(
    ops: NestedPendingOperations, clock: FakeClock
) -> None:
    ops.complete(ops.start(VOL, "", "volume_mount"), "boom")  # 0.5
    clock.advance(1)
    key = ops.start(VOL, "", "unmount_device")  # window over: entry reused as is
    assert ops.complete(key, "boom") == 1.0  # the old duration doubled
    with pytest.raises(ExponentialBackoffError) as refused:
        ops.start(VOL, "", "volume_mount")  # the entry still carries the old name
    assert refused.value.operation == "volume_mount"


def test_success_deletes_the_entry_and_with_it_the_backoff(
    ops: NestedPendingOperations, clock: FakeClock
) -> None:
    for _ in range(4):
        ops.complete(ops.start(VOL, "", "volume_mount"), "boom")
        clock.advance(100)
    ops.complete(ops.start(VOL, "", "volume_mount"))
    assert len(ops) == 0
    assert ops.complete(ops.start(VOL, "", "volume_mount"), "boom") == 0.5


def test_backoff_is_configurable_and_can_be_disabled(clock: FakeClock) -> None:
    ops = NestedPendingOperations(BackoffPolicy(initial=1, factor=3, maximum=5), clock=clock)
    durations = []
    for _ in range(4):
        durations.append(ops.complete(ops.start(VOL, "", "op"), "boom"))
        clock.advance(10)
    assert durations == [1, 3, 5, 5]
    off = NestedPendingOperations(BackoffPolicy(enabled=False), clock=clock)
    assert off.complete(off.start(VOL, "", "op"), "boom") == 0.0
    assert len(off) == 0
    off.start(VOL, "", "op")


def test_next_backoff_predicts_what_complete_sets(
    ops: NestedPendingOperations, clock: FakeClock
) -> None:
    for expected in (0.5, 1.0, 2.0):
        key = ops.start(VOL, "", "volume_mount")
        assert ops.next_backoff(key) == expected
        assert ops.complete(key, "boom") == expected
        clock.advance(10)


# ------------------------------------------------------------ which entry


def test_exact_key_match_is_preferred_over_the_first_match(
    ops: NestedPendingOperations, clock: FakeClock
) -> None:
    # Two entries in backoff: (vol, pod-a) first, then (vol, "").
    ops.complete(ops.start(VOL, "pod-a", "volume_unmount"), "boom")
    ops.complete(ops.start(VOL, "", "unmount_device"), "boom")
    # (vol, "") matches both; the exact one (unmount_device, in backoff) decides (#88355).
    with pytest.raises(ExponentialBackoffError) as refused:
        ops.start(VOL, "", "unmount_device")
    assert refused.value.operation == "unmount_device"


def test_a_running_match_wins_over_an_exact_entry_in_backoff(
    ops: NestedPendingOperations,
) -> None:
    ops.complete(ops.start(VOL, "", "unmount_device"), "boom")
    ops.start(VOL, "pod-a", "volume_unmount")  # name differs: resets (vol,"") and reuses it
    ops.start(VOL, "pod-b", "volume_unmount")
    with pytest.raises(AlreadyPendingError):
        ops.start(VOL, "", "unmount_device")
    assert ops.retry_at(VOL) is None


def test_the_reused_entry_takes_the_new_key(ops: NestedPendingOperations) -> None:
    ops.complete(ops.start(VOL, "", "volume_mount"), "boom")
    key = ops.start(VOL, "pod-a", "volume_unmount")
    assert key == OperationKey(VOL, "pod-a")
    assert len(ops) == 1
    ops.start(VOL, "pod-b", "volume_unmount")  # (vol, "") is gone: pod-b runs alongside
    assert ops.running == 2


# -------------------------------------------------------------------- waits


async def test_wait_returns_once_no_entry_is_left(
    ops: NestedPendingOperations, clock: FakeClock
) -> None:
    a = ops.start(VOL, "pod-a", "volume_unmount")
    b = ops.start(VOL, "pod-b", "volume_unmount")
    waiter = asyncio.create_task(ops.wait())
    idle = asyncio.create_task(ops.wait_idle())
    ops.complete(a)
    await asyncio.sleep(0)
    assert not waiter.done()
    ops.complete(b, "boom")  # b stays, in backoff: idle, but not drained
    await asyncio.sleep(0)
    assert idle.done()
    assert not waiter.done()
    clock.advance(1)
    ops.complete(ops.start(VOL, "pod-b", "volume_unmount"), None)
    await asyncio.wait_for(waiter, 1)


def test_a_restored_entry_backs_off_until_its_retry_time_then_keeps_growing(
    ops: NestedPendingOperations, clock: FakeClock
) -> None:
    ops.restore(VOL, "", "volume_mount", 8.0, clock.now + 3.0, "PermissionDenied: no")
    assert not ops.is_operation_pending(VOL)
    with pytest.raises(ExponentialBackoffError) as refused:
        ops.start(VOL, "", "volume_mount")
    assert refused.value.retry_at == clock.now + 3.0
    clock.advance(3.001)
    assert ops.complete(ops.start(VOL, "", "volume_mount"), "boom") == 16.0
    ops.restore("vol-2", "", "volume_mount", 1.0, clock.now - 1, "over already")
    assert len(ops) == 1
