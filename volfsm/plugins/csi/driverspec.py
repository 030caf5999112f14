"""What a ``CSIDriver`` object makes the node side do (kubelet reference §7).

The CSI plugin asks `DriverObjects` for the driver's spec (the node's object
store, with the API server's defaults) when it publishes; no object means
the kubelet's defaults (`DEFAULT_SPEC`, except that inline volumes then are
refused: the kubelet allows Ephemeral only when an object lists it).

* ``volumeLifecycleModes``: `lifecycle_problem`;
* ``podInfoOnMount``: `pod_info_context` (pod name, namespace, uid, service
  account, ``ephemeral``) merged into the publish volume context, over the
  user's keys of the same name;
* ``tokenRequests``: `token_context`, a token per audience from the token
  source (volfsm.plugins.objectvol.tokens, shared with projected volumes);
* ``fsGroupPolicy``: `applies_fs_group` (when the driver takes no mount group).

* ``attachRequired``: `attach_required` (the plugin's ``is_attachable``).

``requiresRepublish`` is read by the service's republish loop.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from dataclasses import dataclass

from volfsm.desired.kinds import CSIDriver, CSIDriverSpec
from volfsm.plugins.base import VolumeRequest
from volfsm.plugins.objectvol.tokens import DEFAULT_EXPIRATION_S, Token, TokenError, TokenKey

POD_NAME = "csi.storage.k8s.io/pod.name"
POD_NAMESPACE = "csi.storage.k8s.io/pod.namespace"
POD_UID = "csi.storage.k8s.io/pod.uid"
SERVICE_ACCOUNT = "csi.storage.k8s.io/serviceAccount.name"
EPHEMERAL = "csi.storage.k8s.io/ephemeral"
TOKENS = "csi.storage.k8s.io/serviceAccount.tokens"

PERSISTENT = "Persistent"
EPHEMERAL_MODE = "Ephemeral"
FS_GROUP_NONE = "None"
FS_GROUP_FILE = "File"
READ_WRITE_ONCE = "ReadWriteOnce"

DEFAULT_SPEC = CSIDriverSpec()
"""The kubelet's behaviour for a driver with no CSIDriver object."""

DriverLookup = Callable[[str], CSIDriver | None]
TokenLookup = Callable[[TokenKey], Token]


@dataclass
class DriverObjects:
    """Where the CSI plugin finds CSIDriver objects and tokens.

    `volfsm serve` sets both once the engine's object store and the token
    source exist; until then (and in tests without them) every driver has
    the defaults and no token can be had.
    """

    lookup: DriverLookup | None = None
    tokens: TokenLookup | None = None

    def spec(self, driver: str) -> CSIDriverSpec | None:
        """The driver's CSIDriver spec, or None if there is no object."""
        found = self.lookup(driver) if self.lookup is not None else None
        return found.spec if found is not None else None


def attach_required(spec: CSIDriverSpec | None) -> bool:
    """The kubelet's ``!skipAttach``: false only when an object says ``attachRequired: false``
    (no object: attach is required)."""
    return spec is None or spec.attach_required


def lifecycle_problem(spec: CSIDriverSpec | None, driver: str, ephemeral: bool) -> str | None:
    """Why the driver may not serve this volume's lifecycle mode (kubelet's SetUp check)."""
    mode = EPHEMERAL_MODE if ephemeral else PERSISTENT
    if spec is None:
        if ephemeral:
            return f'volume mode "{mode}" not supported by driver {driver} (no CSIDriver object)'
        return None
    if mode not in spec.volume_lifecycle_modes:
        modes = " ".join(spec.volume_lifecycle_modes)
        return f'volume mode "{mode}" not supported by driver {driver} (only supports [{modes}])'
    return None


def pod_info_context(req: VolumeRequest) -> dict[str, str]:
    """The podInfoOnMount keys of the publish volume context."""
    return {
        POD_NAME: req.pod_name,
        POD_NAMESPACE: req.pod_namespace,
        POD_UID: req.pod_uid,
        SERVICE_ACCOUNT: req.service_account,
        EPHEMERAL: "true" if req.ephemeral else "false",
    }


def token_context(
    spec: CSIDriverSpec, req: VolumeRequest, tokens: TokenLookup | None
) -> dict[str, str]:
    """The tokenRequests key of the publish volume context ({} if the driver asks for none).

    `TokenError` if a token cannot be had (the publish is not tried: the
    kubelet fails SetUp the same way).
    """
    if not spec.token_requests:
        return {}
    if tokens is None:
        raise TokenError("no token source on this node")
    found: dict[str, dict[str, str]] = {}
    for request in spec.token_requests:
        key = TokenKey(
            namespace=req.pod_namespace,
            service_account=req.service_account,
            audiences=(request.audience,) if request.audience else (),
            expiration_seconds=request.expiration_seconds or DEFAULT_EXPIRATION_S,
            pod_name=req.pod_name,
            pod_uid=req.pod_uid,
        )
        token = tokens(key)
        expires = datetime.datetime.fromtimestamp(token.expires_at, datetime.UTC)
        found[request.audience] = {
            "token": token.text,
            "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    return {TOKENS: json.dumps(found, sort_keys=True)}


def applies_fs_group(spec: CSIDriverSpec | None, req: VolumeRequest) -> bool:
    """Whether the kubelet changes the volume's ownership itself (``supportsFSGroup``)."""
    policy = (spec or DEFAULT_SPEC).fs_group_policy
    if req.fs_group is None or policy == FS_GROUP_NONE or req.read_only:
        return False
    if policy == FS_GROUP_FILE:
        return True
    if not req.source.fs_type:
        return False
    return req.ephemeral or READ_WRITE_ONCE in req.source.access_modes
