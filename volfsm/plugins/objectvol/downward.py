"""The downward API's file contents (kubelet's fieldpath and resource helpers, §1.5).

`field_value` answers a ``fieldRef`` (metadata.name, namespace, uid,
labels, annotations, or one label/annotation by subscript); `resource_value`
answers a ``resourceFieldRef``: a container's limit or request divided by the
divisor and rounded up. An unset limit is the node's allocatable (the
kubelet's rule), an unset request 0.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path

from volfsm.desired.objects import Container, Pod
from volfsm.desired.quantity import parse_quantity
from volfsm.desired.volumes import ObjectFieldSelector, ResourceFieldSelector

_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.*)'\]$")
_ALLOCATABLE = ("cpu", "memory", "ephemeral-storage")
_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


class DownwardAPIError(Exception):
    """A downwardAPI item the kubelet refuses; the message names the item."""


def go_quote(text: str) -> str:
    """`text` as Go's ``%q`` (strconv.Quote) writes it: printable runes kept, others escaped."""
    out = ['"']
    for ch in text:
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def format_map(values: Mapping[str, str]) -> str:
    """A whole label/annotation map: sorted ``key="value"`` lines, no trailing newline."""
    return "\n".join(f"{key}={go_quote(values[key])}" for key in sorted(values))


def field_value(pod: Pod, ref: ObjectFieldSelector) -> str:
    """The text of a ``fieldRef``; `DownwardAPIError` for a path a volume may not use."""
    meta = pod.metadata
    path = ref.field_path
    match = _SUBSCRIPT.match(path)
    if match is not None:
        values = meta.labels if match[1] == "labels" else meta.annotations
        return values.get(match[2], "")
    simple = {
        "metadata.name": meta.name,
        "metadata.namespace": meta.ns,
        "metadata.uid": meta.uid,
    }
    if path in simple:
        return simple[path]
    if path == "metadata.labels":
        return format_map(meta.labels)
    if path == "metadata.annotations":
        return format_map(meta.annotations)
    raise DownwardAPIError(f"unsupported fieldPath {path!r} (a volume may use metadata fields)")


def _container(pod: Pod, name: str) -> Container:
    for container in (*pod.spec.containers, *pod.spec.init_containers):
        if container.name == name:
            return container
    raise DownwardAPIError(f"container {name!r} not found in the pod")


def resource_value(
    pod: Pod, ref: ResourceFieldSelector, allocatable: Mapping[str, Fraction]
) -> str:
    """The text of a ``resourceFieldRef``: ceil(value / divisor)."""
    if not ref.container_name:
        raise DownwardAPIError(f"resourceFieldRef {ref.resource!r} names no containerName")
    kind, _, resource = ref.resource.partition(".")
    if kind not in ("limits", "requests") or not (
        resource in _ALLOCATABLE or resource.startswith("hugepages-")
    ):
        raise DownwardAPIError(f"unsupported resource {ref.resource!r}")
    container = _container(pod, ref.container_name)
    resources = container.resources
    given = None
    if resources is not None:
        given = (resources.limits if kind == "limits" else resources.requests).get(resource)
    try:
        if given is not None:
            value = parse_quantity(given)
        elif kind == "limits":
            value = allocatable.get(resource, Fraction(0))
        else:
            value = Fraction(0)
        divisor = parse_quantity(ref.divisor) if ref.divisor is not None else Fraction(1)
    except ValueError as exc:
        raise DownwardAPIError(f"resource {ref.resource!r}: {exc}") from None
    if divisor == 0:
        divisor = Fraction(1)
    return str(math.ceil(value / divisor))


def node_allocatable(root: Path) -> dict[str, Fraction]:
    """The node's resources as a downwardAPI default: every CPU, MemTotal, the root dir's fs."""
    allocatable: dict[str, Fraction] = {"cpu": Fraction(os.cpu_count() or 1)}
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    allocatable["memory"] = Fraction(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        st = os.statvfs(root)
        allocatable["ephemeral-storage"] = Fraction(st.f_blocks * st.f_frsize)
    except OSError:
        pass
    return allocatable
