"""Command decoding and replies, against a fake engine; and the NATS side against a real server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest

from volfsm.bus import NatsServer, free_port
from volfsm.desired.plan import ApplyResult as ObjectResult
from volfsm.engine import ApplyResult, EngineNotRunningError, PodStatus, VolumeStatus
from volfsm.engine.status import PodVolumeStatus
from volfsm.errors import InvalidObjectError
from volfsm.service import intake
from volfsm.service.intake import CommandIntake, CommandProcessor


class FakeEngine:
    """Answers like the engine: objects with kind 'Bad' are invalid, 'Boom' raise a bug."""

    def __init__(self) -> None:
        self.applied: list[Sequence[Mapping[str, Any]]] = []
        self.deleted: list[tuple[str | None, str | None, str | None]] = []
        self.running = True

    def _check(self) -> None:
        if not self.running:
            raise EngineNotRunningError("the volume engine is not running")

    async def apply(self, objects: Sequence[Mapping[str, Any]]) -> ApplyResult:
        self._check()
        for i, obj in enumerate(objects):
            if obj.get("kind") == "Bad":
                raise InvalidObjectError("kind", "unknown kind 'Bad'", f"objects[{i}]")
            if obj.get("kind") == "Boom":
                raise RuntimeError("a bug")
        self.applied.append(objects)
        return ApplyResult(objects=(ObjectResult("Pod", "default", "web", "created"),))

    async def delete_pod(
        self, uid: str | None = None, namespace: str | None = None, name: str | None = None
    ) -> bool:
        self._check()
        self.deleted.append((uid, namespace, name))
        return uid == "u1" or name == "web"

    def pods(self) -> list[PodStatus]:
        self._check()
        vol = PodVolumeStatus(name="data", volume_id="v", state="Mounted", desired=True)
        return [
            PodStatus(
                uid="u1", namespace="default", name="web", desired=True, phase="Mounted",
                volumes=(vol,),
            ),
            PodStatus(uid="u2", namespace="other", name="db", desired=True, phase="Pending"),
        ]  # fmt: skip

    def volumes(self) -> list[VolumeStatus]:
        self._check()
        return [VolumeStatus(volume_id="v", state="DeviceGloballyMounted", plugin="p")]

    async def delete_object(self, kind: str, namespace: str, name: str) -> bool:
        self._check()
        if name == "in-use":
            raise InvalidObjectError("", "in use by pod default/web", f"{kind} {name}")
        self.deleted.append((kind, namespace, name))
        return name == "app"

    def object_listing(self, what: str, namespace: str | None = None) -> list[dict[str, Any]]:
        self._check()
        return [{"kind": what, "namespace": namespace or "", "name": "app"}]


def processor(engine: FakeEngine, counts: list[tuple[str, str]] | None = None) -> CommandProcessor:
    return CommandProcessor(
        engine,
        "n1",
        max_bytes=4096,
        status=lambda: {"node": "n1", "publish_lag": 3},
        count=(lambda v, c: counts.append((v, c))) if counts is not None else None,
    )


async def ask(proc: CommandProcessor, verb: str, body: object | bytes) -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = json.loads(await proc.handle(verb, data))
    assert isinstance(reply, dict)
    return reply


def code(reply: dict[str, Any]) -> str:
    assert reply["ok"] is False, reply
    assert isinstance(reply["error"]["message"], str)
    return str(reply["error"]["code"])


@pytest.mark.parametrize(
    ("verb", "body", "expected"),
    [
        ("apply", b"{not json", intake.MALFORMED_JSON),
        ("apply", b"\xff\xfe", intake.MALFORMED_JSON),
        ("apply", {"objects": "Pod"}, intake.INVALID_REQUEST),
        ("apply", {"objects": [1]}, intake.INVALID_REQUEST),
        ("apply", {}, intake.INVALID_REQUEST),
        ("apply", [], intake.INVALID_REQUEST),
        ("apply", {"objects": [], "extra": 1}, intake.INVALID_REQUEST),
        ("delete", {"uid": 5}, intake.INVALID_REQUEST),
        ("delete", {}, intake.INVALID_REQUEST),
        ("delete", {"uid": ""}, intake.INVALID_REQUEST),
        ("delete", {"namespace": "default"}, intake.INVALID_REQUEST),
        ("delete", {"uid": "u1", "name": "web"}, intake.INVALID_REQUEST),
        ("get", {"what": "nodes"}, intake.INVALID_REQUEST),
        ("get", b"", intake.INVALID_REQUEST),
        ("get", {"what": "volumes", "name": "web"}, intake.INVALID_REQUEST),
        ("patch", {"objects": []}, intake.UNKNOWN_VERB),
        ("apply.now", {"objects": []}, intake.UNKNOWN_VERB),
        ("apply", {"objects": [{"kind": "Bad"}]}, intake.INVALID_OBJECT),
        ("delete", {"namespace": "default", "name": "nope"}, intake.NOT_FOUND),
        ("apply", {"objects": [{"kind": "Boom"}]}, intake.INTERNAL),
    ],
)
async def test_bad_commands_get_error_replies_and_change_nothing(
    verb: str, body: object, expected: str
) -> None:
    engine = FakeEngine()
    proc = processor(engine)
    assert code(await ask(proc, verb, body)) == expected
    assert engine.applied == []
    # ...and the next good command still works
    assert (await ask(proc, "get", {"what": "pods"}))["ok"] is True


async def test_error_messages_say_what_is_wrong() -> None:
    proc = processor(FakeEngine())
    reply = await ask(proc, "apply", {"objects": [{"kind": "Bad"}]})
    assert reply["error"]["message"] == "objects[0]: kind: unknown kind 'Bad'"
    reply = await ask(proc, "apply", {"objects": "Pod"})
    assert "apply: Expected `array`, got `str` - at `$.objects`" in reply["error"]["message"]
    reply = await ask(proc, "x" * 500, {})
    assert reply["error"]["message"].startswith("unknown command 'xxxxx")
    assert len(reply["error"]["message"]) < 200
    reply = await ask(proc, "apply", {"objects": [{"kind": "Boom"}]})
    assert reply["error"]["message"] == "RuntimeError: a bug"


async def test_oversized_payloads_are_refused_before_decoding() -> None:
    engine = FakeEngine()
    proc = processor(engine)
    big = b'{"objects": [' + b" " * 5000 + b"]}"
    reply = await ask(proc, "apply", big)
    assert code(reply) == intake.PAYLOAD_TOO_LARGE
    assert "5015 bytes is more than the 4096 bytes" in reply["error"]["message"]
    assert code(await ask(proc, "nope", b"x" * 5000)) == intake.PAYLOAD_TOO_LARGE


async def test_apply_delete_get_replies() -> None:
    engine = FakeEngine()
    counts: list[tuple[str, str]] = []
    proc = processor(engine, counts)

    reply = await ask(proc, "apply", {"objects": [{"kind": "Pod"}]})
    assert reply == {
        "ok": True,
        "results": [{"kind": "Pod", "namespace": "default", "name": "web", "action": "created"}],
        "skipped": [],
        "changed": False,
        "events": 0,
        "last_seq": None,
    }
    assert engine.applied == [[{"kind": "Pod"}]]

    assert await ask(proc, "delete", {"uid": "u1"}) == {"ok": True, "deleted": True}
    assert (await ask(proc, "delete", {"namespace": "default", "name": "web"}))["ok"] is True
    assert engine.deleted == [("u1", None, None), (None, "default", "web")]

    pods = await ask(proc, "get", {"what": "pods"})
    assert pods["what"] == "pods" and pods["node"] == "n1" and pods["publish_lag"] == 3
    assert [p["name"] for p in pods["items"]] == ["web", "db"]
    assert pods["items"][0]["volumes"][0]["state"] == "Mounted"
    one = await ask(proc, "get", {"what": "pods", "namespace": "other", "name": "db"})
    assert [p["uid"] for p in one["items"]] == ["u2"]
    by_uid = await ask(proc, "get", {"what": "pods", "uid": "u1"})
    assert [p["name"] for p in by_uid["items"]] == ["web"]
    vols = await ask(proc, "get", {"what": "volumes"})
    assert vols["items"] == [{"volume_id": "v", "state": "DeviceGloballyMounted", "plugin": "p"}]
    assert counts == [("apply", "ok"), ("delete", "ok"), ("delete", "ok")] + [("get", "ok")] * 4


async def test_draining_and_stopped_engines_answer_unavailable() -> None:
    engine = FakeEngine()
    proc = processor(engine)
    proc.accepting = False
    assert code(await ask(proc, "get", {"what": "pods"})) == intake.UNAVAILABLE
    proc.accepting = True
    engine.running = False
    assert code(await ask(proc, "apply", {"objects": []})) == intake.UNAVAILABLE


async def test_stored_objects_are_listed_and_deleted_by_kind() -> None:
    engine = FakeEngine()
    proc = processor(engine)
    listed = await ask(proc, "get", {"what": "configmaps", "namespace": "shop"})
    assert listed == {
        "ok": True,
        "what": "configmaps",
        "items": [{"kind": "configmaps", "namespace": "shop", "name": "app"}],
    }
    assert code(await ask(proc, "get", {"what": "secrets", "name": "x"})) == intake.INVALID_REQUEST
    body = {"kind": "ConfigMap", "namespace": "shop", "name": "app"}
    assert await ask(proc, "delete", body) == {"ok": True, "deleted": True}
    assert engine.deleted == [("ConfigMap", "shop", "app")]
    missing = await ask(proc, "delete", {**body, "name": "gone"})
    assert code(missing) == intake.NOT_FOUND
    assert missing["error"]["message"] == "ConfigMap shop/gone is not stored on node n1"
    in_use = await ask(proc, "delete", {"kind": "PersistentVolume", "name": "in-use"})
    assert code(in_use) == intake.INVALID_OBJECT
    assert code(await ask(proc, "delete", {"kind": "Deployment", "name": "x"})) == (
        intake.INVALID_REQUEST
    )


def test_verb_of() -> None:
    proc = processor(FakeEngine())
    assert proc.verb_of("volfsm.n1.cmd.apply") == "apply"
    assert proc.verb_of("volfsm.n1.cmd.a.b") == "a.b"


# ------------------------------------------------------------------ NATS


async def test_intake_answers_over_nats_and_stops_taking_commands(
    nats_server: NatsServer,
) -> None:
    proc = processor(FakeEngine())
    taken = CommandIntake(proc, nats_server.url, "n1")
    await taken.start()
    assert await taken.wait_subscribed(10)
    nc = await nats.connect(nats_server.url)
    try:
        reply = await nc.request("volfsm.n1.cmd.get", b'{"what": "pods"}', timeout=5)
        assert json.loads(reply.data)["ok"] is True
        reply = await nc.request("volfsm.n1.cmd.frobnicate.now", b"{}", timeout=5)
        assert json.loads(reply.data)["error"]["code"] == intake.UNKNOWN_VERB
        await nc.publish("volfsm.n1.cmd.apply", b'{"objects": []}')  # no reply subject
        reply = await nc.request("volfsm.n1.cmd.get", b'{"what": "volumes"}', timeout=5)
        assert json.loads(reply.data)["ok"] is True
        assert taken.connected

        await taken.stop_accepting()
        with pytest.raises(nats.errors.NoRespondersError):
            await nc.request("volfsm.n1.cmd.get", b'{"what": "pods"}', timeout=5)
    finally:
        await nc.close()
        await taken.close()


async def test_intake_connects_once_nats_comes_up(tmp_path: Path) -> None:
    port = free_port()
    server = NatsServer(tmp_path / "late-nats", port=port)
    taken = CommandIntake(processor(FakeEngine()), server.url, "n1", retry_s=0.05)
    try:
        await taken.start()
        assert not await taken.wait_subscribed(0.3)
        await asyncio.to_thread(server.start)
        assert await taken.wait_subscribed(30)
        nc = await nats.connect(server.url)
        try:
            reply = await nc.request("volfsm.n1.cmd.get", b'{"what": "pods"}', timeout=5)
            assert json.loads(reply.data)["ok"] is True
        finally:
            await nc.close()
    finally:
        await taken.close()
        server.stop()
