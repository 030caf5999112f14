"""The device and pod-volume state machines as plain data.

These tables are the single source of the transition rules (kubelet
reference §1.2-§1.3): the `transitions` machines in `volfsm.fsm`, the replay
validator in `projections.validate` and the mermaid diagrams all read them.

A row says: firing `trigger` from any state in `sources` moves to `dest`
(None: stay in the same state) and is recorded as an event of type `event`.
Operation records (OperationStarted/Succeeded/Failed) are not transitions;
they may appear in any state. Nor are observations (`OBSERVATION_EVENTS`:
health and usage of a pod-volume), which may appear in any state of a
pod-volume stream.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Transition:
    """One row of a transition table."""

    trigger: str
    sources: tuple[str, ...]
    dest: str | None
    event: str
    note: str = ""


@dataclass(frozen=True)
class FsmTable:
    """A whole state machine: its states, initial state and transitions."""

    name: str
    initial: str
    states: tuple[str, ...]
    transitions: tuple[Transition, ...]

    def event_types(self) -> frozenset[str]:
        """Every event type that is a transition of this machine."""
        return frozenset(t.event for t in self.transitions)

    def next_state(self, state: str, event_type: str) -> str | None:
        """The state after `event_type` happens in `state`; None if illegal."""
        for t in self.transitions:
            if t.event == event_type and state in t.sources:
                return state if t.dest is None else t.dest
        return None

    def triggers_from(self, state: str) -> tuple[str, ...]:
        """The triggers that are legal in `state`."""
        return tuple(t.trigger for t in self.transitions if state in t.sources)


DETACHED = "Detached"
ATTACHED = "Attached"
GLOBALLY_MOUNTED = "DeviceGloballyMounted"
UNCERTAIN = "Uncertain"
UNMOUNTED = "Unmounted"
MOUNTED = "Mounted"

DEVICE_FSM = FsmTable(
    name="device",
    initial=DETACHED,
    states=(DETACHED, ATTACHED, GLOBALLY_MOUNTED, UNCERTAIN),
    transitions=(
        Transition(
            "attach",
            (DETACHED,),
            ATTACHED,
            "DeviceAttached",
            "attach or verify-attached succeeded; non-attachable plugins are attached at once",
        ),
        Transition(
            "mount_device",
            (ATTACHED, UNCERTAIN, GLOBALLY_MOUNTED),
            GLOBALLY_MOUNTED,
            "DeviceMounted",
            "stage succeeded; success is never downgraded",
        ),
        Transition(
            "mark_device_uncertain",
            (DETACHED, ATTACHED, GLOBALLY_MOUNTED, UNCERTAIN),
            UNCERTAIN,
            "DeviceMountUncertain",
            "stage timed out / non-final error, unstage failed, device still open, "
            "or reconstructed",
        ),
        Transition(
            "unmount_device",
            (GLOBALLY_MOUNTED, UNCERTAIN),
            ATTACHED,
            "DeviceUnmounted",
            "unstage succeeded, or a final stage error while Uncertain (not reconstructed)",
        ),
        Transition("detach", (ATTACHED,), DETACHED, "DeviceDetached", "no pod holds the volume"),
        Transition(
            "resize",
            (ATTACHED, GLOBALLY_MOUNTED, UNCERTAIN),
            None,
            "VolumeResized",
            "expansion succeeded or first size recorded",
        ),
    ),
)

PODVOL_FSM = FsmTable(
    name="podvol",
    initial=UNMOUNTED,
    states=(UNMOUNTED, MOUNTED, UNCERTAIN),
    transitions=(
        Transition(
            "mount",
            (UNMOUNTED, UNCERTAIN, MOUNTED),
            MOUNTED,
            "VolumeMounted",
            "publish (and expand-during-mount) succeeded; a remount stays Mounted",
        ),
        Transition(
            "mark_uncertain",
            (UNMOUNTED, MOUNTED, UNCERTAIN),
            UNCERTAIN,
            "VolumeMountUncertain",
            "publish timed out / non-final error, expansion during mount failed, "
            "unpublish failed, or reconstructed",
        ),
        Transition(
            "unmount",
            (MOUNTED, UNCERTAIN),
            UNMOUNTED,
            "VolumeUnmounted",
            "unpublish succeeded, or a final publish error while Uncertain (not reconstructed)",
        ),
    ),
)

TABLES: dict[str, FsmTable] = {DEVICE_FSM.name: DEVICE_FSM, PODVOL_FSM.name: PODVOL_FSM}

OPERATION_EVENTS = frozenset({"OperationStarted", "OperationSucceeded", "OperationFailed"})
DESIRED_EVENTS = frozenset(
    {"PodAdded", "PodPending", "PodRemoved", "PodCleanedUp", "DesiredSizeChanged"}
)
OBJECT_EVENTS = frozenset({"ObjectApplied", "ObjectDeleted"})
OBSERVATION_EVENTS = frozenset({"VolumeConditionChanged", "VolumeUsageChanged"})
"""What the volume stats gatherer saw of a mounted pod-volume: on pod-volume streams only,
in any state, never a transition."""


def table_for_stream_kind(kind: str) -> FsmTable | None:
    """The FSM table for a stream kind ('device' / 'podvol'), None for others."""
    return TABLES.get(kind)
