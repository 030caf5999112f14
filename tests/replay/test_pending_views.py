"""Pods that wait for their claims in the offline views: state, timeline, diff and replay.

Two logs: the recorded incident, where shop/cart-0 waits for its claim (03:11:32), then for
the claim's PV (03:11:35), and is resolved (PodAdded, 03:11:38) and mounted; and a small log
written here, where shop/orphan-0 waits and is deleted while pending and shop/late-0 is
still waiting when the log ends.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from events.log import EventLog
from events.streams import pod_stream
from events.types import Body, PendingVolume, PodPending, PodRemoved
from projections.textfmt import iso_time
from projections.validate import validate
from tests.replay.conftest import run_ok
from volfsm.engine.handler import CommandHandler

CART_UID = "d5b8e2a4-9f1c-4a7e-b3d6-0c2f8e1a7b59"
CART_PV = "pvc-e4c71b2d-8a3f-4d5e-9b06-7f2a1c8d3e65"
NO_PV = (
    f"PersistentVolume {CART_PV}: not found yet (PersistentVolumeClaim shop/cart-data is "
    "bound to it)"
)
ORPHAN_UID = "0e1d2c3b-4a59-4687-9a6b-5c4d3e2f1a00"
LATE_UID = "1f2e3d4c-5b6a-4798-8b7c-6d5e4f3a2b11"
T0 = 1_714_600_000_000_000  # 2024-05-01T21:46:40Z
S = 1_000_000


def _claim(name: str, reason: str) -> PendingVolume:
    return PendingVolume(name="data", waits_for=f"PersistentVolumeClaim shop/{name}", reason=reason)


class _Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture(scope="module")
def waits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """orphan-0 pending at +0 s (no claim), +5 s (claim not bound), deleted at +9 s;
    late-0 pending from +3 s to the end (+9 s)."""
    path = tmp_path_factory.mktemp("waits") / "volfsm.db"
    clock = _Clock()
    steps: list[tuple[float, str, Body]] = [
        (0, ORPHAN_UID, _pending("orphan-0", ORPHAN_UID, _claim("orphan-data", "not found yet"))),
        (3, LATE_UID, _pending("late-0", LATE_UID, _claim("late-data", "not found yet"))),
        (
            5,
            ORPHAN_UID,
            _pending(
                "orphan-0",
                ORPHAN_UID,
                _claim("orphan-data", "not bound yet (spec.volumeName is empty)"),
            ),
        ),
        (9, ORPHAN_UID, PodRemoved(pod_uid=ORPHAN_UID, namespace="shop", name="orphan-0")),
    ]
    with EventLog(path, node="node-w", clock=clock) as log:
        handler = CommandHandler(log)
        for seconds, uid, body in steps:
            clock.now = T0 + round(seconds * S)
            handler.record(pod_stream(uid), [body])
        assert validate(log.read_after(0)).ok
    return path


def _pending(name: str, uid: str, *waiting: PendingVolume) -> PodPending:
    return PodPending(pod_uid=uid, namespace="shop", name=name, waiting=waiting)


def _json(runner: CliRunner, args: list[str]) -> Any:
    return json.loads(run_ok(runner, [*args, "-o", "json"]))


def _at(seconds: float) -> str:
    return iso_time(T0 + round(seconds * S))


# ---------------------------------------------------------------------- state


def test_state_lists_a_pending_pod_with_since_and_what_it_waits_for(
    runner: CliRunner, incident: Path
) -> None:
    args = ["state", "--db", str(incident), "--at", "2024-05-01T03:11:36Z"]
    doc = _json(runner, args)
    [cart] = doc["pending_pods"]
    assert (cart["name"], cart["pod_uid"], cart["since"]) == (
        "cart-0",
        CART_UID,
        "2024-05-01T03:11:32.000Z",
    )
    assert cart["outcome"] == "pending" and cart["duration_us"] == 4 * S  # measured to --at
    assert [w["text"] for w in cart["waiting"]] == [NO_PV]
    assert [len(s["waiting"]) for s in cart["steps"]] == [1, 1]
    assert CART_UID not in {p["pod_uid"] for p in doc["desired_pods"]}
    out = run_ok(runner, args)
    table = out[out.index("Pending pods") :].splitlines()
    assert "PENDING SINCE" in table[1] and "WAITING FOR" in table[1]
    assert table[2].split()[:4] == [CART_UID, "shop/cart-0", "2024-05-01T03:11:32.000Z", "4.000s"]
    assert table[2].endswith(f"volume data: {NO_PV}")


def test_state_after_the_pod_resolved_or_was_deleted_has_no_pending_pod(
    runner: CliRunner, incident: Path, waits: Path
) -> None:
    end = _json(runner, ["state", "--db", str(incident)])
    assert end["pending_pods"] == []
    assert CART_UID in {p["pod_uid"] for p in end["desired_pods"]}
    assert "Pending pods" not in run_ok(runner, ["state", "--db", str(incident)])
    doc = _json(runner, ["state", "--db", str(waits)])
    assert [(p["name"], p["since"]) for p in doc["pending_pods"]] == [("late-0", _at(3))]
    before = _json(runner, ["state", "--db", str(waits), "--at", _at(6)])
    pods = {p["name"]: p for p in before["pending_pods"]}
    assert set(pods) == {"late-0", "orphan-0"}
    assert pods["orphan-0"]["since"] == _at(0)  # since the wait began, not its latest reason
    assert pods["orphan-0"]["waiting"][0]["reason"] == "not bound yet (spec.volumeName is empty)"


# ------------------------------------------------------------------- timeline


def test_timeline_shows_each_wait_and_its_resolution(runner: CliRunner, incident: Path) -> None:
    args = ["timeline", "--db", str(incident), "--pod", "shop/cart-0"]
    doc = _json(runner, args)
    [wait] = doc["pending"]
    assert (wait["outcome"], wait["since"], wait["ended"], wait["duration_us"]) == (
        "resolved",
        "2024-05-01T03:11:32.000Z",
        "2024-05-01T03:11:38.000Z",
        6 * S,
    )
    assert [s["time"] for s in wait["steps"]] == [
        "2024-05-01T03:11:32.000Z",
        "2024-05-01T03:11:35.000Z",
    ]
    rows = run_ok(runner, args).split("Pending pods")[1].splitlines()[2:]
    assert [r.split()[1:4] for r in rows] == [
        ["2024-05-01T03:11:32.000Z", "2024-05-01T03:11:35.000Z", "3.000s"],
        ["2024-05-01T03:11:35.000Z", "2024-05-01T03:11:38.000Z", "3.000s"],
    ]
    assert "PersistentVolumeClaim shop/cart-data: not found yet" in rows[0]
    assert rows[0].endswith("waits for something else")
    assert rows[1].endswith(f"{NO_PV}  resolved (PodAdded, seq 73)")


def test_timeline_shows_a_pod_deleted_while_pending_and_one_still_waiting(
    runner: CliRunner, waits: Path
) -> None:
    doc = _json(runner, ["timeline", "--db", str(waits)])
    assert doc["timelines"] == []  # nothing was ever mounted
    got = {w["name"]: w for w in doc["pending"]}
    assert (got["orphan-0"]["outcome"], got["orphan-0"]["duration_us"]) == ("deleted", 9 * S)
    assert (got["late-0"]["outcome"], got["late-0"]["ended"], got["late-0"]["duration_us"]) == (
        "pending",
        None,
        6 * S,  # open: measured to the end of the log
    )
    out = run_ok(runner, ["timeline", "--db", str(waits), "--pod", "shop/orphan-0"])
    rows = out.split("Pending pods")[1].splitlines()[2:]
    assert len(rows) == 2
    assert rows[1].endswith("deleted while pending (PodRemoved, seq 4)")
    assert "late-0" not in out
    later = _json(runner, ["timeline", "--db", str(waits), "--since", _at(9.5)])
    assert [w["name"] for w in later["pending"]] == ["late-0"]
    assert _json(runner, ["timeline", "--db", str(waits), "--until", _at(2)])["pending"] == [
        {**got["orphan-0"], "outcome": "pending", "ended_seq": None, "ended_us": None}
        | {"ended": None, "duration_us": 2 * S, "steps": got["orphan-0"]["steps"][:1]}
        | {"waiting": got["orphan-0"]["steps"][0]["waiting"]}
    ]


# ----------------------------------------------------------------------- diff


def test_diff_says_a_pending_pod_was_resolved(runner: CliRunner, incident: Path) -> None:
    base = ["diff", "--db", str(incident)]
    doc = _json(
        runner, [*base, "--since", "2024-05-01T03:11:33Z", "--until", "2024-05-01T03:11:45Z"]
    )
    [cart] = doc["pods"]
    assert (cart["change"], cart["pod"], cart["volumes"]) == (
        "resolved",
        "shop/cart-0",
        [f"data={CART_PV}"],
    )
    assert cart["details"] == [
        "pending since 2024-05-01T03:11:32.000Z, resolved at 2024-05-01T03:11:38.000Z after "
        f"6.000s: data waits for {NO_PV}"
    ]
    doc = _json(
        runner, [*base, "--since", "2024-05-01T03:11:25Z", "--until", "2024-05-01T03:11:36Z"]
    )
    [cart] = doc["pods"]
    assert (cart["change"], cart["volumes"]) == ("pending", ["data (waiting)"])
    assert cart["details"] == [f"waiting since 2024-05-01T03:11:32.000Z: data waits for {NO_PV}"]
    still = _json(
        runner, [*base, "--since", "2024-05-01T03:11:33Z", "--until", "2024-05-01T03:11:36Z"]
    )
    assert [(p["change"], p["details"]) for p in still["pods"]] == [
        ("pending", [f"still waiting since 2024-05-01T03:11:32.000Z: data waits for {NO_PV}"])
    ]
    quiet = _json(
        runner, [*base, "--since", "2024-05-01T03:11:36Z", "--until", "2024-05-01T03:11:37Z"]
    )
    assert quiet["pods"] == []  # waiting at both ends for the same thing: no change


def test_diff_says_a_pod_was_deleted_while_pending(runner: CliRunner, waits: Path) -> None:
    doc = _json(runner, ["diff", "--db", str(waits), "--since", _at(1)])
    pods = {p["pod"]: p for p in doc["pods"]}
    assert pods["shop/orphan-0"]["change"] == "removed"
    assert pods["shop/orphan-0"]["details"] == [
        f"pending since {_at(0)}, deleted while pending at {_at(9)} after 9.000s: data waits for "
        "PersistentVolumeClaim shop/orphan-data: not bound yet (spec.volumeName is empty)"
    ]
    assert pods["shop/late-0"]["change"] == "pending"
    whole = _json(runner, ["diff", "--db", str(waits), "--since", _at(-1)])
    assert {p["pod"]: p["change"] for p in whole["pods"]} == {
        "shop/late-0": "pending",
        "shop/orphan-0": "transient",  # came and went in the window
    }
    out = run_ok(runner, ["diff", "--db", str(waits), "--since", _at(1)])
    header = out.split("Desired pods\n")[1].splitlines()[0]
    assert header.split() == ["CHANGE", "POD", "UID", "VOLUMES", "DETAIL"]


# --------------------------------------------------------------------- replay


def test_replay_says_when_a_pending_pod_resolved_or_was_deleted(
    runner: CliRunner, incident: Path, waits: Path
) -> None:
    lines = run_ok(runner, ["replay", "--db", str(incident)]).splitlines()
    added = next(line for line in lines if "#73 " in line)
    assert added.endswith(
        "desired: pod added (uid d5b8e2a4-9f1c-4a7e-b3d6-0c2f8e1a7b59); volumes: "
        f"data={CART_PV}; no longer pending (pending 6.000s since 2024-05-01T03:11:32.000Z)"
    )
    removed = run_ok(runner, ["replay", "--db", str(waits)]).splitlines()[4]
    assert removed.endswith(
        f"desired: pod removed (uid {ORPHAN_UID}); deleted while pending (pending 9.000s since "
        f"{_at(0)}), nothing mounted"
    )


def test_the_html_timeline_lists_the_waits_below_the_chart(
    runner: CliRunner, incident: Path, tmp_path: Path
) -> None:
    page = tmp_path / "cart.html"
    args = ["timeline", "--db", str(incident), "--pod", "shop/cart-0", "-o", "html"]
    run_ok(runner, [*args, "--out-file", str(page)])
    rows = re.findall(r'<tr class="wait" ([^>]*)>', page.read_text(encoding="utf-8"))
    assert [dict(re.findall(r'(data-[a-z]+)="([^"]*)"', r)) for r in rows] == [
        {
            "data-pod": "shop/cart-0",
            "data-from": "2024-05-01T03:11:32.000Z",
            "data-to": "2024-05-01T03:11:35.000Z",
            "data-then": "waits for something else",
        },
        {
            "data-pod": "shop/cart-0",
            "data-from": "2024-05-01T03:11:35.000Z",
            "data-to": "2024-05-01T03:11:38.000Z",
            "data-then": "resolved (PodAdded, seq 73)",
        },
    ]
