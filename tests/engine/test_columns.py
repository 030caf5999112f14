"""The screen's columns give exactly what reading every entry gives, whatever the events."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from events.streams import device_stream, pod_stream, podvol_stream
from events.tables import MOUNTED
from events.types import (
    Body,
    DesiredSizeChanged,
    DesiredVolume,
    DeviceAttached,
    DeviceDetached,
    DeviceMounted,
    Envelope,
    OperationStarted,
    PendingVolume,
    PodAdded,
    PodCleanedUp,
    PodPending,
    PodRemoved,
    VolumeMounted,
    VolumeMountUncertain,
    VolumeResized,
    VolumeSource,
    VolumeUnmounted,
    type_name,
)
from projections.asw import Asw
from volfsm.desired.dsw import DesiredStateOfWorld
from volfsm.engine.columns import ScreenColumns
from volfsm.engine.index import EngineIndex

UIDS = ("p0", "p1", "p2", "p3")
NAMES = ("a", "b", "c")
VIDS = ("v0", "v1", "v2")
SIZES = (None, 1, 2, 3)
SOURCE = VolumeSource(plugin="csi", driver="d")


class Node:
    """ASW, DSW, index and columns fed as the engine feeds them (`VolumeEngine._on_envelopes`)."""

    def __init__(self) -> None:
        self.asw = Asw()
        self.dsw = DesiredStateOfWorld(lambda source, mode: None)
        self.index = EngineIndex(self.dsw)
        self.columns = ScreenColumns(self.asw, self.dsw, self.index)
        self.seq = 0

    def feed(self, stream: str, body: Body) -> None:
        self.seq += 1
        env = Envelope(
            seq=self.seq, stream=stream, version=self.seq, type=type_name(body), schema=1,
            ts=self.seq, node="n", body=body,
        )  # fmt: skip
        touched = self.columns.touched_by(env)
        self.asw.apply(env)
        kind = type(body).KIND
        if kind == "desired":
            self.index.apply(env)
            self.dsw.observe(env)
        elif kind == "podvol" or env.type == "DeviceDetached":
            self.index.apply(env)
        self.columns.touch(*touched)


def per_entry_screen(node: Node) -> set[str]:
    """The screen read from the dicts, one entry at a time."""
    need = set()
    wanted = node.dsw.desired_entries()
    for key, (_, dv) in wanted.items():
        pv = node.asw.podvols.get(key)
        if pv is None or pv.state != MOUNTED:
            need.add(dv.volume_id)
    holders = node.index.holders
    for vid, held in holders.items():
        if any(key not in wanted for key in held):
            need.add(vid)
    for vid, dev in node.asw.devices.items():
        if vid not in holders and not node.dsw.volume_desired(vid):
            need.add(vid)
        want = node.dsw.desired_size(vid)
        if want is not None and dev.size_bytes is not None and want > dev.size_bytes:
            need.add(vid)
    return need


uid_ = st.sampled_from(UIDS)
name_ = st.sampled_from(NAMES)
vid_ = st.sampled_from(VIDS)
size_ = st.sampled_from(SIZES)


def _volume(name: str, vid: str, size: int | None) -> DesiredVolume:
    return DesiredVolume(name=name, volume_id=vid, source=SOURCE, size_bytes=size)


added = st.builds(
    lambda uid, vols: (
        pod_stream(uid),
        PodAdded(pod_uid=uid, namespace="ns", name=uid, volumes=tuple(vols.values())),
    ),
    uid_,
    st.dictionaries(name_, st.builds(_volume, name_, vid_, size_), max_size=3).map(
        lambda vols: {v.name: v for v in vols.values()}
    ),
)
removed = uid_.map(lambda u: (pod_stream(u), PodRemoved(pod_uid=u, namespace="ns", name=u)))
pending = uid_.map(
    lambda u: (
        pod_stream(u),
        PodPending(
            pod_uid=u, namespace="ns", name=u, waiting=(PendingVolume(name="a", waits_for="x"),)
        ),
    )
)
cleaned = st.builds(
    lambda u, names: (pod_stream(u), PodCleanedUp(pod_uid=u, volume_names=tuple(names))),
    uid_,
    st.lists(name_, max_size=3, unique=True),
)
grown = st.builds(
    lambda v, s: (pod_stream("p0"), DesiredSizeChanged(volume_id=v, size_bytes=s)),
    vid_,
    st.sampled_from((1, 2, 3, 4)),
)


def _podvol(make: Callable[[str, str, str], Body]) -> st.SearchStrategy[tuple[str, Body]]:
    return st.builds(lambda u, n, v: (podvol_stream(u, n), make(u, n, v)), uid_, name_, vid_)


mounted = _podvol(lambda u, n, v: VolumeMounted(volume_id=v, pod_uid=u, volume_name=n))
uncertain = _podvol(
    lambda u, n, v: VolumeMountUncertain(volume_id=v, pod_uid=u, volume_name=n, reason="r")
)
unmounted = _podvol(lambda u, n, v: VolumeUnmounted(volume_id=v, pod_uid=u, volume_name=n))
started = _podvol(
    lambda u, n, v: OperationStarted(op_id="o", operation="volume_mount", volume_id=v, pod_uid=u)
)
device = st.builds(
    lambda v, body: (device_stream(v), body(v)),
    vid_,
    st.sampled_from(
        (
            lambda v: DeviceAttached(volume_id=v, plugin="csi:d"),
            lambda v: DeviceMounted(volume_id=v),
            lambda v: VolumeResized(volume_id=v, size_bytes=1),
            lambda v: VolumeResized(volume_id=v, size_bytes=3),
            lambda v: DeviceDetached(volume_id=v),
        )
    ),
)
event = st.one_of(
    added, removed, pending, cleaned, grown, mounted, uncertain, unmounted, started, device
)


@settings(max_examples=300, deadline=None)
@given(st.lists(event, max_size=80))
def test_the_column_screen_equals_the_per_entry_screen_after_every_event(
    events: list[tuple[str, Body]],
) -> None:
    node = Node()
    node.columns.rebuild()
    for i, (stream, body) in enumerate(events):
        node.feed(stream, body)
        assert node.columns.stale() == []
        assert node.columns.screen() == per_entry_screen(node)
        # ids are reused: never more than one per pod-volume / volume that can exist
        assert len(node.columns.podvols.bits) <= len(UIDS) * len(NAMES)
        assert len(node.columns.devices.bits) <= len(VIDS)
        if i % 10 == 9:  # a start's rebuild from the same state gives the same bits
            fresh = ScreenColumns(node.asw, node.dsw, node.index)
            fresh.rebuild()
            assert fresh.stale() == []
            assert fresh.screen() == node.columns.screen()


def test_a_screen_finds_each_kind_of_work_and_nothing_on_an_idle_node() -> None:
    node = Node()
    node.columns.rebuild()
    for uid, vid in (("p0", "v0"), ("p1", "v1"), ("p2", "v2")):
        node.feed(pod_stream(uid), PodAdded(pod_uid=uid, namespace="ns", name=uid,
                                            volumes=(_volume("a", vid, 2),)))  # fmt: skip
        node.feed(device_stream(vid), DeviceAttached(volume_id=vid, plugin="csi:d"))
        node.feed(device_stream(vid), VolumeResized(volume_id=vid, size_bytes=2))
        node.feed(
            podvol_stream(uid, "a"), VolumeMounted(volume_id=vid, pod_uid=uid, volume_name="a")
        )
    assert node.columns.screen() == set()  # everything Mounted, held, wanted, big enough
    node.feed(pod_stream("p0"), PodRemoved(pod_uid="p0", namespace="ns", name="p0"))
    node.feed(pod_stream("p1"), DesiredSizeChanged(volume_id="v1", size_bytes=3))
    node.feed(
        podvol_stream("p2", "a"), VolumeUnmounted(volume_id="v2", pod_uid="p2", volume_name="a")
    )
    assert node.columns.screen() == {"v0", "v1", "v2"} == per_entry_screen(node)
    node.feed(
        podvol_stream("p0", "a"), VolumeUnmounted(volume_id="v0", pod_uid="p0", volume_name="a")
    )
    node.feed(device_stream("v0"), DeviceDetached(volume_id="v0"))
    assert node.columns.screen() == {"v1", "v2"} == per_entry_screen(node)


def test_repair_sets_again_what_went_out_of_step_and_the_screen_then_finds_it() -> None:
    """The events keep the bytes; `repair` (every VERIFY_EVERY-th screen) checks them against
    the state, so a byte gone wrong cannot hide work from the full pass for long."""
    node = Node()
    node.columns.rebuild()
    node.feed(pod_stream("p0"), PodAdded(pod_uid="p0", namespace="ns", name="p0",
                                         volumes=(_volume("a", "v0", None),)))  # fmt: skip
    assert node.columns.screen() == {"v0"} == per_entry_screen(node)  # desired, not mounted
    column = node.columns.podvols
    column.bits[column.ids[("p0", "a")]] = 0  # as if an event's touch had been missed
    assert node.columns.screen() == set() != per_entry_screen(node)
    assert node.columns.repair() == ["pod-volume ('p0', 'a')"]
    assert node.columns.screen() == {"v0"} and node.columns.repair() == []
