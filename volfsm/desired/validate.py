"""Checks of one object on its own: names, formats, quantities, required parts.

Each check raises `InvalidObjectError` with the field path inside the object;
the planner attributes it to the object. Checks that need other objects
(claims, volumes, what is already desired) live in `resolve` and `plan`.
"""

from __future__ import annotations

import json

from volfsm.desired.checks import no_backsteps_problem
from volfsm.desired.errors import InvalidObjectError, Problems
from volfsm.desired.names import (
    csi_driver_problem,
    dns_label_problem,
    dns_subdomain_problem,
    path_component_problem,
    volume_handle_problem,
)
from volfsm.desired.objects import (
    ObjectMeta,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
)
from volfsm.desired.quantity import quantity_to_bytes
from volfsm.desired.validate_volumes import HOST_PATH_TYPES, volume_problems


def check(path: str, problem: str | None) -> None:
    """Raise for `path` if a name rule reported a problem."""
    if problem is not None:
        raise InvalidObjectError(path, problem)


def parse_size(path: str, value: str | int | float) -> int:
    """A quantity in bytes, or an error naming `path`."""
    try:
        return quantity_to_bytes(value)
    except ValueError as exc:
        raise InvalidObjectError(path, str(exc)) from None


def check_meta(meta: ObjectMeta, *, namespaced: bool) -> None:
    """metadata.name is a DNS subdomain; metadata.namespace (if namespaced) a DNS label."""
    check("metadata.name", dns_subdomain_problem(meta.name))
    if namespaced:
        check("metadata.namespace", dns_label_problem(meta.ns))


def pv_size_bytes(pv: PersistentVolume) -> int:
    """spec.capacity.storage of a PV in bytes (required)."""
    capacity = pv.spec.capacity
    if capacity is None or capacity.storage is None:
        raise InvalidObjectError("spec.capacity.storage", "required field is missing")
    return parse_size("spec.capacity.storage", capacity.storage)


def validate_pv(pv: PersistentVolume) -> None:
    """A PV volfsm can serve: named, CSI, with a driver, a handle and a capacity."""
    check_meta(pv.metadata, namespaced=False)
    csi = pv.spec.csi
    if csi is None and pv.spec.other_source() == "hostPath":
        _check_pv_host_path(pv.spec.host_path or {})
    elif csi is None and pv.spec.local is not None:
        _check_pv_host_path({"path": pv.spec.local.path}, "spec.local.path")
        if not pv.spec.node_affinity:
            raise InvalidObjectError("spec.nodeAffinity", "a local PersistentVolume requires it")
    elif csi is None:
        other = pv.spec.other_source()
        found = f"spec.{other} is not served" if other else "spec.csi is missing"
        raise InvalidObjectError(
            "spec.csi", f"only CSI, hostPath and local PersistentVolumes are supported ({found})"
        )
    else:
        check("spec.csi.driver", csi_driver_problem(csi.driver))
        check("spec.csi.volumeHandle", volume_handle_problem(csi.volume_handle))
    pv_size_bytes(pv)
    ref = pv.spec.claim_ref
    if ref is not None and ref.name:
        check("spec.claimRef.name", dns_subdomain_problem(ref.name))


def _check_pv_host_path(host_path: dict[str, object], where: str = "spec.hostPath.path") -> None:
    """spec.hostPath (or spec.local) of a PV: an absolute path with no '..', a known type."""
    path = host_path.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidObjectError(where, "must be an absolute path")
    check(where, no_backsteps_problem(path))
    kind = host_path.get("type") or ""
    if kind not in HOST_PATH_TYPES and kind != "":
        raise InvalidObjectError("spec.hostPath.type", f"{kind!r} is an invalid hostPath type")


def validate_pvc(pvc: PersistentVolumeClaim) -> None:
    """A claim with valid names and, if given, a valid requested size."""
    check_meta(pvc.metadata, namespaced=True)
    if pvc.spec.volume_name:
        check("spec.volumeName", dns_subdomain_problem(pvc.spec.volume_name))
    requests = pvc.spec.resources.requests if pvc.spec.resources else None
    if requests is not None and requests.storage is not None:
        parse_size("spec.resources.requests.storage", requests.storage)
    claim_capacity_bytes(pvc)


def claim_capacity_bytes(pvc: PersistentVolumeClaim) -> int | None:
    """status.capacity.storage of a claim in bytes; None if the claim has none."""
    capacity = pvc.status.capacity if pvc.status is not None else None
    if capacity is None or capacity.storage is None:
        return None
    return parse_size("status.capacity.storage", capacity.storage)


def validate_pod(pod: Pod) -> None:
    """A pod whose UID and volume names are safe path components, each volume well-formed.

    Every problem is reported at once (an `InvalidObjectsError` for several).
    """
    problems = Problems()
    with problems.check():
        check_meta(pod.metadata, namespaced=True)
    with problems.check():
        check("metadata.uid", path_component_problem(pod.metadata.uid))
    seen: dict[str, int] = {}
    for index, volume in enumerate(pod.spec.volumes):
        path = f"spec.volumes[{index}]"
        with problems.check():
            check(f"{path}.name", path_component_problem(volume.name))
            if volume.name in seen:
                other = f"spec.volumes[{seen[volume.name]}]"
                raise InvalidObjectError(
                    f"{path}.name", f"duplicate volume name {volume.name!r} (also {other})"
                )
            seen[volume.name] = index
        sources = volume.sources()
        if len(sources) != 1:
            found = ", ".join(sources) if sources else "none"
            problems.add(
                InvalidObjectError(path, f"a volume needs exactly one source, found {found}")
            )
            continue
        volume_problems(volume, path, problems)
    _volume_mount_problems(pod, set(seen), problems)
    problems.raise_if_any()


def _volume_mount_problems(pod: Pod, volume_names: set[str], problems: Problems) -> None:
    """Every container's and init container's volumeMounts, as the API server checks them:
    each names a volume of the pod and has a mountPath; a subPath is relative with no '..',
    and not given together with subPathExpr."""
    groups = (("containers", pod.spec.containers), ("initContainers", pod.spec.init_containers))
    for group, containers in groups:
        for c_index, container in enumerate(containers):
            for m_index, mount in enumerate(container.volume_mounts):
                path = f"spec.{group}[{c_index}].volumeMounts[{m_index}]"
                if mount.name not in volume_names:
                    problems.add(
                        InvalidObjectError(
                            f"{path}.name", f"not found: the pod has no volume {mount.name!r}"
                        )
                    )
                if not mount.mount_path:
                    problems.add(InvalidObjectError(f"{path}.mountPath", "required"))
                with problems.check():
                    check(f"{path}.subPath", _sub_path_problem(mount.sub_path))
                if mount.sub_path and mount.sub_path_expr:
                    problems.add(
                        InvalidObjectError(
                            f"{path}.subPathExpr", "subPathExpr and subPath are mutually exclusive"
                        )
                    )


def _sub_path_problem(sub_path: str) -> str | None:
    """Why a subPath is refused (the API server's ValidateLocalDescendingPath), or None."""
    if sub_path.startswith("/"):
        return "must be a relative path"
    if ".." in sub_path.split("/"):
        return "must not contain '..'"
    return None


def check_pod_node(pod: Pod, node_name: str) -> None:
    """A pod bound to another node (spec.nodeName) is not this node's to mount.

    No nodeName, or no node name known here, accepts the pod: volfsm is the
    node it was sent to.
    """
    wanted = pod.spec.node_name
    if node_name and wanted and wanted != node_name:
        raise InvalidObjectError(
            "spec.nodeName",
            f"{json.dumps(wanted)} is not this node ({json.dumps(node_name)})",
        )
