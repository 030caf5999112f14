"""Running one RPC: log it (secrets redacted), lock its volume, inject faults, map errors."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from loguru import logger

from volfsm.csi.v1 import csi_pb2
from volfsm.csidriver.errors import CsiError
from volfsm.csidriver.faults import FaultInjector, abnormal_condition
from volfsm.csidriver.journal import CallJournal
from volfsm.csidriver.locks import VolumeLocks

T = TypeVar("T")


def _strip_secrets(msg: Message) -> None:
    for fd, value in msg.ListFields():
        options: Any = fd.GetOptions()
        if options.Extensions[csi_pb2.csi_secret]:
            msg.ClearField(fd.name)
        elif fd.message_type is not None and not fd.message_type.GetOptions().map_entry:
            items = value if fd.is_repeated else [value]
            for item in items:
                _strip_secrets(item)


def redact(msg: Message) -> dict[str, Any]:
    """The message as a dict without any field marked ``csi_secret``."""
    copy = type(msg)()
    copy.CopyFrom(msg)
    _strip_secrets(copy)
    return MessageToDict(copy, preserving_proto_field_name=True)


class CallRunner:
    """Wraps every servicer method with the driver's common behaviour."""

    def __init__(
        self, locks: VolumeLocks, faults: FaultInjector, journal: CallJournal | None = None
    ) -> None:
        self._locks = locks
        self._faults = faults
        self._journal = journal or CallJournal(None)

    def run(
        self,
        rpc: str,
        request: Message,
        context: Any,
        work: Callable[[], T],
        *,
        volume_id: str = "",
        lock: bool = False,
        key_field: str = "volume_id",
    ) -> T:
        """Run work() for an RPC; turn a CsiError into the gRPC status of the reply.

        With lock=True the call holds volume_id (ABORTED if another call does), and
        an empty volume_id is INVALID_ARGUMENT (reported as a missing key_field).
        """
        started = time.monotonic()
        logger.debug("{} request {}", rpc, redact(request))
        context_of = (
            getattr(request, "volume_context", None) if rpc == "NodePublishVolume" else None
        )
        self._journal.started(rpc, volume_id, dict(context_of) if context_of is not None else None)
        try:
            if lock and not volume_id:
                raise CsiError(grpc.StatusCode.INVALID_ARGUMENT, f"{key_field} is required")
            result = self._run(rpc, context, work, volume_id, lock)
        except CsiError as err:
            failure = (err.code, err.message)
        except Exception as err:
            logger.exception("{} volume={} failed unexpectedly", rpc, volume_id or "-")
            failure = (grpc.StatusCode.INTERNAL, f"{rpc}: {type(err).__name__}: {err}")
        else:
            took = time.monotonic() - started
            logger.info("{} volume={} ok in {:.3f}s", rpc, volume_id or "-", took)
            self._journal.ended(rpc, volume_id, "OK", took)
            return result
        code, message = failure
        self._journal.ended(rpc, volume_id, code.name, time.monotonic() - started)
        logger.info(
            "{} volume={} -> {} {} in {:.3f}s",
            rpc,
            volume_id or "-",
            code.name,
            message,
            time.monotonic() - started,
        )
        context.abort(code, message)
        raise AssertionError("context.abort returned")

    def _run(self, rpc: str, context: Any, work: Callable[[], T], volume_id: str, lock: bool) -> T:
        if not lock:
            return self._with_faults(rpc, context, work, volume_id)
        with self._locks.hold(volume_id, rpc):
            return self._with_faults(rpc, context, work, volume_id)

    def _with_faults(self, rpc: str, context: Any, work: Callable[[], T], volume_id: str) -> T:
        before = self._faults.pick(rpc, volume_id, "before")
        if before is not None:
            self._faults.apply(before, rpc, context.is_active)
        result = work()
        after = self._faults.pick(rpc, volume_id, "after")
        if after is not None:
            self._faults.apply(after, rpc, context.is_active)
        abnormal_condition(before, rpc, result)
        abnormal_condition(after, rpc, result)
        return result
