"""Subject names and msg ids: the bus's public vocabulary."""

from __future__ import annotations

import pytest

from events.subjects import (
    EVENTS_WILDCARD,
    SubjectError,
    command_subject,
    events_subject,
    msg_id,
    msg_key,
    node_events_filter,
    parse_msg_id,
    subject_covers,
)


def test_names() -> None:
    assert events_subject("n1", "DeviceMounted") == "volfsm.n1.events.DeviceMounted"
    assert command_subject("n1", "apply") == "volfsm.n1.cmd.apply"
    assert node_events_filter("n1") == "volfsm.n1.events.>"
    assert EVENTS_WILDCARD == "volfsm.*.events.>"
    assert msg_id("n1", 42) == "n1:42"  # the form before keys
    assert msg_id("n1", 42, "00112233aabbccdd") == "n1:42/00112233aabbccdd"


def test_msg_key_is_per_log_and_fixed() -> None:
    keys = {msg_key(f"log-{i}") for i in range(100)}
    assert len(keys) == 100 and all(len(k) == 16 for k in keys)
    assert msg_key("log-1") == msg_key("log-1") and msg_key("") == ""


@pytest.mark.parametrize("bad", ["", "a.b", "a*", "a>", "a b", "a\tb", "a\nb", ">", "*"])
def test_node_must_be_one_token(bad: str) -> None:
    with pytest.raises(SubjectError):
        events_subject(bad, "DeviceMounted")
    with pytest.raises(SubjectError):
        command_subject(bad, "apply")


@pytest.mark.parametrize("node", ["n1", "node-7", "worker_3", "ip-10-0-0-1"])
def test_msg_id_round_trips(node: str) -> None:
    assert parse_msg_id(msg_id(node, 9001)) == (node, 9001)
    assert parse_msg_id(msg_id(node, 9001, msg_key("a log"))) == (node, 9001)
    assert parse_msg_id(f"{node}/x:7") == (f"{node}/x", 7)  # '/' in a node name, no key


@pytest.mark.parametrize("bad", ["", "n1", "n1:", ":5", "n1:x", "n1:-3"])
def test_bad_msg_ids(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_msg_id(bad)


@pytest.mark.parametrize(
    ("outer", "inner", "covers"),
    [
        (EVENTS_WILDCARD, EVENTS_WILDCARD, True),
        ("volfsm.>", EVENTS_WILDCARD, True),
        (">", EVENTS_WILDCARD, True),
        ("volfsm.*.>", EVENTS_WILDCARD, True),
        ("volfsm.n1.events.>", EVENTS_WILDCARD, False),
        ("volfsm.*.events.*", EVENTS_WILDCARD, False),
        ("volfsm.*.cmd.>", EVENTS_WILDCARD, False),
        ("audit.>", EVENTS_WILDCARD, False),
        (EVENTS_WILDCARD, "volfsm.n1.events.DeviceMounted", True),
        (EVENTS_WILDCARD, "volfsm.n1.events", False),
    ],
)
def test_subject_covers(outer: str, inner: str, covers: bool) -> None:
    assert subject_covers(outer, inner) is covers
