"""The node's object store: the objects pods refer to, kept across restarts and crashes.

Every object `volfsm apply` takes (Pod, PersistentVolume,
PersistentVolumeClaim, ConfigMap, Secret, ServiceAccount,
ClusterTrustBundle, CSIDriver) is kept in `<data-dir>/objects/objects.db`
(a SQLite file of its own, directory 0700, file 0600: it holds Secret
values, which never reach the event log, NATS or log output). The event log
records each change as ObjectApplied / ObjectDeleted (kind,
namespace/name, uid, resource version, content hash, a ConfigMap's or
Secret's key names).

API for the volume plugins (all reads are from memory; `engine.objects` is
the running engine's store):

    store.get(kind, namespace, name) -> StoredObject | None
        # namespace "" for cluster-scoped kinds; .uid, .resource_version,
        # .content_hash, .raw (as applied), .obj (typed, volfsm.desired.kinds)
    store.objects(kind=None, namespace=None) -> list[StoredObject]
    store.config_map(ns, name) -> ConfigMapData | None   # .data, .binary_data (bytes),
                                                          # .files(), .version, .immutable
    store.secret(ns, name) -> SecretData | None           # .data: key -> decoded bytes;
                                                          # repr shows keys only
    store.service_account(ns, name) -> ServiceAccount | None
    store.csi_driver(name) -> CSIDriver | None
        # .spec: attach_required, pod_info_on_mount, fs_group_policy,
        # requires_republish, token_requests, volume_lifecycle_modes,
        # storage_capacity, se_linux_mount (API server defaults applied)
    store.cluster_trust_bundle(name) -> ClusterTrustBundle | None
    store.cluster_trust_bundles(signer_name, selector) -> list[StoredObject]
        # selector: volfsm.desired.meta.LabelSelector; None matches nothing,
        # an empty one everything (the kubelet's rule)
    store.pod(ns, name) -> Pod | None   # labels, annotations, containers' resources
    store.subscribe(listener) -> unsubscribe
        # listener(changes: list[ObjectChange]) after each change is durable in
        # the store and recorded in the log; ObjectChange: kind, namespace,
        # name, uid, resource_version, content_hash, deleted. Which pods
        # refer to the object is the listener's business.

`Version.of(stored)` (uid, resource_version, content_hash) is what a mount
should record having written, so `replay`/`explain` can tie a pod's files
to an ObjectApplied event.
"""

from volfsm.objects.keeper import ObjectKeeper
from volfsm.objects.listing import LISTS, listing
from volfsm.objects.model import ObjectChange, StoredObject, StoreWrite
from volfsm.objects.store import ObjectStore, ObjectStoreError
from volfsm.objects.views import ConfigMapData, SecretData, Version

__all__ = [
    "LISTS",
    "ConfigMapData",
    "ObjectChange",
    "ObjectKeeper",
    "ObjectStore",
    "ObjectStoreError",
    "SecretData",
    "StoreWrite",
    "StoredObject",
    "Version",
    "listing",
]
