"""The rules behind local PVs and memory emptyDirs: node affinity, the tmpfs size."""

from __future__ import annotations

import json

import pytest

from events.types import VolumeSource
from volfsm.plugins.emptydir import memory_volume_size
from volfsm.plugins.local import node_affinity_problem

LABELS = {"kubernetes.io/hostname": "n1", "zone": "a", "cores": "8"}
MIB = 1 << 20


def affinity(*terms: list[dict[str, object]]) -> str:
    selector = [{"matchExpressions": exprs} for exprs in terms]
    return json.dumps({"required": {"nodeSelectorTerms": selector}})


def expr(key: str, op: str, *values: str) -> dict[str, object]:
    return {"key": key, "operator": op, "values": list(values)}


@pytest.mark.parametrize(
    ("terms", "matches"),
    [
        ([[expr("kubernetes.io/hostname", "In", "n1")]], True),
        ([[expr("kubernetes.io/hostname", "In", "n2")]], False),
        ([[expr("kubernetes.io/hostname", "NotIn", "n2"), expr("zone", "Exists")]], True),
        ([[expr("zone", "DoesNotExist")]], False),
        ([[expr("cores", "Gt", "4"), expr("cores", "Lt", "16")]], True),
        ([[expr("cores", "Gt", "8")]], False),
        ([[expr("zone", "In", "b")], [expr("zone", "In", "a")]], True),  # terms are ORed
    ],
)
def test_node_affinity(terms: list[list[dict[str, object]]], matches: bool) -> None:
    problem = node_affinity_problem(affinity(*terms), LABELS)
    assert (problem is None) is matches
    if not matches:
        assert "does not match this node" in str(problem)


def test_a_local_pv_without_affinity_is_refused() -> None:
    assert "needs spec.nodeAffinity" in str(node_affinity_problem("{}", LABELS))


@pytest.mark.parametrize(
    ("pod_limit", "size_limit", "allocatable", "size"),
    [
        (None, None, 512 * MIB, 512 * MIB),
        (64 * MIB, None, 512 * MIB, 64 * MIB),
        (64 * MIB, 128 * MIB, 512 * MIB, 64 * MIB),  # above the pod's limit: ignored
        (64 * MIB, 8 * MIB, 512 * MIB, 8 * MIB),
        (None, 1024 * MIB, 512 * MIB, 512 * MIB),  # above allocatable: ignored
        (None, None, None, None),  # kernel default
        (None, 8 * MIB, None, 8 * MIB),
    ],
)
def test_memory_volume_size(
    pod_limit: int | None, size_limit: int | None, allocatable: int | None, size: int | None
) -> None:
    source = VolumeSource(
        plugin="kubernetes.io/empty-dir",
        medium="Memory",
        pod_memory_limit_bytes=pod_limit,
        size_limit_bytes=size_limit,
    )
    assert memory_volume_size(source, allocatable) == size
