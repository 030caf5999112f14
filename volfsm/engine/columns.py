"""The facts the reconciler's full screen checks, kept as one byte per pod-volume and device.

The full screen (`Reconciler.screen`) asks four things of every entry:
is each desired pod-volume Mounted, is each held pod-volume (Mounted or
Uncertain, `EngineIndex.held`) still desired, is each device held or
wanted, is each device smaller than pods want. Read from the dicts, that
touches a dozen objects per entry scattered over the heap; at 100,000
pod-volumes they are far bigger than the CPU's cache and a screen is
mostly waits for memory.

`ScreenColumns` keeps the answers' inputs as bits in two `bytearray`s,
one byte per pod-volume and one per device, indexed by a small id each
entry gets when it first has a fact (freed ids are reused). The engine
recomputes the bytes of the entries each event touches (`touched_by`
before the event is folded, `touch` after), and `rebuild` sets them all
after a start's fold. A screen is then a `bytearray.find` (the C
library's memchr) per byte value that means work - four for pod-volumes,
nine for devices - over 100 KB per 100,000 entries, read in order. Only
entries a sweep finds are looked up in the dicts (which volume the work
is on). The result is the set the per-entry screen gives
(tests/engine/test_columns.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import repeat
from operator import attrgetter
from types import SimpleNamespace
from typing import Generic, Protocol, TypeVar

from events.streams import DEVICE_PREFIX, PODVOL_PREFIX
from events.tables import MOUNTED
from events.types import DesiredVolume, Envelope, PodAdded
from projections.asw import Asw
from volfsm.engine.index import EngineIndex, PodVolumeKey

DESIRED = 1
"""Pod-volume bit: a desired pod wants it (the DSW's entries)."""
MOUNTED_BIT = 2
"""Pod-volume bit: its ASW entry is Mounted."""
HELD = 4
"""Pod-volume bit: it is Mounted or Uncertain on some volume (the index's `held`)."""

PRESENT = 1
"""Device bit: the ASW has the device."""
DEVICE_HELD = 2
"""Device bit: some pod-volume on it is Mounted or Uncertain (the index's `holders`)."""
WANTED = 4
"""Device bit: some desired pod wants the volume."""
GROW = 8
"""Device bit: pods want it bigger than its recorded size (online expansion)."""


def _with_work(work: Callable[[int], object], bits: int) -> tuple[int, ...]:
    """The byte values (of `bits` bits) for which `work(value)` is true."""
    return tuple(b for b in range(1 << bits) if work(b))


_PODVOL_WORK = _with_work(
    lambda b: (b & DESIRED and not b & MOUNTED_BIT) or (b & HELD and not b & DESIRED), 3
)
"""Desired and not Mounted (mount it), or held and not desired (unmount it)."""
_DEVICE_WORK = _with_work(lambda b: (b & PRESENT and not b & (DEVICE_HELD | WANTED)) or b & GROW, 4)
"""On the node and neither held nor wanted (unstage / detach it), or to grow."""
_STATE = attrgetter("state")
_NO_ENTRY = SimpleNamespace(state="")
"""What `rebuild` reads as the state of a pod-volume the ASW has no entry for."""
_PODVOL_CUT = len(PODVOL_PREFIX)
_DEVICE_CUT = len(DEVICE_PREFIX)

K = TypeVar("K", PodVolumeKey, str)

Touched = tuple[list[PodVolumeKey], list[str]]
"""(pod-volume keys, volume ids) whose facts an event may change."""


class DesiredFacts(Protocol):
    """What the columns read from the DSW."""

    @property
    def pods(self) -> Mapping[str, PodAdded]:
        """Desired pods by uid."""

    def desired_entries(self) -> Mapping[PodVolumeKey, tuple[PodAdded, DesiredVolume]]:
        """(pod uid, volume name) -> (pod, volume) of every desired pod-volume."""

    def desired_sizes(self) -> Mapping[str, int]:
        """volume id -> the size pods want."""

    def volume_desired(self, volume_id: str) -> bool:
        """Whether any pod wants the volume."""


class Column(Generic[K]):
    """One byte of bits per key; keys get a small id while their byte is not zero."""

    def __init__(self) -> None:
        self.ids: dict[K, int] = {}
        self.keys: list[K | None] = []
        self.bits = bytearray()
        self._free: list[int] = []

    def set(self, key: K, bits: int) -> None:
        """Record the key's bits (0: it has no fact; its id is freed)."""
        i = self.ids.get(key)
        if i is not None:
            if bits:
                self.bits[i] = bits
                return
            del self.ids[key]
            self.keys[i] = None
            self.bits[i] = 0
            self._free.append(i)
        elif bits:
            if self._free:
                i = self._free.pop()
                self.keys[i] = key
                self.bits[i] = bits
            else:
                i = len(self.keys)
                self.keys.append(key)
                self.bits.append(bits)
            self.ids[key] = i

    def fill(self, keys: list[K], bits: bytes) -> None:
        """Replace everything with `keys` and their `bits` (same length, in order)."""
        self.ids = dict(zip(keys, range(len(keys)), strict=True))
        self.keys = list(keys)
        self.bits = bytearray(bits)
        self._free = []
        i = self.bits.find(0)
        while i >= 0:  # a zero byte: no fact, the id is free
            del self.ids[keys[i]]
            self.keys[i] = None
            self._free.append(i)
            i = self.bits.find(0, i + 1)

    def with_work(self, values: tuple[int, ...]) -> list[K]:
        """The keys whose byte is one of `values`: a `find` (memchr) per value and per key
        found, so an idle column is read at memory speed."""
        bits, keys = self.bits, self.keys
        found: list[K] = []
        for value in values:
            i = bits.find(value)
            while i >= 0:
                key = keys[i]
                if key is not None:
                    found.append(key)
                i = bits.find(value, i + 1)
        return found


class ScreenColumns:
    """The screen's facts per pod-volume and per device, kept in step with the state."""

    def __init__(self, asw: Asw, dsw: DesiredFacts, index: EngineIndex) -> None:
        self.asw = asw
        self.dsw = dsw
        self.index = index
        self.podvols: Column[PodVolumeKey] = Column()
        """(pod uid, volume name) -> DESIRED | MOUNTED_BIT | HELD."""
        self.devices: Column[str] = Column()
        """volume id -> PRESENT | DEVICE_HELD | WANTED | GROW (devices on the node only)."""

    # ------------------------------------------------------------- keeping

    def rebuild(self) -> None:
        """Set every entry's bits from the state (after a start's fold).

        Each fact is one C-level map over the keys (`_bit_bytes`): a start
        at 100,000 pod-volumes runs no Python code per entry here.
        """
        wanted = self.dsw.desired_entries()
        podvols, held = self.asw.podvols, self.index.held
        keys = list(wanted)  # the DSW's key objects
        entries = list(map(podvols.get, keys, repeat(_NO_ENTRY)))
        held_bytes = bytes(map(held.__contains__, keys))
        # Entries that are not desired: only if some exist (counted, not searched for).
        extra: set[PodVolumeKey] = set()
        if len(keys) - entries.count(_NO_ENTRY) < len(podvols):
            extra.update(podvols.keys() - wanted.keys())
        if held_bytes.count(1) < len(held):
            extra.update(held.keys() - wanted.keys())
        if extra:
            keys += extra
            entries += map(podvols.get, extra, repeat(_NO_ENTRY))
            held_bytes += bytes(map(held.__contains__, extra))
        self.podvols.fill(
            keys,
            _bit_bytes(
                (b"\x01" * len(wanted) + bytes(len(extra)), DESIRED),
                (bytes(map(MOUNTED.__eq__, map(_STATE, entries))), MOUNTED_BIT),
                (held_bytes, HELD),
            ),
        )
        vids = list(self.asw.devices)
        self.devices.fill(
            vids,
            _bit_bytes(
                (b"\x01" * len(vids), PRESENT),
                (bytes(map(self.index.holders.__contains__, vids)), DEVICE_HELD),
                (bytes(map(self.dsw.volume_desired, vids)), WANTED),
            ),
        )
        for vid in self.dsw.desired_sizes():  # online expansion: a lookup per size wanted
            bits = self._device_bits(vid)
            if bits & GROW:
                self.devices.set(vid, bits)

    def touched_by(self, env: Envelope) -> Touched:
        """The pod-volumes and devices whose facts `env` may change (call before folding it:
        a pod's volumes before the change count too)."""
        stream, body = env.stream, env.body
        vid = getattr(body, "volume_id", "")
        vids = [vid] if vid else []
        if stream.startswith(PODVOL_PREFIX):
            uid, _, name = stream[_PODVOL_CUT:].partition("/")
            return [(uid, name)], vids
        if stream.startswith(DEVICE_PREFIX):
            return [], [stream[_DEVICE_CUT:]]
        uid = getattr(body, "pod_uid", "")
        if not uid:
            return [], vids
        keys = []  # (PodCleanedUp drops entries that are not Mounted: no bit changes)
        for pod in (self.dsw.pods.get(uid), body if isinstance(body, PodAdded) else None):
            for dv in pod.volumes if pod is not None else ():
                keys.append((uid, dv.name))
                vids.append(dv.volume_id)
        return keys, vids

    def touch(self, keys: Iterable[PodVolumeKey], vids: Iterable[str]) -> None:
        """Recompute the bits of these pod-volumes and devices (after an event was folded)."""
        for key in keys:
            self.podvols.set(key, self._podvol_bits(key))
        for vid in vids:
            self.devices.set(vid, self._device_bits(vid))

    def _podvol_bits(self, key: PodVolumeKey) -> int:
        pv = self.asw.podvols.get(key)
        return (
            (DESIRED if key in self.dsw.desired_entries() else 0)
            | (MOUNTED_BIT if pv is not None and pv.state == MOUNTED else 0)
            | (HELD if key in self.index.held else 0)
        )

    def _device_bits(self, vid: str) -> int:
        dev = self.asw.devices.get(vid)
        if dev is None:
            return 0
        want = self.dsw.desired_sizes().get(vid)
        size = dev.size_bytes
        return (
            PRESENT
            | (DEVICE_HELD if vid in self.index.holders else 0)
            | (WANTED if self.dsw.volume_desired(vid) else 0)
            | (GROW if want is not None and size is not None and want > size else 0)
        )

    # ------------------------------------------------------------ screening

    def screen(self) -> set[str]:
        """Volumes with a pod-volume to mount or unmount, or a device to unstage, detach or
        grow: the dict-reading part of `Reconciler.screen`."""
        need = set(self.devices.with_work(_DEVICE_WORK))
        found = self.podvols.with_work(_PODVOL_WORK)
        if found:
            wanted = self.dsw.desired_entries()
            for key in found:
                entry = wanted.get(key)
                if entry is not None:
                    need.add(entry[1].volume_id)  # desired and not Mounted
                else:
                    need.update(self._holding(key))  # held and not desired
        return need

    def _holding(self, key: PodVolumeKey) -> list[str]:
        """The volumes on which `key` is held: where its entry says, else by a search."""
        pv = self.asw.podvols.get(key)
        holders = self.index.holders
        if (
            pv is not None
            and self.index.held.get(key) == 1
            and key in holders.get(pv.volume_id, ())
        ):
            return [pv.volume_id]
        return [vid for vid, held in holders.items() if key in held]

    # ---------------------------------------------------------------- check

    def stale(self) -> list[str]:
        """Entries whose bits differ from the state ([] when in step)."""
        keys, vids = self.all_keys()
        return _described(self._stale_podvols(keys), self._stale_devices(vids))

    def repair(self) -> list[str]:
        """Check every entry's bits against the state, as the screen did before the columns,
        and set the ones out of step; what was out of step ([] when the events kept them)."""
        keys, vids = self.all_keys()
        return self.repair_some(keys, vids)

    def all_keys(self) -> tuple[list[PodVolumeKey], list[str]]:
        """Every pod-volume and device a byte could be kept for (with repeats; C-level copies,
        so a check can go through them in parts while the state changes)."""
        keys = [*self.dsw.desired_entries(), *self.asw.podvols, *self.index.held]
        return [*keys, *self.podvols.ids], [*self.asw.devices, *self.devices.ids]

    def repair_some(self, keys: Sequence[PodVolumeKey], vids: Sequence[str]) -> list[str]:
        """`repair` for these entries only."""
        stale_keys, stale_vids = self._stale_podvols(keys), self._stale_devices(vids)
        if stale_keys or stale_vids:
            self.touch(stale_keys, stale_vids)
        return _described(stale_keys, stale_vids)

    def _stale_podvols(self, keys: Iterable[PodVolumeKey]) -> list[PodVolumeKey]:
        bits, column = self._podvol_bits, self.podvols
        return list(dict.fromkeys(k for k in keys if bits(k) != _bits_of(column, k)))

    def _stale_devices(self, vids: Iterable[str]) -> list[str]:
        bits, column = self._device_bits, self.devices
        return list(dict.fromkeys(v for v in vids if bits(v) != _bits_of(column, v)))


def _described(keys: Iterable[PodVolumeKey], vids: Iterable[str]) -> list[str]:
    return [*(f"pod-volume {k}" for k in keys), *(f"device {v}" for v in vids)]


def _bits_of(column: Column[K], key: K) -> int:
    i = column.ids.get(key)
    return column.bits[i] if i is not None else 0


def _bit_bytes(*facts: tuple[bytes, int]) -> bytes:
    """The OR of byte strings of 0s and 1s, each times its bit (all as big integers)."""
    total = 0
    for ones, bit in facts:
        total |= int.from_bytes(ones, "little") * bit
    return total.to_bytes(len(facts[0][0]), "little")
