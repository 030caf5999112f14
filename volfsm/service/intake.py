"""Commands over NATS request/reply: `volfsm.<node>.cmd.<verb>`, JSON in, JSON out.

Verbs and their request bodies (decoded with msgspec; unknown fields are
refused):

* `apply`  `{"objects": [<Pod|PersistentVolume|PersistentVolumeClaim|ConfigMap|Secret|
  ServiceAccount|ClusterTrustBundle|CSIDriver>, ...]}`;
  with `"complete": true` the objects are the node's whole desired state:
  pods not among them are deleted (in the same commit) and the desired
  state is declared complete, so unmounts may start (`apply --complete`).
  The reply lists each object (with its uid; a pod accepted but pending,
  `waiting` on a claim or PV not there yet, with what it waits for) and,
  under `skipped`, the objects of kinds a node does not run (not applied)
* `delete` `{"uid": "..."}` or `{"namespace": "...", "name": "..."}` (a pod),
  or `{"kind": "ConfigMap", "namespace": "...", "name": "..."}` (a stored object)
* `get`    `{"what": "pods"|"volumes"}`, optionally filtered by `uid` or
  `namespace` + `name` (pods only); or a stored kind (`configmaps`,
  `secrets`, `persistentvolumes`, ...: `volfsm.objects.LISTS`), optionally
  by `namespace`; never a Secret's values

Every reply is `{"ok": true, ...}` or
`{"ok": false, "error": {"code": "...", "message": "..."}}`. A bad message
(malformed JSON, wrong types, an unknown verb, too many bytes, an invalid
object) gets an error reply and changes nothing; no message can stop the
service: `CommandProcessor.handle` catches everything and answers.

`CommandProcessor` is the pure part (bytes in, bytes out, against an
engine); `CommandIntake` is its NATS connection, which reconnects forever.

A command is a request: a message without a reply subject, or whose reply
subject is JetStream's (`$JS.`...), is not run. That is how a JetStream
push consumer delivers stored messages, to any subject its creator names,
whatever that creator may publish: without this rule a credential allowed
to create a consumer could replay a crafted message it stored on its own
subjects as a command to this node.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

import msgspec
import nats
import nats.errors
from loguru import logger
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from events.subjects import PREFIX, command_wildcard
from volfsm.bus.connect import split_servers
from volfsm.desired.objects import KINDS
from volfsm.engine import ApplyResult, EngineNotRunningError, PodStatus, VolumeStatus
from volfsm.errors import InvalidObjectError
from volfsm.objects import LISTS

VERBS = ("apply", "delete", "get")
JETSTREAM_REPLY_PREFIX = "$JS."
"""Reply subjects of JetStream deliveries (acks, flow control): such a message is no request."""

# Error codes of `{"ok": false, "error": {"code": ...}}`.
MALFORMED_JSON = "MalformedJson"
INVALID_REQUEST = "InvalidRequest"
UNKNOWN_VERB = "UnknownVerb"
PAYLOAD_TOO_LARGE = "PayloadTooLarge"
INVALID_OBJECT = "InvalidObject"
NOT_FOUND = "NotFound"
UNAVAILABLE = "Unavailable"
INTERNAL = "Internal"


# ------------------------------------------------------------------ schemas


class ApplyRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of `apply`: Kubernetes-shaped objects, applied all or nothing.

    `complete`: the objects are all the node should have; pods not named
    are deleted and the desired state is declared complete.
    """

    objects: list[dict[str, Any]]
    complete: bool = False


class DeleteRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of `delete`: a pod by uid, or by namespace and name; or a stored object by kind."""

    kind: str = "Pod"
    uid: str | None = None
    namespace: str | None = None
    name: str | None = None


class GetRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of `get`: what to list, optionally one pod."""

    what: Literal[
        "pods",
        "volumes",
        "configmaps",
        "secrets",
        "persistentvolumes",
        "persistentvolumeclaims",
        "csidrivers",
        "serviceaccounts",
        "clustertrustbundles",
    ]
    uid: str | None = None
    namespace: str | None = None
    name: str | None = None


class ErrorBody(msgspec.Struct):
    """Why a command failed."""

    code: str
    message: str


class ErrorReply(msgspec.Struct):
    """`{"ok": false, "error": {...}}`."""

    error: ErrorBody
    ok: bool = False


class CommandError(Exception):
    """A command refused with an error code; the reply carries both."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_encoder = msgspec.json.Encoder()
_decoders: dict[str, msgspec.json.Decoder[Any]] = {
    "apply": msgspec.json.Decoder(ApplyRequest),
    "delete": msgspec.json.Decoder(DeleteRequest),
    "get": msgspec.json.Decoder(GetRequest),
}


def error_reply(code: str, message: str) -> bytes:
    """The encoded error reply."""
    return _encoder.encode(ErrorReply(ErrorBody(code, message)))


def ok_reply(fields: Mapping[str, Any]) -> bytes:
    """The encoded success reply: `{"ok": true, **fields}`."""
    return _encoder.encode({"ok": True, **fields})


# ------------------------------------------------------------------ engine


class CommandEngine(Protocol):
    """What commands need of the volume engine (`VolumeEngine` has it)."""

    async def apply(
        self, objects: Sequence[Mapping[str, Any]], *, complete: bool = False
    ) -> ApplyResult:
        """Validate and apply objects, all or nothing (`complete`: the whole desired state)."""

    async def delete_pod(
        self, uid: str | None = None, namespace: str | None = None, name: str | None = None
    ) -> bool:
        """Remove a pod from the desired state; False if there is none."""

    async def delete_object(self, kind: str, namespace: str, name: str) -> bool:
        """Delete a stored object other than a Pod; False if there is none."""

    def object_listing(self, what: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """The stored objects `get <what>` lists."""

    def pods(self) -> list[PodStatus]:
        """Status of every pod the engine knows."""

    def volumes(self) -> list[VolumeStatus]:
        """Status of every volume the engine knows."""


StatusFn = Callable[[], dict[str, Any]]
CountFn = Callable[[str, str], None]


def _decode(verb: str, data: bytes) -> Any:
    try:
        return _decoders[verb].decode(data or b"{}")
    except msgspec.ValidationError as exc:
        raise CommandError(INVALID_REQUEST, f"{verb}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise CommandError(MALFORMED_JSON, f"{verb}: not valid JSON: {exc}") from None


class CommandProcessor:
    """Decodes, runs and answers one command at a time; never raises."""

    def __init__(
        self,
        engine: CommandEngine,
        node: str,
        *,
        max_bytes: int,
        status: StatusFn | None = None,
        count: CountFn | None = None,
    ) -> None:
        self.engine = engine
        self.node = node
        self.max_bytes = max_bytes
        self.status = status or dict
        self.count = count
        self.accepting = True
        """False while draining: commands are answered `Unavailable`."""
        self._prefix = f"{PREFIX}.{node}.cmd."

    def verb_of(self, subject: str) -> str:
        """The verb part of a command subject (everything after `volfsm.<node>.cmd.`)."""
        return subject[len(self._prefix) :] if subject.startswith(self._prefix) else subject

    async def handle(self, verb: str, data: bytes) -> bytes:
        """The reply to one command (an error reply for anything that goes wrong)."""
        label = verb if verb in VERBS else "unknown"
        log = logger.bind(verb=verb[:64])
        try:
            reply = await self._run(verb, data)
        except CommandError as exc:
            log.info("command {} refused: {}: {}", label, exc.code, exc.message)
            self._count(label, exc.code)
            return error_reply(exc.code, exc.message)
        except Exception as exc:
            log.exception("command {} failed", label)
            self._count(label, INTERNAL)
            return error_reply(INTERNAL, f"{type(exc).__name__}: {exc}")
        self._count(label, "ok")
        return reply

    def _count(self, verb: str, code: str) -> None:
        if self.count is not None:
            with contextlib.suppress(Exception):
                self.count(verb, code)

    async def _run(self, verb: str, data: bytes) -> bytes:
        if len(data) > self.max_bytes:
            raise CommandError(
                PAYLOAD_TOO_LARGE,
                f"{len(data)} bytes is more than the {self.max_bytes} bytes a command may have",
            )
        if verb not in VERBS:
            shown = verb if len(verb) <= 64 else verb[:64] + "..."
            raise CommandError(
                UNKNOWN_VERB, f"unknown command {shown!r}; known: {', '.join(VERBS)}"
            )
        request = _decode(verb, data)
        if not self.accepting:
            raise CommandError(UNAVAILABLE, f"node {self.node} is shutting down")
        try:
            if isinstance(request, ApplyRequest):
                return await self._apply(request)
            if isinstance(request, DeleteRequest):
                return await self._delete(request)
            assert isinstance(request, GetRequest)
            return self._get(request)
        except EngineNotRunningError as exc:
            raise CommandError(UNAVAILABLE, str(exc)) from None

    async def _apply(self, req: ApplyRequest) -> bytes:
        try:
            if req.complete:
                result = await self.engine.apply(req.objects, complete=True)
            else:
                result = await self.engine.apply(req.objects)
        except InvalidObjectError as exc:
            raise CommandError(INVALID_OBJECT, str(exc)) from None
        results = [
            {"kind": r.kind, "namespace": r.namespace, "name": r.name, "action": r.action}
            | ({"uid": r.uid} if r.uid else {})
            | ({"waiting": r.waiting} if r.waiting else {})
            | ({"note": r.note} if r.note else {})
            for r in result.objects
        ]
        last_seq = result.events[-1].seq if result.events else None
        reply: dict[str, Any] = {
            "results": results,
            "skipped": [
                {
                    "kind": s.kind,
                    "apiVersion": s.api_version,
                    "namespace": s.namespace,
                    "name": s.name,
                    "message": str(s),
                }
                for s in result.skipped
            ],
            "changed": result.changed,
            "events": len(result.events),
            "last_seq": last_seq,
        }
        if req.complete:
            reply["deleted"] = [
                {"uid": uid, "namespace": ns, "name": name} for uid, ns, name in result.deleted
            ]
            reply["desired_complete"] = True
        return ok_reply(reply)

    async def _delete(self, req: DeleteRequest) -> bytes:
        if req.kind != "Pod":
            return await self._delete_object(req)
        if req.uid is not None:
            if req.namespace is not None or req.name is not None:
                raise CommandError(INVALID_REQUEST, "delete: give uid, or namespace and name")
            if not req.uid:
                raise CommandError(INVALID_REQUEST, "delete: uid must not be empty")
            what = f"pod uid {req.uid}"
            deleted = await self.engine.delete_pod(uid=req.uid)
        else:
            if not req.namespace or not req.name:
                raise CommandError(
                    INVALID_REQUEST, "delete: give uid, or namespace and name (both non-empty)"
                )
            what = f"pod {req.namespace}/{req.name}"
            deleted = await self.engine.delete_pod(namespace=req.namespace, name=req.name)
        if not deleted:
            raise CommandError(NOT_FOUND, f"{what} is not in the desired state of node {self.node}")
        return ok_reply({"deleted": True})

    async def _delete_object(self, req: DeleteRequest) -> bytes:
        if req.kind not in KINDS or req.uid is not None or not req.name:
            raise CommandError(
                INVALID_REQUEST,
                f"delete: give a kind ({', '.join(KINDS)}), a name and (namespaced kinds) "
                "a namespace",
            )
        try:
            deleted = await self.engine.delete_object(req.kind, req.namespace or "", req.name)
        except InvalidObjectError as exc:
            raise CommandError(INVALID_OBJECT, str(exc)) from None
        if not deleted:
            where = f"{req.namespace or 'default'}/{req.name}" if req.namespace else req.name
            raise CommandError(NOT_FOUND, f"{req.kind} {where} is not stored on node {self.node}")
        return ok_reply({"deleted": True})

    def _get(self, req: GetRequest) -> bytes:
        status = self.status()
        if req.what in LISTS:
            if req.uid is not None or req.name is not None:
                raise CommandError(INVALID_REQUEST, f"get {req.what}: filter by namespace only")
            items = self.engine.object_listing(req.what, req.namespace)
            return ok_reply({"what": req.what, "items": items})
        if req.what == "volumes":
            if req.uid is not None or req.namespace is not None or req.name is not None:
                raise CommandError(INVALID_REQUEST, "get: uid/namespace/name filter pods only")
            return ok_reply({"what": "volumes", "items": self.engine.volumes(), **status})
        pods = self.engine.pods()
        if req.uid is not None:
            pods = [p for p in pods if p.uid == req.uid]
        if req.namespace is not None:
            pods = [p for p in pods if p.namespace == req.namespace]
        if req.name is not None:
            pods = [p for p in pods if p.name == req.name]
        return ok_reply({"what": "pods", "items": pods, **status})


# -------------------------------------------------------------------- NATS


class CommandIntake:
    """Subscribes to `volfsm.<node>.cmd.>` and answers each request with the processor.

    The first connection is retried in the background until it succeeds
    (NATS being down at start is not fatal); after that nats-py reconnects
    by itself, forever, and re-subscribes.
    """

    def __init__(
        self,
        processor: CommandProcessor,
        url: str,
        node: str,
        *,
        connect_options: Mapping[str, Any] | None = None,
        retry_s: float = 1.0,
    ) -> None:
        self.processor = processor
        self.url = url
        self.node = node
        self.subject = command_wildcard(node)
        self.connect_options = dict(connect_options or {})
        self.retry_s = retry_s
        self._nc: NATS | None = None
        self._sub: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        self._closing = False
        self._log = logger.bind(component="commands")

    @property
    def connected(self) -> bool:
        """True while subscribed on a live connection."""
        nc = self._nc
        return nc is not None and nc.is_connected and self._sub is not None

    async def start(self) -> None:
        """Start connecting and subscribing (in the background)."""
        if self._task is None:
            self._task = asyncio.create_task(self._connect_loop(), name="volfsm-commands")

    async def wait_subscribed(self, timeout: float) -> bool:
        """Wait until the subscription is live; False on timeout."""
        try:
            await asyncio.wait_for(self._subscribed.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _connect_loop(self) -> None:
        delay = self.retry_s
        while True:
            try:
                nc = await nats.connect(
                    servers=split_servers(self.url),
                    name=f"volfsm-{self.node}-commands",
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=1,
                    connect_timeout=2,
                    error_cb=self._on_error,
                    disconnected_cb=self._on_disconnected,
                    reconnected_cb=self._on_reconnected,
                    **self.connect_options,
                )
            except Exception as exc:
                self._log.warning("command intake cannot connect to {}: {}", self.url, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            self._nc = nc
            self._sub = await nc.subscribe(self.subject, cb=self._on_msg)
            self._subscribed.set()
            self._log.info("taking commands on {} at {}", self.subject, self.url)
            return

    async def _on_error(self, exc: Exception) -> None:
        self._log.warning("command intake NATS error: {}", exc)

    async def _on_disconnected(self) -> None:
        if self._closing:  # our own close: not worth a warning at every drain
            self._log.debug("command intake disconnected from NATS (closing)")
            return
        self._log.warning("command intake disconnected from NATS; reconnecting")

    async def _on_reconnected(self) -> None:
        self._log.info("command intake reconnected to NATS")

    async def _on_msg(self, msg: Msg) -> None:
        try:
            verb = self.processor.verb_of(msg.subject)
            if not msg.reply or msg.reply.startswith(JETSTREAM_REPLY_PREFIX):
                self._log.warning(
                    "ignored a message on {} that is not a request (reply subject {!r}): commands"
                    " must be sent with a reply subject",
                    msg.subject[:200],
                    msg.reply[:200],
                )
                return
            reply = await self.processor.handle(verb, msg.data)
            await msg.respond(reply)
        except Exception:
            self._log.exception("could not answer a command on {}", msg.subject[:200])

    async def stop_accepting(self, timeout: float = 5.0) -> None:
        """Stop taking commands: unsubscribe, answering what was already received."""
        self._closing = True
        self.processor.accepting = False
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                # drain: answer what was received, then unsubscribe (nats-py leaves it untyped)
                await asyncio.wait_for(sub.drain(), timeout)  # type: ignore[no-untyped-call]
            except Exception as exc:
                self._log.warning("command subscription did not drain: {}", exc)
            nc = self._nc
            if nc is not None and nc.is_connected:
                # a round trip: the server has dropped our interest once this returns
                with contextlib.suppress(Exception):
                    await nc.flush(timeout=int(max(1, timeout)))

    async def close(self) -> None:
        """Close the connection (after `stop_accepting`)."""
        await self.stop_accepting()
        nc, self._nc = self._nc, None
        if nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 5.0)
