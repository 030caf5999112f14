"""ServiceAccount admission and the kube-root-ca.crt ConfigMap, as an API server does them.

In a cluster the API server's ServiceAccount admission plugin
(kube-apiserver's ``plugin/pkg/admission/serviceaccount``) completes every
pod it creates: ``spec.serviceAccountName`` defaults to "default" and, unless
``automountServiceAccountToken`` is false on the pod (or else on its
ServiceAccount), each init container and container without a mount at
``/var/run/secrets/kubernetes.io/serviceaccount`` gets a read-only mount of a
``kube-api-access-<5 characters>`` projected volume (the token, the
``kube-root-ca.crt`` ConfigMap's ``ca.crt``, the namespace), added to the pod
if any container needed it. Mirror pods are left alone.

volfsm does the same at apply, where it gives a pod its uid (`admit_pod`).
Departure: the 5 characters come from the pod's uid (a hash), not at random,
so a pod applied again under its uid is the same pod.

The root-ca-cert-publisher controller puts a ConfigMap ``kube-root-ca.crt``
(key ``ca.crt``: the cluster's CA bundle) in every namespace; volfsm
publishes one (`root_ca_config_map`) in a namespace whose pod needs it and
has none, marked as volfsm's (`PUBLISHED_BY`). An applied one always wins.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

API_ACCESS_PREFIX = "kube-api-access-"
"""The name prefix of the token volume (`ServiceAccountVolumeName` + "-")."""
TOKEN_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where every container gets the token volume (`DefaultAPITokenMountPath`)."""
DEFAULT_ACCOUNT = "default"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
TOKEN_EXPIRATION_S = 3607
"""The API server's token lifetime for the volume (1 h + 7 s, to tell it apart)."""
ROOT_CA_CONFIG_MAP = "kube-root-ca.crt"
ROOT_CA_KEY = "ca.crt"
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""The API server's random-name alphabet (`utilrand.String`): no vowels, no 0/1/3."""
PUBLISHED_BY = "volfsm.io/published-by"
"""The annotation that marks a kube-root-ca.crt ConfigMap volfsm published (value "volfsm")."""
ROOT_CA_DESCRIPTION = (
    "Contains a CA bundle that can be used to verify the kube-apiserver when using internal "
    "endpoints such as the internal service IP or kubernetes.default.svc. No other usage is "
    "guaranteed across distributions of Kubernetes clusters."
)
"""The root-ca-cert-publisher's `kubernetes.io/description` annotation."""


@dataclass(frozen=True)
class Admission:
    """What the node admits pods with: the CA bundle its kube-root-ca.crt ConfigMaps hold."""

    root_ca_pem: str
    """PEM certificates for `ca.crt` ("": publish no ConfigMap)."""
    root_ca_source: str = "the node-local CA"
    """Where they come from, for the apply's line ("--root-ca-file F", "the node-local CA")."""


def api_access_name(pod_uid: str) -> str:
    """ "kube-api-access-" + 5 characters of the API server's alphabet, from the pod's uid."""
    digest = hashlib.sha256(pod_uid.encode()).digest()
    return API_ACCESS_PREFIX + "".join(NAME_ALPHABET[b % len(NAME_ALPHABET)] for b in digest[:5])


def token_volume_source() -> dict[str, Any]:
    """The projected source of the token volume (the API server's `TokenVolumeSource`)."""
    namespace_ref = {"apiVersion": "v1", "fieldPath": "metadata.namespace"}
    return {
        "defaultMode": 0o644,
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_S}},
            {
                "configMap": {
                    "name": ROOT_CA_CONFIG_MAP,
                    "items": [{"key": ROOT_CA_KEY, "path": ROOT_CA_KEY}],
                }
            },
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": namespace_ref}]}},
        ],
    }


def is_mirror_pod(raw: Mapping[str, Any]) -> bool:
    """Whether a pod carries the mirror-pod annotation (a static pod's API object)."""
    meta = raw.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return isinstance(annotations, Mapping) and MIRROR_ANNOTATION in annotations


def account_of(spec: Mapping[str, Any]) -> str:
    """The pod's service account: serviceAccountName, else the deprecated serviceAccount,
    else "default"."""
    for key in ("serviceAccountName", "serviceAccount"):
        value = spec.get(key)
        if isinstance(value, str) and value:
            return value
    return DEFAULT_ACCOUNT


def should_automount(spec: Mapping[str, Any], account_automount: bool | None) -> bool:
    """The pod's automountServiceAccountToken if set, else its ServiceAccount's, else true."""
    pod_says = spec.get("automountServiceAccountToken")
    if isinstance(pod_says, bool):
        return pod_says
    return True if account_automount is None else account_automount


def admit_pod(
    raw: dict[str, Any], account_automount: bool | None, decided: bool | None = None
) -> str:
    """Complete a pod (a dict the caller owns) as ServiceAccount admission does.

    `account_automount` is the ServiceAccount's automountServiceAccountToken
    (None: not set, or no such object). `decided` overrides whether the
    token is mounted (a pod applied again keeps its first apply's answer).
    Returns the name of the token volume if one was added to
    `spec.volumes`, else "". A mirror pod, or one whose spec is not a
    mapping, is left as it is.
    """
    spec = raw.get("spec")
    if not isinstance(spec, dict) or is_mirror_pod(raw):
        return ""
    spec["serviceAccountName"] = account_of(spec)
    automount = should_automount(spec, account_automount) if decided is None else decided
    if not automount:
        return ""
    volumes = spec.get("volumes")
    volumes = volumes if isinstance(volumes, list) else []
    existing = _existing_token_volume(volumes)
    name = existing or api_access_name(_uid_of(raw))
    needed = False
    for key in ("initContainers", "containers"):
        needed |= _mount_in(spec.get(key), name)
    if existing or not needed:
        return ""
    spec["volumes"] = [*volumes, {"name": name, "projected": token_volume_source()}]
    return name


def _uid_of(raw: Mapping[str, Any]) -> str:
    meta = raw.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) else ""


def _existing_token_volume(volumes: list[Any]) -> str:
    """The first volume named kube-api-access-*, as the plugin reuses it ("" if none)."""
    for volume in volumes:
        name = volume.get("name") if isinstance(volume, Mapping) else None
        if isinstance(name, str) and name.startswith(API_ACCESS_PREFIX):
            return name
    return ""


def _mount_in(containers: object, volume: str) -> bool:
    """Append the token mount to each container without a mount at its path; whether any
    container got one."""
    if not isinstance(containers, list):
        return False
    added = False
    for container in containers:
        if not isinstance(container, dict):
            continue
        mounts = container.get("volumeMounts")
        mounts = mounts if isinstance(mounts, list) else []
        if any(isinstance(m, Mapping) and m.get("mountPath") == TOKEN_MOUNT_PATH for m in mounts):
            continue
        mount = {"name": volume, "readOnly": True, "mountPath": TOKEN_MOUNT_PATH}
        container["volumeMounts"] = [*mounts, mount]
        added = True
    return added


def root_ca_config_map(namespace: str, pem: str) -> dict[str, Any]:
    """The kube-root-ca.crt ConfigMap volfsm publishes in `namespace`, marked as its own."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": ROOT_CA_CONFIG_MAP,
            "namespace": namespace,
            "annotations": {
                "kubernetes.io/description": ROOT_CA_DESCRIPTION,
                PUBLISHED_BY: "volfsm",
            },
        },
        "data": {ROOT_CA_KEY: pem},
    }


def published_by_volfsm(annotations: Mapping[str, str]) -> bool:
    """Whether a ConfigMap's annotations mark it as one volfsm published (an operator's
    never do)."""
    return annotations.get(PUBLISHED_BY) == "volfsm"
