"""The unmount gate in words: which gate holds and what lifts it (`get`, /readyz, the log).

After a restart nothing is unmounted until the desired state is complete.
The status fields (`VolumeEngine.recovery_status`) say how that can come:

* ``desired_gate``: ``open``; ``until_told_or_grace`` (`volfsm apply
  --complete`, or the grace period running out); ``until_told`` (only `apply
  --complete`: the log cannot vouch for the node, or no grace period is set);
* ``desired_wait_reason``: why the grace timer does not apply ("" if it does);
* ``desired_grace_left_s``: seconds until the grace period ends (None if none runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GATE_OPEN = "open"
GATE_UNTIL_TOLD = "until_told"
GATE_UNTIL_TOLD_OR_GRACE = "until_told_or_grace"
LIFT = "`volfsm apply -f DIR --complete`"


def gate_text(status: Mapping[str, Any]) -> str:
    """One line: why nothing is unmounted yet and what ends it ("" when the gate is open)."""
    if status.get("desired_complete") is not False:
        return ""
    reason = status.get("desired_wait_reason") or ""
    if reason:
        return (
            f"desired state not complete: {reason}: nothing is unmounted until {LIFT};"
            " the grace timer does not apply"
        )
    left = status.get("desired_grace_left_s")
    until = f" (grace ends in {left:.0f}s)" if isinstance(left, int | float) else ""
    return f"desired state not complete: nothing is unmounted yet{until}; {LIFT} ends the wait"
