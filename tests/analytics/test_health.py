"""The health fold: "volumes near full" and "abnormal volumes" from observation events."""

from __future__ import annotations

from events.codec import envelope_to_json
from events.types import Body, Envelope, VolumeConditionChanged, VolumeUnmounted, VolumeUsageChanged
from projections.analytics import HealthFold

GIB = 1 << 30


def env(seq: int, node: str, body: Body, pod: str = "p1", name: str = "data") -> Envelope:
    return Envelope(
        seq=seq, stream=f"podvol/{pod}/{name}", version=seq, type=type(body).__name__, schema=1,
        ts=seq * 1_000_000, node=node, body=body,  # type: ignore[arg-type]
    )  # fmt: skip


def usage(used: int, claim: str = "data-db-0", pod: str = "p1") -> VolumeUsageChanged:
    return VolumeUsageChanged(
        volume_id=f"v-{claim}", pod_uid=pod, volume_name="data", namespace="shop", claim=claim,
        capacity_bytes=GIB, used_bytes=used, available_bytes=GIB - used, source="csi",
    )  # fmt: skip


def condition(abnormal: bool, message: str = "", pod: str = "p1") -> VolumeConditionChanged:
    return VolumeConditionChanged(
        volume_id="v-data-db-0", pod_uid=pod, volume_name="data", abnormal=abnormal,
        message=message, namespace="shop", claim="data-db-0",
    )  # fmt: skip


def story() -> list[Envelope]:
    return [
        env(1, "n1", usage(GIB // 2)),
        env(2, "n2", usage(GIB // 10, claim="logs", pod="p2"), pod="p2"),
        env(3, "n1", usage(GIB * 19 // 20)),
        env(4, "n1", condition(True, "I/O errors")),
        env(5, "n2", usage(GIB * 9 // 10, claim="logs", pod="p2"), pod="p2"),
        env(6, "n2", VolumeUnmounted(volume_id="v-logs", pod_uid="p2", volume_name="data"), "p2"),
    ]


def test_near_full_and_abnormal_from_envelopes_and_from_json() -> None:
    by_env, by_json = HealthFold(), HealthFold()
    for e in story():
        by_env.apply(e)
        by_json.apply_json(envelope_to_json(e))
    for fold in (by_env, by_json):
        [full] = fold.near_full()
        assert (full.node, full.namespace, full.claim) == ("n1", "shop", "data-db-0")
        assert full.used_bytes == GIB * 19 // 20 and full.recorded_us == 3_000_000
        [bad] = fold.abnormal()
        assert (bad.node, bad.claim, bad.message, bad.since_us) == (
            "n1",
            "data-db-0",
            "I/O errors",
            4_000_000,
        )
        assert fold.near_full(threshold=0.5)[0].claim == "data-db-0"  # p2 was unmounted


def test_normal_again_leaves_the_abnormal_section() -> None:
    fold = HealthFold()
    for e in [env(1, "n1", condition(True, "x")), env(2, "n1", condition(False))]:
        fold.apply(e)
    assert fold.abnormal() == []
    assert fold.near_full() == []  # no usage recorded
