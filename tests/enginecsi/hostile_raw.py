"""The hostile driver of tests/csiplugin, plus replies that are not protobuf at all.

`RawHostileDriver.raw[rpc] = b"..."` makes the server answer that method
with those bytes as the serialized reply, so the caller's protobuf parser
gets garbage; a server interceptor swaps the method's serializer.
Everything else is `HostileDriver` (scripted behaviours, recorded calls).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from tests.csiplugin.hostile import HostileDriver, _Identity, _Node
from volfsm.csi.v1 import csi_pb2_grpc


class _RawReplies(grpc.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, drv: RawHostileDriver) -> None:
        self.drv = drv

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: Any
    ) -> Any:
        handler = continuation(handler_call_details)
        rpc = str(handler_call_details.method).rsplit("/", 1)[-1]
        raw = self.drv.raw.get(rpc)
        if handler is None or raw is None:
            return handler

        def answer(request: Any, context: Any) -> bytes:
            self.drv.answer(rpc, request, context, None)
            return raw

        return grpc.unary_unary_rpc_method_handler(
            answer,
            request_deserializer=handler.request_deserializer,
            response_serializer=lambda reply: reply,
        )


class RawHostileDriver(HostileDriver):
    """`HostileDriver` whose replies to the methods in `raw` are the given bytes."""

    def __init__(self, name: str = "csi.volfsm.dev") -> None:
        super().__init__(name)
        self.raw: dict[str, bytes] = {}

    def start(self) -> RawHostileDriver:
        """Serve on the socket, with the raw-reply interceptor in front of the servicers."""
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8), interceptors=[_RawReplies(self)]
        )
        csi_pb2_grpc.add_IdentityServicer_to_server(_Identity(self), server)
        csi_pb2_grpc.add_NodeServicer_to_server(_Node(self), server)
        server.add_insecure_port(self.endpoint)
        server.start()
        self._server = server
        return self
