"""Stream (aggregate) names: how devices, pod-volumes, pods and objects are keyed in the log."""

from __future__ import annotations

DEVICE_PREFIX = "device/"
PODVOL_PREFIX = "podvol/"
POD_PREFIX = "pod/"
OBJECT_PREFIX = "object/"


def device_stream(volume_id: str) -> str:
    """Stream of the device FSM of one volume on this node."""
    return DEVICE_PREFIX + volume_id


def podvol_stream(pod_uid: str, volume_name: str) -> str:
    """Stream of the pod-volume FSM of one (pod, volume)."""
    return f"{PODVOL_PREFIX}{pod_uid}/{volume_name}"


def pod_stream(pod_uid: str) -> str:
    """Stream of a pod's desired-state events."""
    return POD_PREFIX + pod_uid


def object_stream(kind: str, namespace: str, name: str) -> str:
    """Stream of one object of the node's object store ("" namespace: cluster-scoped)."""
    if namespace:
        return f"{OBJECT_PREFIX}{kind}/{namespace}/{name}"
    return f"{OBJECT_PREFIX}{kind}/{name}"


def stream_kind(stream: str) -> str:
    """'device', 'podvol', 'pod', 'object' or 'other' for a stream name."""
    if stream.startswith(DEVICE_PREFIX):
        return "device"
    if stream.startswith(PODVOL_PREFIX):
        return "podvol"
    if stream.startswith(POD_PREFIX):
        return "pod"
    if stream.startswith(OBJECT_PREFIX):
        return "object"
    return "other"
