"""Resolution: a pod's volumes as `DesiredVolume`s (unique volume ids, plugin sources).

Unique volume ids follow the kubelet: a CSI PV is named by driver and handle
(shared by every pod using it); inline CSI and emptyDir volumes are
pod-scoped. An inline CSI volume gets the kubelet's generated handle
``csi-<sha256(pod uid + volume name)>``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection
from typing import Protocol

import msgspec

from events.types import DesiredVolume, PendingVolume, PodAdded, PodPending, VolumeSource
from volfsm.desired.errors import InvalidObjectError, Problems, flatten_problems
from volfsm.desired.objects import (
    Container,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    SecretReference,
    Volume,
)
from volfsm.desired.validate import claim_capacity_bytes, parse_size, pv_size_bytes
from volfsm.desired.volumes import SOURCES, PersistentVolumeClaimVolumeSource
from volfsm.plugins.base import NotRegistered

PLUGIN_CSI = "kubernetes.io/csi"
PLUGIN_EMPTY_DIR = "kubernetes.io/empty-dir"
PLUGIN_HOST_PATH = "kubernetes.io/host-path"
PLUGIN_LOCAL = "kubernetes.io/local-volume"

CanServe = Callable[[VolumeSource, str], str | None]
"""(source, volume mode) -> None if a plugin can serve it, else why not."""

VolumeFingerprint = tuple[object, ...]


class ObjectLookup(Protocol):
    """Where resolution finds claims and volumes (this apply first, then remembered ones)."""

    def claim(self, namespace: str, name: str) -> PersistentVolumeClaim | None:
        """The claim namespace/name, or None."""

    def volume(self, name: str) -> PersistentVolume | None:
        """The PersistentVolume `name`, or None."""


class WaitsError(Exception):
    """A volume waits for an object that is not there yet: not a problem of the pod.

    The kubelet's populator keeps such a pod and retries it (the claim not
    found, not bound, its PV not found); so does volfsm (`PodPending`).
    """

    def __init__(self, waiting: PendingVolume) -> None:
        super().__init__(waiting.text)
        self.waiting = waiting


def claim_key(namespace: str, name: str) -> str:
    """How a pending pod names a claim it waits for."""
    return f"PersistentVolumeClaim {namespace}/{name}"


def volume_key(name: str) -> str:
    """How a pending pod names a PersistentVolume it waits for."""
    return f"PersistentVolume {name}"


def csi_driver_key(name: str) -> str:
    """How a pending pod names a CSI driver it waits for (to register on this node)."""
    return f"CSI driver {name}"


NOT_REGISTERED = "not registered on this node yet"
"""Why a CSI volume waits for its driver (the kubelet retries its mount until it registers)."""


def _driver_wait(volume: Volume, driver: str, needs: tuple[str, ...] = ()) -> WaitsError:
    """A CSI volume waits for its driver to register on this node."""
    waiting = PendingVolume(
        name=volume.name, waits_for=csi_driver_key(driver), reason=NOT_REGISTERED, needs=needs
    )
    return WaitsError(waiting)


def csi_volume_id(driver: str, volume_handle: str) -> str:
    """Unique name of a CSI PV volume: shared by every pod that uses it."""
    return f"{PLUGIN_CSI}/{driver}^{volume_handle}"


def inline_csi_volume_id(driver: str, pod_uid: str, volume_name: str) -> str:
    """Unique name of an inline CSI volume (pod-scoped)."""
    return f"{PLUGIN_CSI}/{driver}^{pod_uid}-{volume_name}"


def empty_dir_volume_id(pod_uid: str, volume_name: str) -> str:
    """Unique name of an emptyDir volume (pod-scoped)."""
    return f"{PLUGIN_EMPTY_DIR}/{pod_uid}-{volume_name}"


def host_path_volume_id(path: str) -> str:
    """Unique name of a hostPath PV: its path (kubelet's GetVolumeName); a pod's own
    hostPath volumes are pod-scoped (a pod may name one path twice)."""
    return f"{PLUGIN_HOST_PATH}/{path}"


def ephemeral_volume_handle(pod_uid: str, volume_name: str) -> str:
    """The handle the kubelet generates for an inline CSI volume."""
    return "csi-" + hashlib.sha256((pod_uid + volume_name).encode()).hexdigest()


def pv_volume_id(pv: PersistentVolume) -> str:
    """Unique name of a (validated) PV: CSI's driver and handle, a hostPath's path."""
    if pv.spec.local is not None:
        return f"{PLUGIN_LOCAL}/{pv.metadata.name}"  # the kubelet names local volumes by PV
    if pv.spec.csi is None:
        return host_path_volume_id(str((pv.spec.host_path or {}).get("path", "")))
    return csi_volume_id(pv.spec.csi.driver, pv.spec.csi.volume_handle)


def secret_ref(ref: SecretReference | None, default_namespace: str = "") -> str:
    """A secret reference as "namespace/name" ("" if none)."""
    if ref is None or not ref.name:
        return ""
    namespace = ref.namespace or default_namespace
    return f"{namespace}/{ref.name}" if namespace else ref.name


def pv_source(pv: PersistentVolume) -> VolumeSource:
    """What the plugin needs from a (validated) PV: CSI, or a hostPath."""
    csi = pv.spec.csi
    if pv.spec.local is not None:
        return VolumeSource(
            plugin=PLUGIN_LOCAL,
            path=pv.spec.local.path,
            fs_type=pv.spec.local.fs_type,
            mount_options=tuple(pv.spec.mount_options),
            access_modes=tuple(pv.spec.access_modes),
            attributes={"nodeAffinity": json.dumps(pv.spec.node_affinity or {}, sort_keys=True)},
        )
    if csi is None:
        host_path = pv.spec.host_path or {}
        return VolumeSource(
            plugin=PLUGIN_HOST_PATH,
            path=str(host_path.get("path", "")),
            path_type=str(host_path.get("type") or ""),
            access_modes=tuple(pv.spec.access_modes),
        )
    return VolumeSource(
        plugin=PLUGIN_CSI,
        driver=csi.driver,
        volume_handle=csi.volume_handle,
        fs_type=csi.fs_type,
        mount_options=tuple(pv.spec.mount_options),
        attributes=dict(csi.volume_attributes),
        access_modes=tuple(pv.spec.access_modes),
        node_stage_secret_ref=secret_ref(csi.node_stage_secret_ref),
        node_publish_secret_ref=secret_ref(csi.node_publish_secret_ref),
    )


def claim_binding_problem(pvc: PersistentVolumeClaim, pv: PersistentVolume) -> tuple[str, str]:
    """("field", "why") if `pvc` and its bound `pv` disagree, else ("", "")."""
    ref = pv.spec.claim_ref
    if ref is not None and ref.name:
        same = ref.name == pvc.metadata.name and (ref.namespace or "default") == pvc.metadata.ns
        if same and ref.uid and pvc.metadata.uid and ref.uid != pvc.metadata.uid:
            same = False
        if not same:
            return (
                "spec.volumeName",
                f"{pv.label} is bound to claim {ref.namespace or 'default'}/{ref.name}, "
                f"not {pvc.metadata.ns}/{pvc.metadata.name}",
            )
    if pvc.spec.volume_mode != pv.spec.volume_mode:
        return (
            "spec.volumeMode",
            f"volumeMode {pvc.spec.volume_mode} conflicts with {pv.label} "
            f"volumeMode {pv.spec.volume_mode}",
        )
    return ("", "")


UNBOUND = (
    "spec.volumeName is empty; the PV controller binds claims and volfsm has none: apply the "
    "claim with spec.volumeName naming its PersistentVolume"
)
"""Why a claim with no volumeName waits: what would bind it in a cluster, what to do here."""


def _resolve_claim(
    pod: Pod, volume: Volume, path: str, lookup: ObjectLookup, can_serve: CanServe
) -> DesiredVolume:
    src = volume.persistent_volume_claim
    assert src is not None
    ns = pod.metadata.ns
    field = f"{path}.persistentVolumeClaim.claimName"
    key = claim_key(ns, src.claim_name)
    pvc = lookup.claim(ns, src.claim_name)
    if pvc is None:
        raise WaitsError(PendingVolume(name=volume.name, waits_for=key, reason="not found yet"))
    phase = pvc.status.phase if pvc.status else ""
    if not pvc.spec.volume_name or phase not in ("", "Bound"):
        why = UNBOUND if not pvc.spec.volume_name else f"phase {phase}"
        reason = f"not bound yet ({why})"
        raise WaitsError(PendingVolume(name=volume.name, waits_for=key, reason=reason))
    pv = lookup.volume(pvc.spec.volume_name)
    if pv is None:
        waits_for = volume_key(pvc.spec.volume_name)
        reason = f"not found yet ({pvc.label} is bound to it)"
        raise WaitsError(
            PendingVolume(name=volume.name, waits_for=waits_for, reason=reason, needs=(key,))
        )
    problem_field, problem = claim_binding_problem(pvc, pv)
    if problem:
        raise InvalidObjectError(field, f"{pvc.label}: {problem_field}: {problem}")
    source = pv_source(pv)
    mode = pv.spec.volume_mode
    refused = can_serve(source, mode)
    if isinstance(refused, NotRegistered):
        raise _driver_wait(volume, source.driver, (key, volume_key(pv.metadata.name)))
    if refused is not None:
        raise InvalidObjectError(field, f"{pv.label} (volumeMode {mode}): {refused}")
    pv_read_only = pv.spec.csi.read_only if pv.spec.csi is not None else False
    return DesiredVolume(
        name=volume.name,
        volume_id=pv_volume_id(pv),
        source=source,
        volume_mode=mode,
        pv_name=pv.metadata.name,
        claim_name=src.claim_name,
        size_bytes=pv_size_bytes(pv),
        read_only=src.read_only or pv_read_only,
        claim_read_only=src.read_only,
        claim_capacity_bytes=claim_capacity_bytes(pvc),
    )


def ephemeral_claim_name(pod: Pod, volume: Volume) -> str:
    """The claim of a generic ephemeral volume: ``<pod name>-<volume name>``."""
    return f"{pod.metadata.name}-{volume.name}"


def _resolve_ephemeral(
    pod: Pod, volume: Volume, path: str, lookup: ObjectLookup, can_serve: CanServe
) -> DesiredVolume:
    """A generic ephemeral volume: the claim ``<pod>-<volume>``, which must be controlled
    by this pod (the kubelet's VolumeIsForPod), used as a persistentVolumeClaim."""
    ns, claim_name = pod.metadata.ns, ephemeral_claim_name(pod, volume)
    pvc = lookup.claim(ns, claim_name)
    field = f"{path}.ephemeral"
    if pvc is None:
        reason = (
            "not found yet; the ephemeral volume controller makes it from volumeClaimTemplate "
            f"and volfsm has none: apply it with an ownerReference to pod uid {pod.metadata.uid} "
            "(controller: true)"
        )
        waits_for = claim_key(ns, claim_name)
        raise WaitsError(PendingVolume(name=volume.name, waits_for=waits_for, reason=reason))
    owners = [o.uid for o in pvc.metadata.owner_references if o.controller]
    if pod.metadata.uid not in owners:
        raise InvalidObjectError(
            field,
            f"PVC {ns}/{claim_name} was not created for pod {ns}/{pod.metadata.name} "
            "(pod is not owner)",
        )
    claim = PersistentVolumeClaimVolumeSource(claim_name=claim_name)
    as_claim = msgspec.structs.replace(volume, ephemeral=None, persistent_volume_claim=claim)
    return _resolve_claim(pod, as_claim, path, lookup, can_serve)


def _resolve_inline(pod: Pod, volume: Volume, path: str, can_serve: CanServe) -> DesiredVolume:
    uid = pod.metadata.uid
    if volume.csi is not None:
        csi = volume.csi
        source = VolumeSource(
            plugin=PLUGIN_CSI,
            driver=csi.driver,
            volume_handle=ephemeral_volume_handle(uid, volume.name),
            fs_type=csi.fs_type,
            attributes=dict(csi.volume_attributes),
            node_publish_secret_ref=secret_ref(csi.node_publish_secret_ref, pod.metadata.ns),
        )
        volume_id = inline_csi_volume_id(csi.driver, uid, volume.name)
        field, read_only = f"{path}.csi", csi.read_only
    else:
        empty = volume.empty_dir
        assert empty is not None
        size_limit = None
        if empty.size_limit is not None:
            size_limit = parse_size(f"{path}.emptyDir.sizeLimit", empty.size_limit)
        source = VolumeSource(
            plugin=PLUGIN_EMPTY_DIR,
            medium=empty.medium,
            size_limit_bytes=size_limit,
            pod_memory_limit_bytes=pod_memory_limit(pod) if empty.medium == "Memory" else None,
        )
        volume_id = empty_dir_volume_id(uid, volume.name)
        field, read_only = f"{path}.emptyDir", False
    refused = can_serve(source, "Filesystem")
    if isinstance(refused, NotRegistered):
        raise _driver_wait(volume, source.driver)
    if refused is not None:
        raise InvalidObjectError(field, refused)
    return DesiredVolume(name=volume.name, volume_id=volume_id, source=source, read_only=read_only)


def _resolve_host_path(
    pod: Pod, volume: Volume, path: str, can_serve: CanServe, unsupported: list[str]
) -> DesiredVolume | None:
    """A pod's hostPath: the path and its type (None, and named in `unsupported`, when no
    plugin serves hostPath)."""
    host_path = volume.host_path
    assert host_path is not None
    if can_serve(VolumeSource(plugin=PLUGIN_HOST_PATH), "Filesystem") is not None:
        unsupported.append(f"{volume.name} (hostPath)")
        return None
    source = VolumeSource(
        plugin=PLUGIN_HOST_PATH, path=host_path.path, path_type=host_path.type or ""
    )
    refused = can_serve(source, "Filesystem")
    if refused is not None:
        raise InvalidObjectError(f"{path}.hostPath", refused)
    volume_id = f"{PLUGIN_HOST_PATH}/{pod.metadata.uid}-{volume.name}"  # one pod's, as emptyDir
    return DesiredVolume(name=volume.name, volume_id=volume_id, source=source)


def pod_memory_limit(pod: Pod) -> int | None:
    """The pod's memory limit as the kubelet's pod cgroup has it: the larger of the sum of
    its containers' limits and its largest init container's; None if any container has
    none (the pod is then unbounded). Pod overhead is not known to volfsm."""

    def limit(container: Container) -> int | None:
        limits = container.resources.limits if container.resources is not None else {}
        value = limits.get("memory")
        return parse_size("resources.limits.memory", str(value)) if value is not None else None

    regular = [limit(c) for c in pod.spec.containers]
    init = [limit(c) for c in pod.spec.init_containers]
    if not regular or None in regular or None in init:
        return None
    total = sum(v for v in regular if v is not None)
    return max([total, *(v for v in init if v is not None)])


def _resolve_other(
    pod: Pod, volume: Volume, can_serve: CanServe, unsupported: list[str]
) -> DesiredVolume | None:
    """A volume of a source resolution knows no details of: served only if a plugin says so.

    A refused one is added to `unsupported` ("name (source)") for one line
    naming all of the pod's unsupported volumes.
    """
    key = volume.source()
    plugin = SOURCES[key]
    source = VolumeSource(plugin=plugin)
    if can_serve(source, "Filesystem") is not None:
        unsupported.append(f"{volume.name} ({key})")
        return None
    volume_id = f"{plugin}/{pod.metadata.uid}-{volume.name}"
    return DesiredVolume(name=volume.name, volume_id=volume_id, source=source)


def _with_fs_group(pod: Pod, volume: DesiredVolume) -> DesiredVolume:
    """`volume` with the pod's fsGroup and fsGroupChangePolicy (plugins decide if they apply)."""
    context = pod.spec.security_context
    if context is None or context.fs_group is None:
        return volume
    return msgspec.structs.replace(
        volume,
        fs_group=context.fs_group,
        fs_group_change_policy=context.fs_group_change_policy or "",
    )


def resolve_pod(
    pod: Pod,
    lookup: ObjectLookup,
    can_serve: CanServe,
    skip: Collection[int] = (),
    *,
    strict: bool = True,
) -> PodAdded | PodPending:
    """The desired-state event for a (validated) pod: `PodAdded`, or `PodPending` naming what
    its waiting volumes wait for (a claim not there or not bound yet, its PV not there yet,
    a CSI driver not registered on this node yet).

    Raises naming every volume that can't be resolved (one line lists all the
    volumes no plugin on this node serves). The volumes at the indices in
    `skip` are left out (they have problems of their own, already reported).
    With `strict` False (a pod already accepted, re-resolved because an
    object it waits for was applied), a claim-backed volume's problem is one
    more reason to wait, as the kubelet's populator keeps such a pod and
    retries it ("pod is not owner" included).
    """
    volumes: list[DesiredVolume] = []
    waiting: list[PendingVolume] = []
    used_by: dict[str, int] = {}
    problems = Problems()
    unsupported: list[str] = []
    for index, volume in enumerate(pod.spec.volumes):
        if index in skip:
            continue
        path = f"spec.volumes[{index}]"
        desired: DesiredVolume | None = None
        with problems.check():
            try:
                desired = _resolve_volume(pod, volume, path, lookup, can_serve, unsupported)
            except WaitsError as exc:
                waiting.append(exc.waiting)
            except InvalidObjectError as exc:
                claim = _claim_of(pod, volume)
                if strict or claim is None:
                    raise
                waiting.append(_problem_as_wait(volume.name, pod.metadata.ns, claim, exc, lookup))
        if desired is None:
            continue
        if desired.volume_id in used_by:
            problems.add(
                InvalidObjectError(
                    path,
                    f"volume {desired.volume_id} is already used by "
                    f"spec.volumes[{used_by[desired.volume_id]}] of this pod",
                )
            )
            continue
        used_by[desired.volume_id] = index
        volumes.append(_with_fs_group(pod, desired))
    if unsupported:
        problems.add(
            InvalidObjectError(
                "spec.volumes",
                f"no volume plugin on this node serves {', '.join(unsupported)}",
            )
        )
    problems.raise_if_any()
    meta = pod.metadata
    if waiting:
        return PodPending(
            pod_uid=meta.uid, namespace=meta.ns, name=meta.name, waiting=tuple(waiting)
        )
    return PodAdded(
        pod_uid=meta.uid,
        namespace=meta.ns,
        name=meta.name,
        volumes=tuple(volumes),
        service_account=pod.spec.account,
    )


def _resolve_volume(
    pod: Pod,
    volume: Volume,
    path: str,
    lookup: ObjectLookup,
    can_serve: CanServe,
    unsupported: list[str],
) -> DesiredVolume | None:
    """One volume of `pod` by its source (None: unsupported, named in `unsupported`)."""
    if volume.persistent_volume_claim is not None:
        return _resolve_claim(pod, volume, path, lookup, can_serve)
    if volume.ephemeral is not None:
        return _resolve_ephemeral(pod, volume, path, lookup, can_serve)
    if volume.csi is not None or volume.empty_dir is not None:
        return _resolve_inline(pod, volume, path, can_serve)
    if volume.host_path is not None:
        return _resolve_host_path(pod, volume, path, can_serve, unsupported)
    return _resolve_other(pod, volume, can_serve, unsupported)


def _claim_of(pod: Pod, volume: Volume) -> str | None:
    """The claim behind a volume (a persistentVolumeClaim's, an ephemeral one's), or None."""
    if volume.persistent_volume_claim is not None:
        return volume.persistent_volume_claim.claim_name
    if volume.ephemeral is not None:
        return ephemeral_claim_name(pod, volume)
    return None


def _problem_as_wait(
    name: str, namespace: str, claim: str, problem: InvalidObjectError, lookup: ObjectLookup
) -> PendingVolume:
    """A claim-backed volume's problem as what a pending pod waits for (its claim, and the
    PV the claim names: an apply of either re-resolves the pod)."""
    reason = "; ".join(p.message for p in flatten_problems(problem))
    pvc = lookup.claim(namespace, claim)
    bound = pvc.spec.volume_name if pvc is not None else ""
    needs = (volume_key(bound),) if bound else ()
    return PendingVolume(
        name=name, waits_for=claim_key(namespace, claim), reason=reason, needs=needs
    )


# ---------------------------------------------------------------- fingerprints


def spec_fingerprint(pod: Pod) -> tuple[VolumeFingerprint, ...]:
    """What a (validated) pod's spec says about its volumes, comparable with `added_fingerprint`.

    Pods are immutable: a pod re-applied under the same UID must have the same
    fingerprint. It is built from the pod alone, so a re-apply needs no claims.
    """
    prints: list[VolumeFingerprint] = []
    ns = pod.metadata.ns
    for volume in pod.spec.volumes:
        if volume.persistent_volume_claim is not None:
            src = volume.persistent_volume_claim
            prints.append(("pvc", volume.name, src.claim_name, src.read_only))
        elif volume.ephemeral is not None:
            prints.append(("pvc", volume.name, ephemeral_claim_name(pod, volume), False))
        elif volume.csi is not None:
            csi = volume.csi
            attrs = tuple(sorted(csi.volume_attributes.items()))
            ref = secret_ref(csi.node_publish_secret_ref, ns)
            prints.append(("csi", volume.name, csi.driver, csi.fs_type, attrs, csi.read_only, ref))
        elif volume.empty_dir is not None:
            empty = volume.empty_dir
            limit = parse_size("", empty.size_limit) if empty.size_limit is not None else None
            prints.append(("emptyDir", volume.name, empty.medium, limit))
        else:
            prints.append(("other", volume.name, SOURCES[volume.source()]))
    return tuple(sorted(prints, key=lambda p: str(p[1])))


def added_fingerprint(added: PodAdded) -> tuple[VolumeFingerprint, ...]:
    """The fingerprint of a recorded pod (see `spec_fingerprint`)."""
    prints: list[VolumeFingerprint] = []
    for vol in added.volumes:
        src = vol.source
        if vol.claim_name:
            prints.append(("pvc", vol.name, vol.claim_name, vol.claim_read_only))
        elif src.plugin == PLUGIN_CSI:
            attrs = tuple(sorted(src.attributes.items()))
            ref = src.node_publish_secret_ref
            prints.append(("csi", vol.name, src.driver, src.fs_type, attrs, vol.read_only, ref))
        elif src.plugin == PLUGIN_EMPTY_DIR:
            prints.append(("emptyDir", vol.name, src.medium, src.size_limit_bytes))
        else:
            prints.append(("other", vol.name, src.plugin))
    return tuple(sorted(prints, key=lambda p: str(p[1])))
