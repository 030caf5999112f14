"""Health and usage observations: legal on pod-volume streams in any state, folded, told."""

from __future__ import annotations

from events.types import (
    Body,
    Envelope,
    VolumeConditionChanged,
    VolumeMounted,
    VolumeUnmounted,
    VolumeUsageChanged,
)
from projections.asw import fold
from projections.story import Story
from projections.validate import validate

PODVOL = "podvol/u1/data"
VOLUME = "pvc-1"


def env(seq: int, body: Body, stream: str = PODVOL) -> Envelope:
    return Envelope(
        seq=seq, stream=stream, version=seq, type=type(body).__name__, schema=1,
        ts=seq * 1000, node="n1", body=body,  # type: ignore[arg-type]
    )  # fmt: skip


def condition(abnormal: bool, message: str = "") -> VolumeConditionChanged:
    return VolumeConditionChanged(
        volume_id=VOLUME, pod_uid="u1", volume_name="data", abnormal=abnormal, message=message,
        namespace="shop", claim="data-0",
    )  # fmt: skip


USAGE = VolumeUsageChanged(
    volume_id=VOLUME, pod_uid="u1", volume_name="data", namespace="shop", claim="data-0",
    capacity_bytes=1 << 30, used_bytes=1 << 29, source="csi",
)  # fmt: skip


def story() -> list[Envelope]:
    return [
        env(1, VolumeMounted(volume_id=VOLUME, pod_uid="u1", volume_name="data")),
        env(2, USAGE),
        env(3, condition(True, "I/O errors")),
    ]


def test_observations_are_legal_on_pod_volume_streams_only() -> None:
    assert validate(story()).ok
    assert validate([env(1, condition(True, "x"))]).ok  # any state, Unmounted included
    wrong = validate([env(1, USAGE, stream=f"device/{VOLUME}")])
    assert wrong.violation is not None
    assert "an observation belongs on a pod-volume stream" in str(wrong.violation)


def test_the_asw_keeps_the_last_condition_and_usage_until_unmounted() -> None:
    pv = fold(story()).podvols[("u1", "data")]
    assert (pv.state, pv.abnormal, pv.condition) == ("Mounted", True, "I/O errors")
    assert (pv.capacity_bytes, pv.used_bytes) == (1 << 30, 1 << 29)
    after = fold([*story(), env(4, VolumeUnmounted(volume_id=VOLUME, pod_uid="u1",
                                                   volume_name="data"))])  # fmt: skip
    pv = after.podvols[("u1", "data")]
    assert (pv.abnormal, pv.condition, pv.capacity_bytes) == (False, "", 0)


def test_replay_tells_them() -> None:
    teller = Story()
    lines = [teller.tell(e).text for e in [*story(), env(4, condition(False))]]
    assert lines[1] == "usage 512MiB of 1GiB used (50%) (claim shop/data-0, csi)"
    assert lines[2] == "volume condition abnormal: I/O errors"
    assert lines[3] == "volume condition normal again"
