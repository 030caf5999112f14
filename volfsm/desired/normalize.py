"""What Go's JSON decoding does to a manifest before volfsm decodes it with msgspec.

Two differences between a YAML 1.2 reading and what kubectl + the API
server make of a manifest are settled here, on the raw object:

* `null` leaves a field at its default (Go leaves the zero value); inside
  a string map (labels, annotations, ConfigMap data, ...) it is "";
* in a boolean field, the YAML 1.1 words kubectl reads as booleans
  (`yes`/`no`/`on`/`off`/`y`/`n`, any case kubectl takes) are booleans
  (the loader keeps them as strings, which is what they are everywhere
  else).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STRING_MAPS = frozenset(
    {
        "labels",
        "annotations",
        "data",
        "stringData",
        "binaryData",
        "volumeAttributes",
        "nodeSelector",
        "matchLabels",
        "userAnnotations",
    }
)
"""Keys whose value is a map of strings: a null value there is the empty string."""

BOOL_FIELDS = frozenset(
    {
        "readOnly",
        "optional",
        "immutable",
        "automountServiceAccountToken",
        "attachRequired",
        "podInfoOnMount",
        "requiresRepublish",
        "storageCapacity",
        "seLinuxMount",
        "controller",
        "blockOwnerDeletion",
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "hostUsers",
        "shareProcessNamespace",
        "enableServiceLinks",
        "setHostnameAsFQDN",
        "privileged",
        "allowPrivilegeEscalation",
        "readOnlyRootFilesystem",
        "runAsNonRoot",
        "stdin",
        "stdinOnce",
        "tty",
    }
)
"""Boolean fields of the objects volfsm reads (the YAML 1.1 words count there)."""

YAML11_BOOLS = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "off", "Off", "OFF"), False),
    **dict.fromkeys(("true", "True", "TRUE"), True),
    **dict.fromkeys(("false", "False", "FALSE"), False),
}
"""go-yaml v2's boolean words (what kubectl sends as true/false)."""


def normalize(value: Any, key: str = "") -> Any:
    """A copy of a raw (JSON-shaped) object with nulls and YAML 1.1 booleans settled."""
    if isinstance(value, Mapping):
        if key in STRING_MAPS:
            return {k: ("" if v is None else normalize(v)) for k, v in value.items()}
        return {k: normalize(v, str(k)) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [normalize(item) for item in value]
    if isinstance(value, str) and key in BOOL_FIELDS:
        return YAML11_BOOLS.get(value, value)
    return value
