"""The driver's own record of the calls it served: one JSON line per call start and end.

Enabled with ``--call-log FILE``. Each line is a JSON object::

    {"ts": 1764460800.123, "pid": 4711, "event": "start", "rpc": "NodeStageVolume",
     "volume_id": "vol1"}
    {"ts": 1764460800.456, "pid": 4711, "event": "end", "rpc": "NodeStageVolume",
     "volume_id": "vol1", "code": "OK", "seconds": 0.333}

``start`` is written when the call arrives (before its volume lock and any
injected fault), ``end`` when its answer is ready, with the gRPC code name.
A call that crashed the driver has a ``start`` and no ``end``. Lines are
appended with one ``write`` each (O_APPEND), so a restarted driver, which
has a new ``pid``, appends to the same file. No request field other than
the volume id is written, except that a NodePublishVolume start also has
``context_keys`` (the volume context's key names) and ``pod_info`` (the
values of the kubelet's pod keys, ``csi.storage.k8s.io/pod.*``,
``serviceAccount.name`` and ``ephemeral``): secrets and tokens cannot end
up here.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from loguru import logger

POD_INFO_KEYS = frozenset(
    {
        "csi.storage.k8s.io/pod.name",
        "csi.storage.k8s.io/pod.namespace",
        "csi.storage.k8s.io/pod.uid",
        "csi.storage.k8s.io/serviceAccount.name",
        "csi.storage.k8s.io/ephemeral",
    }
)
"""The kubelet's podInfoOnMount keys (never secret), written with their values."""


class CallJournal:
    """Appends call records to a file; does nothing without one."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._mutex = threading.Lock()
        self._pid = os.getpid()

    def started(self, rpc: str, volume_id: str, context: Mapping[str, str] | None = None) -> None:
        """A call arrived (with a NodePublish's volume context: its keys and pod info)."""
        fields: dict[str, object] = {"event": "start", "rpc": rpc, "volume_id": volume_id}
        if context is not None:
            fields["context_keys"] = sorted(context)
            fields["pod_info"] = {k: v for k, v in sorted(context.items()) if k in POD_INFO_KEYS}
        self._write(fields)

    def ended(self, rpc: str, volume_id: str, code: str, seconds: float) -> None:
        """A call is answered with `code` ("OK" or a gRPC code name)."""
        self._write(
            {
                "event": "end",
                "rpc": rpc,
                "volume_id": volume_id,
                "code": code,
                "seconds": round(seconds, 6),
            }
        )

    def _write(self, fields: dict[str, object]) -> None:
        if self._path is None:
            return
        line = json.dumps({"ts": round(time.time(), 6), "pid": self._pid, **fields}) + "\n"
        try:
            with self._mutex:
                fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
                try:
                    os.write(fd, line.encode())
                finally:
                    os.close(fd)
        except OSError as err:
            logger.warning("call log {}: {}", self._path, err)
