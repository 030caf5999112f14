"""Parts every Kubernetes-shaped object shares: the Struct base, metadata, references.

Only the fields volfsm uses are declared; every other field a real object
carries is ignored (the whole object is still kept, as applied, in the
node's object store).
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

Quantity: TypeAlias = str | int | float
DEFAULT_NAMESPACE = "default"

LabelOperator: TypeAlias = Literal["In", "NotIn", "Exists", "DoesNotExist"]


class K8s(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Base: camelCase field names, unknown fields ignored."""


class OwnerReference(K8s, frozen=True, kw_only=True):
    """One metadata.ownerReferences entry."""

    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class ObjectMeta(K8s, frozen=True, kw_only=True):
    """metadata of any object. `uid` is "" until the apply gives it one."""

    name: str
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    owner_references: tuple[OwnerReference, ...] = ()

    @property
    def ns(self) -> str:
        """The namespace, "default" when none was given."""
        return self.namespace or DEFAULT_NAMESPACE


PodMeta = ObjectMeta
"""A pod's metadata (the same fields; the uid is given at apply when missing)."""


class SecretReference(K8s, frozen=True, kw_only=True):
    """A reference to a Secret by name (CSI secret refs)."""

    name: str = ""
    namespace: str = ""


class LocalObjectReference(K8s, frozen=True, kw_only=True):
    """A reference to an object in the same namespace."""

    name: str = ""


class ObjectReference(K8s, frozen=True, kw_only=True):
    """A PV's claimRef, a service account's secrets."""

    kind: str = ""
    namespace: str = ""
    name: str = ""
    uid: str = ""


class LabelSelectorRequirement(K8s, frozen=True, kw_only=True):
    """One matchExpressions entry."""

    key: str
    operator: LabelOperator
    values: tuple[str, ...] = ()


class LabelSelector(K8s, frozen=True, kw_only=True):
    """matchLabels AND matchExpressions; an empty selector matches everything."""

    match_labels: dict[str, str] = {}
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether `labels` satisfy every requirement (Kubernetes' LabelSelectorAsSelector)."""
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        return all(_requirement_holds(req, labels) for req in self.match_expressions)


def _requirement_holds(req: LabelSelectorRequirement, labels: dict[str, str]) -> bool:
    present = req.key in labels
    if req.operator == "Exists":
        return present
    if req.operator == "DoesNotExist":
        return not present
    if req.operator == "In":
        return present and labels[req.key] in req.values
    return not present or labels[req.key] not in req.values


class KeyToPath(K8s, frozen=True, kw_only=True):
    """One `items` entry of a configMap or secret source: key -> file path (and mode)."""

    key: str
    path: str
    mode: int | None = None
