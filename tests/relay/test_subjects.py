"""Subject names and msg ids: the bus's public vocabulary."""

from __future__ import annotations

import pytest

from events.subjects import (
    EVENTS_WILDCARD,
    SubjectError,
    command_subject,
    events_subject,
    msg_id,
    node_events_filter,
    parse_msg_id,
    subject_covers,
)


def test_names() -> None:
    assert events_subject("n1", "DeviceMounted") == "volfsm.n1.events.DeviceMounted"
    assert command_subject("n1", "apply") == "volfsm.n1.cmd.apply"
    assert node_events_filter("n1") == "volfsm.n1.events.>"
    assert EVENTS_WILDCARD == "volfsm.*.events.>"
    assert msg_id("n1", 42) == "n1:42"


@pytest.mark.parametrize("bad", ["", "a.b", "a*", "a>", "a b", "a\tb", "a\nb", ">", "*"])
def test_node_must_be_one_token(bad: str) -> None:
    with pytest.raises(SubjectError):
        events_subject(bad, "DeviceMounted")
    with pytest.raises(SubjectError):
        command_subject(bad, "apply")


@pytest.mark.parametrize("node", ["n1", "node-7", "worker_3", "ip-10-0-0-1"])
def test_msg_id_round_trips(node: str) -> None:
    assert parse_msg_id(msg_id(node, 9001)) == (node, 9001)


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
