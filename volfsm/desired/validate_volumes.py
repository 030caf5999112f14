"""Checks of one pod volume on its own, as the API server validates it.

`volume_problems` records every problem of a volume (paths relative to the
pod: `spec.volumes[2].configMap.items[0].path`), so a pod with several bad
volumes is told about all of them at once. Whether a plugin serves the
volume is not checked here (that is resolution's question).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from volfsm.desired.checks import (
    config_key_problem,
    local_path_problem,
    mode_problem,
    no_backsteps_problem,
)
from volfsm.desired.errors import InvalidObjectError, Problems
from volfsm.desired.meta import KeyToPath
from volfsm.desired.names import csi_driver_problem, dns_subdomain_problem
from volfsm.desired.quantity import quantity_to_bytes
from volfsm.desired.volumes import (
    ClusterTrustBundleProjection,
    DownwardAPIVolumeFile,
    PodCertificateProjection,
    ProjectedVolumeSource,
    ServiceAccountTokenProjection,
    Volume,
)

FIELD_PATHS = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "metadata.labels",
        "metadata.annotations",
    }
)
"""The pod fields a downwardAPI volume may project (spec.* and status.* are env-only)."""
SUBSCRIPTED = ("metadata.labels['", "metadata.annotations['")
RESOURCES = frozenset(
    {
        "limits.cpu",
        "limits.memory",
        "limits.ephemeral-storage",
        "requests.cpu",
        "requests.memory",
        "requests.ephemeral-storage",
    }
)
HUGEPAGES = ("limits.hugepages-", "requests.hugepages-")
MEDIA = ("", "Memory", "HugePages")
HUGEPAGES_MEDIUM_PREFIX = "HugePages-"
HOST_PATH_TYPES = frozenset(
    {
        "",
        "DirectoryOrCreate",
        "Directory",
        "FileOrCreate",
        "File",
        "Socket",
        "CharDevice",
        "BlockDevice",
    }
)
KEY_TYPES = frozenset({"RSA3072", "RSA4096", "ECDSAP256", "ECDSAP384", "ECDSAP521", "ED25519"})
MIN_TOKEN_SECONDS = 600
MAX_TOKEN_SECONDS = 1 << 32


def _raise(path: str, problem: str | None) -> None:
    if problem is not None:
        raise InvalidObjectError(path, problem)


def volume_problems(volume: Volume, path: str, problems: Problems) -> None:
    """Record every problem of one (decoded) volume under `path`."""
    checks: list[tuple[object, Callable[[object, str, Problems], None]]] = [
        (volume.persistent_volume_claim, _claim),
        (volume.csi, _csi),
        (volume.empty_dir, _empty_dir),
        (volume.config_map, _config_map),
        (volume.secret, _secret),
        (volume.downward_api, _downward_api),
        (volume.projected, _projected),
        (volume.host_path, _host_path),
    ]
    for source, check in checks:
        if source is not None:
            check(source, f"{path}.{volume.source()}", problems)


def _claim(src: object, path: str, problems: Problems) -> None:
    with problems.check():
        _raise(f"{path}.claimName", dns_subdomain_problem(getattr(src, "claim_name", "")))


def _csi(src: object, path: str, problems: Problems) -> None:
    with problems.check():
        _raise(f"{path}.driver", csi_driver_problem(getattr(src, "driver", "")))


def _empty_dir(src: object, path: str, problems: Problems) -> None:
    with problems.check():
        _raise(f"{path}.medium", medium_problem(getattr(src, "medium", "")))
    limit = getattr(src, "size_limit", None)
    if limit is not None:
        with problems.check():
            try:
                quantity_to_bytes(limit)
            except ValueError as exc:
                raise InvalidObjectError(f"{path}.sizeLimit", str(exc)) from None


def medium_problem(medium: str) -> str | None:
    """Why `medium` is not an emptyDir medium of the API ('', Memory, HugePages,
    HugePages-<page size>), or None. Whether a plugin serves it is resolution's question."""
    if medium in MEDIA:
        return None
    size = medium.removeprefix(HUGEPAGES_MEDIUM_PREFIX)
    if size != medium:
        try:
            quantity_to_bytes(size)
        except ValueError:
            pass
        else:
            return None
    supported = ", ".join(repr(m) for m in (*MEDIA, f"{HUGEPAGES_MEDIUM_PREFIX}<page size>"))
    return f"unsupported value {medium!r} (supported: {supported})"


def _config_map(src: object, path: str, problems: Problems) -> None:
    with problems.check():
        _raise(f"{path}.name", dns_subdomain_problem(getattr(src, "name", "")))
    _items(getattr(src, "items", ()), path, problems)
    _mode(getattr(src, "default_mode", None), f"{path}.defaultMode", problems)


def _secret(src: object, path: str, problems: Problems) -> None:
    with problems.check():
        _raise(f"{path}.secretName", dns_subdomain_problem(getattr(src, "secret_name", "")))
    _items(getattr(src, "items", ()), path, problems)
    _mode(getattr(src, "default_mode", None), f"{path}.defaultMode", problems)


def _downward_api(src: object, path: str, problems: Problems) -> None:
    _downward_items(getattr(src, "items", ()), path, problems)
    _mode(getattr(src, "default_mode", None), f"{path}.defaultMode", problems)


def _host_path(src: object, path: str, problems: Problems) -> None:
    with problems.check():
        _raise(f"{path}.path", no_backsteps_problem(getattr(src, "path", "")))
    kind = getattr(src, "type", None) or ""
    if kind not in HOST_PATH_TYPES:
        with problems.check():
            raise InvalidObjectError(f"{path}.type", f"{kind!r} is an invalid hostPath type")


def _mode(mode: int | None, path: str, problems: Problems) -> None:
    with problems.check():
        _raise(path, mode_problem(mode))


def _items(items: Iterable[KeyToPath], path: str, problems: Problems) -> None:
    for index, item in enumerate(items):
        where = f"{path}.items[{index}]"
        with problems.check():
            _raise(f"{where}.key", config_key_problem(item.key))
        with problems.check():
            _raise(f"{where}.path", local_path_problem(item.path))
        _mode(item.mode, f"{where}.mode", problems)


def _downward_items(items: Iterable[DownwardAPIVolumeFile], path: str, problems: Problems) -> None:
    for index, item in enumerate(items):
        where = f"{path}.items[{index}]"
        with problems.check():
            _raise(f"{where}.path", local_path_problem(item.path))
        _mode(item.mode, f"{where}.mode", problems)
        with problems.check():
            _downward_source(item, where)


def _downward_source(item: DownwardAPIVolumeFile, where: str) -> None:
    if (item.field_ref is None) == (item.resource_field_ref is None):
        raise InvalidObjectError(where, "exactly one of fieldRef and resourceFieldRef is required")
    if item.field_ref is not None:
        field = item.field_ref.field_path
        if field not in FIELD_PATHS and not (
            field.startswith(SUBSCRIPTED) and field.endswith("']")
        ):
            raise InvalidObjectError(
                f"{where}.fieldRef.fieldPath",
                f"{field!r} is not a field a volume can project "
                f"(supported: {', '.join(sorted(FIELD_PATHS))}, metadata.labels['KEY'], "
                "metadata.annotations['KEY'])",
            )
        return
    ref = item.resource_field_ref
    assert ref is not None
    if ref.resource not in RESOURCES and not ref.resource.startswith(HUGEPAGES):
        raise InvalidObjectError(
            f"{where}.resourceFieldRef.resource",
            f"{ref.resource!r} is not a resource (supported: {', '.join(sorted(RESOURCES))}, "
            "limits.hugepages-SIZE, requests.hugepages-SIZE)",
        )
    if ref.divisor is not None:
        try:
            quantity_to_bytes(ref.divisor)
        except ValueError as exc:
            raise InvalidObjectError(f"{where}.resourceFieldRef.divisor", str(exc)) from None


def _projected(src: object, path: str, problems: Problems) -> None:
    assert isinstance(src, ProjectedVolumeSource)
    _mode(src.default_mode, f"{path}.defaultMode", problems)
    file_paths: dict[str, str] = {}
    for index, entry in enumerate(src.sources):
        where = f"{path}.sources[{index}]"
        found = entry.sources()
        if len(found) != 1:
            with problems.check():
                shown = ", ".join(found) if found else "none"
                raise InvalidObjectError(where, f"needs exactly one source, found {shown}")
            continue
        _projection(entry, f"{where}.{found[0]}", problems, file_paths)


def _projection(entry: object, where: str, problems: Problems, file_paths: dict[str, str]) -> None:
    """One projected source; `file_paths` (path -> where) catches duplicates across sources."""
    if (cm := getattr(entry, "config_map", None)) is not None:
        with problems.check():
            _raise(f"{where}.name", dns_subdomain_problem(cm.name))
        _items(cm.items, where, problems)
        _claim_paths((i.path for i in cm.items), where, problems, file_paths)
    elif (secret := getattr(entry, "secret", None)) is not None:
        with problems.check():
            _raise(f"{where}.name", dns_subdomain_problem(secret.name))
        _items(secret.items, where, problems)
        _claim_paths((i.path for i in secret.items), where, problems, file_paths)
    elif (downward := getattr(entry, "downward_api", None)) is not None:
        _downward_items(downward.items, where, problems)
        _claim_paths((i.path for i in downward.items), where, problems, file_paths)
    elif (token := getattr(entry, "service_account_token", None)) is not None:
        _token(token, where, problems)
    elif (bundle := getattr(entry, "cluster_trust_bundle", None)) is not None:
        _trust_bundle(bundle, where, problems)
        _claim_paths([bundle.path], where, problems, file_paths)
    elif (cert := getattr(entry, "pod_certificate", None)) is not None:
        _pod_certificate(cert, where, problems)


def _claim_paths(
    paths: Iterable[str], where: str, problems: Problems, file_paths: dict[str, str]
) -> None:
    for path in paths:
        other = file_paths.setdefault(path, where)
        if other != where:
            with problems.check():
                raise InvalidObjectError(
                    where, f"conflicting duplicate paths: {path!r} is also written by {other}"
                )


def _token(token: ServiceAccountTokenProjection, where: str, problems: Problems) -> None:
    with problems.check():
        _raise(f"{where}.path", local_path_problem(token.path))
    seconds = token.expiration_seconds
    if seconds is not None and not MIN_TOKEN_SECONDS <= seconds <= MAX_TOKEN_SECONDS:
        with problems.check():
            too = (
                "less than 10 minutes" if seconds < MIN_TOKEN_SECONDS else "more than 2^32 seconds"
            )
            raise InvalidObjectError(
                f"{where}.expirationSeconds", f"may not specify a duration {too}"
            )


def _trust_bundle(bundle: ClusterTrustBundleProjection, where: str, problems: Problems) -> None:
    with problems.check():
        _raise(f"{where}.path", local_path_problem(bundle.path))
    if bundle.name is not None and (bundle.signer_name is not None or bundle.label_selector):
        with problems.check():
            raise InvalidObjectError(where, "name cannot be given with signerName or labelSelector")
    elif bundle.name is None and bundle.signer_name is None:
        with problems.check():
            raise InvalidObjectError(where, "either name or signerName must be given")


def _pod_certificate(cert: PodCertificateProjection, where: str, problems: Problems) -> None:
    if cert.key_type not in KEY_TYPES:
        with problems.check():
            raise InvalidObjectError(
                f"{where}.keyType",
                f"{cert.key_type!r} is not a key type (supported: {', '.join(sorted(KEY_TYPES))})",
            )
    paths = [cert.credential_bundle_path, cert.key_path, cert.certificate_chain_path]
    if not any(paths):
        with problems.check():
            raise InvalidObjectError(
                where, "give credentialBundlePath, or keyPath and certificateChainPath"
            )
    for name, value in zip(
        ("credentialBundlePath", "keyPath", "certificateChainPath"), paths, strict=True
    ):
        if value:
            with problems.check():
                _raise(f"{where}.{name}", local_path_problem(value))
