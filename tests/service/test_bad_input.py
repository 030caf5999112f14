"""Hypothesis-generated payloads on every command subject of a running service.

Every message gets a reply: an error (with a known code, never Internal)
that changed nothing desired, or a valid result. The service survives
all of it, drains cleanly, and the log it wrote validates.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from projections.validate import validate
from tests.service.conftest import MakeServe
from tests.service.helpers import NODE, SyncNats
from volfsm.service import intake

ERROR_CODES = {
    intake.MALFORMED_JSON,
    intake.INVALID_REQUEST,
    intake.UNKNOWN_VERB,
    intake.PAYLOAD_TOO_LARGE,
    intake.INVALID_OBJECT,
    intake.NOT_FOUND,
}
MAX_BYTES = 65536

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=16),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)
names = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True) | st.text(max_size=10)
uids = st.uuids().map(str) | names

volume_sources = st.one_of(
    st.fixed_dictionaries(
        {
            "emptyDir": st.one_of(
                st.just({}),
                st.fixed_dictionaries(
                    {"medium": st.sampled_from(["", "Memory", "Bogus"])},
                    optional={"sizeLimit": st.sampled_from(["1Mi", "16Mi", "-1", "lots"])},
                ),
            )
        }
    ),
    st.fixed_dictionaries({"persistentVolumeClaim": st.fixed_dictionaries({"claimName": names})}),
    st.fixed_dictionaries(
        {"csi": st.fixed_dictionaries({"driver": st.sampled_from(["csi.volfsm.dev", "nope"])})}
    ),
    st.dictionaries(st.text(max_size=8), json_values, max_size=2),
)
volumes = st.builds(lambda name, src: {"name": name, **src}, names, volume_sources)
pods = st.builds(
    lambda ns, name, uid, vols: {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "uid": uid},
        "spec": {"volumes": vols},
    },
    names,
    names,
    uids,
    st.lists(volumes, max_size=3) | json_values,
)
pvs = st.builds(
    lambda name, handle, size, mode: {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "volumeMode": mode,
            "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": "csi.volfsm.dev", "volumeHandle": handle},
        },
    },
    names,
    names,
    st.sampled_from(["1Gi", "64Mi", "0", "-5", "x"]) | json_values,
    st.sampled_from(["Filesystem", "Block", "Other"]),
)
pvcs = st.builds(
    lambda ns, name, volume: {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"volumeName": volume},
    },
    names,
    names,
    names,
)
objects = pods | pvs | pvcs | json_values
apply_bodies = st.fixed_dictionaries(
    {"objects": st.lists(objects, max_size=4)}
) | st.fixed_dictionaries({"objects": json_values})
delete_bodies = st.one_of(
    st.fixed_dictionaries({"uid": uids}),
    st.fixed_dictionaries({"namespace": names, "name": names}),
    st.fixed_dictionaries(
        {}, optional={"uid": uids | json_values, "namespace": names, "name": names | json_values}
    ),
)
get_bodies = st.fixed_dictionaries(
    {"what": st.sampled_from(["pods", "volumes", "nodes"]) | json_values},
    optional={"namespace": names, "name": names, "uid": uids},
)
bodies = (
    apply_bodies
    | delete_bodies
    | get_bodies
    | json_values
    | st.dictionaries(st.text(max_size=8), json_values, max_size=3)
)
payloads = (
    bodies.map(lambda b: json.dumps(b).encode())
    | st.binary(max_size=64)
    | bodies.map(lambda b: json.dumps(b).encode()[:-1])
)
verbs = st.sampled_from(["apply", "delete", "get"]) | st.from_regex(
    r"[A-Za-z0-9_-]{1,10}(\.[A-Za-z0-9_-]{1,6}){0,2}", fullmatch=True
)


def _encoded(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return strategy.map(lambda body: json.dumps(body).encode())


messages = st.one_of(
    st.tuples(st.just("apply"), _encoded(apply_bodies)),
    st.tuples(st.just("delete"), _encoded(delete_bodies)),
    st.tuples(st.just("get"), _encoded(get_bodies)),
    st.tuples(verbs, payloads),
)


def desired_uids(nc: SyncNats) -> set[str]:
    """UIDs of the pods the node wants now."""
    reply = json.loads(nc.request(f"volfsm.{NODE}.cmd.get", b'{"what": "pods"}'))
    assert reply["ok"] is True
    return {p["uid"] for p in reply["items"] if p["desired"]}


def check_reply(verb: str, reply: Any) -> bool:
    """The reply is well-formed; True if it is a success."""
    assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
    if not reply["ok"]:
        error = reply["error"]
        assert error["code"] in ERROR_CODES, reply
        assert isinstance(error["message"], str) and error["message"]
        return False
    assert verb in intake.VERBS, reply
    if verb == "apply":
        assert isinstance(reply["results"], list) and isinstance(reply["changed"], bool)
    elif verb == "delete":
        assert reply["deleted"] is True
    else:
        assert reply["what"] in ("pods", "volumes") and isinstance(reply["items"], list)
        assert isinstance(reply["publish_lag"], int)
    return True


def test_every_payload_on_every_subject_gets_an_error_or_a_valid_result(
    make_serve: MakeServe,
) -> None:
    svc = make_serve(args=["--max-command-bytes", str(MAX_BYTES)]).start()
    nc = SyncNats(svc.url)
    seen: dict[str, int] = {}
    try:

        @settings(
            max_examples=250,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(message=messages)
        @example(message=("apply", b'{"objects": [}'))
        @example(message=("apply", b'{"objects": "Pod"}'))
        @example(message=("frobnicate", b"{}"))
        @example(message=("apply", b'{"objects": [{"kind": "Pod"}]}'))
        @example(message=("get", b'{"what": "volumes"}'))
        def one_message(message: tuple[str, bytes]) -> None:
            verb, payload = message
            before = desired_uids(nc)
            reply = json.loads(nc.request(f"volfsm.{NODE}.cmd.{verb}", payload))
            ok = check_reply(verb, reply)
            key = "ok" if ok else reply["error"]["code"]
            seen[key] = seen.get(key, 0) + 1
            if not ok:
                assert desired_uids(nc) == before, f"{verb} {payload[:200]!r} changed the DSW"

        one_message()

        # Oversized, on every subject: refused before decoding
        for verb in ("apply", "delete", "get", "nope"):
            big = b'{"objects": [' + b" " * MAX_BYTES + b"]}"
            reply = json.loads(nc.request(f"volfsm.{NODE}.cmd.{verb}", big))
            assert reply["error"]["code"] == intake.PAYLOAD_TOO_LARGE

        # Still serving
        desired_uids(nc)
    finally:
        nc.close()
    assert {
        "ok",
        intake.MALFORMED_JSON,
        intake.INVALID_REQUEST,
        intake.UNKNOWN_VERB,
        intake.INVALID_OBJECT,
    } <= set(seen), seen
    assert svc.stop() == 0, svc.stderr_tail()
    log = svc.open_log()
    try:
        report = validate(log.read_after(0))
    finally:
        log.close()
    assert report.ok, str(report.violation)
