"""Per-volume locks: a second call for a volume that is busy gets ABORTED, never waits."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from volfsm.csidriver.errors import CsiError


class VolumeLocks:
    """The set of volume ids with a call in flight."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._busy: dict[str, str] = {}

    @contextmanager
    def hold(self, volume_id: str, rpc: str) -> Iterator[None]:
        """Hold the volume for the duration of the block, or raise ABORTED if it is held."""
        with self._mutex:
            holder = self._busy.get(volume_id)
            if holder is not None:
                raise CsiError(
                    grpc.StatusCode.ABORTED,
                    f"an operation ({holder}) is already pending for volume {volume_id}",
                )
            self._busy[volume_id] = rpc
        try:
            yield
        finally:
            with self._mutex:
                del self._busy[volume_id]
