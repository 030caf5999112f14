"""The ASW as a snapshot part: to a msgspec struct (and bytes) and back, exactly.

The codec is generic over `Asw`: every field of the dataclass, and every
field of its entry structs, is encoded by msgspec as it is declared, so a
field added to `Asw`, `DeviceState`, `PodVolumeState` or `OperationRecord`
is carried without touching this module (older snapshots decode with the
field's default; `volfsm.engine.snapshot` refuses snapshots of another
build anyway).

One thing msgspec cannot see is sharing: after a failure an entry's
`last_error` is the very object of its `last_operation`, and a later
outcome of the same operation updates both. The snapshot lists the
entries where they are one object and `restore_asw` joins them again, so
a restored ASW folds the following events exactly as the original would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import msgspec

from projections.asw import Asw, PodVolumeState

PodVolumeKey = tuple[str, str]


class AswSnapshot(msgspec.Struct, array_like=True, frozen=True):
    """An ASW as stored in a snapshot."""

    asw: Asw
    shared_device_errors: list[str] = []
    """Devices whose `last_error` is their `last_operation` (one object)."""
    shared_podvol_errors: list[tuple[str, str]] = []
    """Pod-volumes whose `last_error` is their `last_operation` (one object)."""


_ASW_FIELDS = tuple(f.name for f in dataclasses.fields(Asw))
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(AswSnapshot)


def snapshot_asw(asw: Asw) -> AswSnapshot:
    """The snapshot part of `asw` (shares its objects: encode it before the ASW changes)."""
    devices = [
        vid
        for vid, dev in asw.devices.items()
        if dev.last_error is not None and dev.last_error is dev.last_operation
    ]
    podvols = [
        key
        for key, pv in asw.podvols.items()
        if pv.last_error is not None and pv.last_error is pv.last_operation
    ]
    return AswSnapshot(asw=asw, shared_device_errors=devices, shared_podvol_errors=podvols)


def restore_asw(snap: AswSnapshot, into: Asw | None = None) -> Asw:
    """The ASW of a decoded snapshot part, filled into `into` (in place) if given.

    In place means the same `Asw` object and the same dict objects, so
    holders of references to them (the reconciler, the executor) see the
    restored state.
    """
    restored = snap.asw
    for vid in snap.shared_device_errors:
        dev = restored.devices.get(vid)
        if dev is not None and dev.last_operation is not None:
            dev.last_error = dev.last_operation
    for key in snap.shared_podvol_errors:
        pv = restored.podvols.get(key)
        if pv is not None and pv.last_operation is not None:
            pv.last_error = pv.last_operation
    if into is None:
        return restored
    for name in _ASW_FIELDS:
        new = getattr(restored, name)
        old = getattr(into, name)
        if isinstance(old, dict) and isinstance(new, dict):
            old.clear()
            old.update(new)
        else:
            setattr(into, name, new)
    return into


def encode_asw(asw: Asw) -> bytes:
    """msgpack bytes of an ASW (what `decode_asw` reads)."""
    return _encoder.encode(snapshot_asw(asw))


def decode_asw(data: bytes) -> Asw:
    """The ASW `encode_asw` wrote (`msgspec.DecodeError` for anything else)."""
    return restore_asw(_decoder.decode(data))


PART_CHUNK = 4096
"""Pod-volume entries per chunk of a `encode_podvol_part` (its reader decodes one at a time)."""

_LENGTH = 4
"""Bytes of the length that goes before each chunk of a pod-volume part (big-endian)."""


class PodVolPartHead(msgspec.Struct, array_like=True, frozen=True):
    """What comes first in a pod-volume part: the part's last seq and ts, its chunk count."""

    last_seq: int
    last_ts: int
    chunks: int


class PodVolChunk(msgspec.Struct, array_like=True, frozen=True):
    """Consecutive pod-volume entries of an ASW (keys and entries in the same order)."""

    keys: list[PodVolumeKey]
    entries: list[PodVolumeState]
    shared_errors: list[int] = []
    """Positions of the entries whose `last_error` is their `last_operation` (one object)."""


_head_decoder = msgspec.msgpack.Decoder(PodVolPartHead)
_chunk_decoder = msgspec.msgpack.Decoder(PodVolChunk)


def encode_podvol_part(asw: Asw, chunk: int = PART_CHUNK) -> bytes:
    """An ASW's pod-volume entries, last seq and ts, as length-prefixed chunks of `chunk` entries.

    `read_podvol_part` decodes them a chunk at a time, so that a reader that
    replaces the decoded strings with shared copies as they come frees each
    chunk's copies before the next is decoded: the copies' memory is reused
    instead of piling up between the entries that stay.
    """
    items = list(asw.podvols.items())
    starts = range(0, len(items), chunk)
    frames = [_encoder.encode(PodVolPartHead(asw.last_seq, asw.last_ts, len(starts)))]
    for start in starts:
        part = items[start : start + chunk]
        frames.append(
            _encoder.encode(
                PodVolChunk(
                    keys=[key for key, _ in part],
                    entries=[pv for _, pv in part],
                    shared_errors=[
                        i
                        for i, (_, pv) in enumerate(part)
                        if pv.last_error is not None and pv.last_error is pv.last_operation
                    ],
                )
            )
        )
    return b"".join(len(frame).to_bytes(_LENGTH, "big") + frame for frame in frames)


def read_podvol_part(data: bytes | memoryview) -> tuple[PodVolPartHead, Iterator[PodVolChunk]]:
    """The head of an `encode_podvol_part` and its chunks, each decoded when it is reached.

    Raises `msgspec.DecodeError` (or `ValueError` for a bad frame or trailing
    bytes) for anything else, the head's at once, a chunk's when it is reached.
    """
    view = memoryview(data)
    head_end, head = _frame(view, 0)
    parsed = _head_decoder.decode(head)
    return parsed, _chunks(view, head_end, parsed.chunks)


def _frame(view: memoryview, at: int) -> tuple[int, memoryview]:
    """(end, bytes) of the length-prefixed frame at `at`."""
    start = at + _LENGTH
    if start > len(view):
        raise ValueError(f"a pod-volume part ends inside a frame length at byte {at}")
    end = start + int.from_bytes(view[at:start], "big")
    if end > len(view):
        raise ValueError(f"a pod-volume part's frame at byte {at} runs past its end")
    return end, view[start:end]


def _chunks(view: memoryview, at: int, count: int) -> Iterator[PodVolChunk]:
    for _ in range(count):
        at, frame = _frame(view, at)
        chunk = _chunk_decoder.decode(frame)
        del frame
        entries = chunk.entries
        for i in chunk.shared_errors:
            pv = entries[i]
            if pv.last_operation is not None:
                pv.last_error = pv.last_operation
        yield chunk
        del chunk, entries
    if at != len(view):
        raise ValueError(f"{len(view) - at} bytes after the last chunk of a pod-volume part")
