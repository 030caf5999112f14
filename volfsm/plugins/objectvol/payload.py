"""What a configMap, secret, downwardAPI or projected volume holds (kubelet's MakePayload).

Each builder returns a `Payload`: the files (path -> bytes and mode), the
versions of the objects it read (recorded in the VolumeMounted event, so
`replay`/`explain` can tell which ConfigMap a pod had when; names and
versions only, never values) and when a token in it wants refreshing.
Problems raise `PayloadError` with the kubelet's wording; a projected volume
collects every source's problems first and writes nothing if any.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from volfsm.desired.meta import KeyToPath
from volfsm.desired.objects import Pod
from volfsm.desired.volumes import (
    ClusterTrustBundleProjection,
    DownwardAPIVolumeFile,
    PodCertificateProjection,
    ServiceAccountTokenProjection,
    Volume,
    VolumeProjection,
)
from volfsm.node.atomicwriter import DEFAULT_FILE_MODE, FileProjection
from volfsm.objects import ObjectStore, StoredObject, Version
from volfsm.objects.views import config_map_data
from volfsm.plugins.objectvol.certs import (
    DEFAULT_MAX_EXPIRATION_S,
    CertError,
    CertKey,
    CertManager,
)
from volfsm.plugins.objectvol.downward import DownwardAPIError, field_value, resource_value
from volfsm.plugins.objectvol.tokens import (
    DEFAULT_EXPIRATION_S,
    TokenError,
    TokenKey,
    TokenManager,
)

TOKEN_SECURE_MODE = 0o600


class PayloadError(Exception):
    """The volume cannot be filled (missing object or key, bad item); says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Payload:
    """The files of a volume and what they were made from."""

    files: dict[str, FileProjection] = field(default_factory=dict)
    versions: list[str] = field(default_factory=list)
    refresh_at: float | None = None

    def merge(self, other: Payload) -> None:
        """Add another source's files (a later source wins a path, as in the kubelet)."""
        self.files.update(other.files)
        self.versions.extend(other.versions)
        if other.refresh_at is not None:
            self.refresh_at = min(self.refresh_at or other.refresh_at, other.refresh_at)

    def describe(self) -> str:
        """One line for the log: the versions read, no content."""
        return "; ".join(self.versions)


@dataclass(frozen=True)
class Context:
    """What payload builders read: the store, the pod, the token manager, node resources."""

    store: ObjectStore
    pod: Pod
    tokens: TokenManager | None
    allocatable: Mapping[str, Fraction]
    certs: CertManager | None = None


def _mode(mode: int | None, default: int) -> int:
    return default if mode is None else mode


def _version(kind: str, ns: str, name: str, version: Version) -> str:
    return (
        f"{kind} {ns}/{name} uid={version.uid} rv={version.resource_version} {version.content_hash}"
    )


def _keyed(
    kind: str,
    ns: str,
    name: str,
    values: Mapping[str, bytes] | None,
    version: Version | None,
    items: tuple[KeyToPath, ...],
    optional: bool,
    default_mode: int,
) -> Payload:
    """A configMap or secret (source or projection): every key, or the `items`."""
    out = Payload()
    if values is None or version is None:
        if not optional:
            plural = "configmaps" if kind == "ConfigMap" else "secrets"
            raise PayloadError("NotFound", f'{plural} "{name}" not found in namespace {ns}')
        out.versions.append(f"{kind} {ns}/{name} absent (optional)")
        return out
    out.versions.append(_version(kind, ns, name, version))
    if not items:
        for key, data in values.items():
            out.files[key] = FileProjection(data, default_mode)
        return out
    for item in items:
        if item.key not in values:
            if optional:
                continue
            what = (
                "configmap references non-existent config key"
                if kind == "ConfigMap"
                else ("references non-existent secret key")
            )
            raise PayloadError("KeyNotFound", f"{what}: {item.key}")
        out.files[item.path] = FileProjection(values[item.key], _mode(item.mode, default_mode))
    return out


CONFIG_MAP_CACHE_SIZE = 1024
_ConfigMapFiles = tuple[StoredObject, dict[str, bytes], Version]
_decoded_config_maps: dict[tuple[int, str, str], _ConfigMapFiles] = {}
"""(store, namespace, name) -> the ConfigMap's files as last decoded, with the stored object
they came from: the 100 pods of a ConfigMap's update decode it once, not 100 times."""


def _config_map_files(store: ObjectStore, ns: str, name: str) -> _ConfigMapFiles | None:
    stored = store.get("ConfigMap", ns, name)
    if stored is None:
        return None
    key = (id(store), ns, name)
    known = _decoded_config_maps.get(key)
    if known is not None and known[0] is stored:
        return known
    cm = config_map_data(stored)
    found = (stored, cm.files(), cm.version)
    if len(_decoded_config_maps) >= CONFIG_MAP_CACHE_SIZE:
        _decoded_config_maps.clear()
    _decoded_config_maps[key] = found
    return found


def config_map_payload(
    ctx: Context, name: str, items: tuple[KeyToPath, ...], optional: bool, default_mode: int
) -> Payload:
    """A configMap volume or projection."""
    ns = ctx.pod.metadata.ns
    found = _config_map_files(ctx.store, ns, name)
    values = found[1] if found is not None else None
    version = found[2] if found is not None else None
    return _keyed("ConfigMap", ns, name, values, version, items, optional, default_mode)


def secret_payload(
    ctx: Context, name: str, items: tuple[KeyToPath, ...], optional: bool, default_mode: int
) -> Payload:
    """A secret volume or projection."""
    ns = ctx.pod.metadata.ns
    secret = ctx.store.secret(ns, name)
    values = dict(secret.data) if secret is not None else None
    version = secret.version if secret is not None else None
    return _keyed("Secret", ns, name, values, version, items, optional, default_mode)


def downward_payload(
    ctx: Context, items: tuple[DownwardAPIVolumeFile, ...], default_mode: int
) -> Payload:
    """A downwardAPI volume or projection (every item's problem named at once)."""
    out = Payload()
    problems: list[str] = []
    for item in items:
        try:
            if item.field_ref is not None:
                text = field_value(ctx.pod, item.field_ref)
            elif item.resource_field_ref is not None:
                text = resource_value(ctx.pod, item.resource_field_ref, ctx.allocatable)
            else:
                raise DownwardAPIError("neither fieldRef nor resourceFieldRef")
        except DownwardAPIError as exc:
            problems.append(f"{item.path}: {exc}")
            continue
        out.files[item.path] = FileProjection(text.encode(), _mode(item.mode, default_mode))
    if problems:
        raise PayloadError("InvalidDownwardAPI", "; ".join(problems))
    meta = ctx.pod.metadata
    out.versions.append(f"Pod {meta.ns}/{meta.name} metadata")
    return out


def token_payload(
    ctx: Context, source: ServiceAccountTokenProjection, mode: int, fs_user: int | None = None
) -> Payload:
    """A serviceAccountToken projection: the token file (never the token in `versions`)."""
    if ctx.tokens is None:
        raise PayloadError("NoTokenSource", "this node has no token source")
    meta = ctx.pod.metadata
    key = TokenKey(
        namespace=meta.ns,
        service_account=ctx.pod.spec.account,
        audiences=(source.audience,) if source.audience else (),
        expiration_seconds=source.expiration_seconds or DEFAULT_EXPIRATION_S,
        pod_name=meta.name,
        pod_uid=meta.uid,
    )
    try:
        token = ctx.tokens.get(key)
    except TokenError as exc:
        raise PayloadError("TokenRequestFailed", f"failed to fetch token: {exc}") from None
    out = Payload(refresh_at=token.refresh_at())
    out.files[source.path] = FileProjection(token.text.encode(), mode, fs_user)
    out.versions.append(
        f"token {meta.ns}/{key.service_account} issued={token.issued_at:.0f} "
        f"expires={token.expires_at:.0f}"
    )
    return out


def certificate_payload(
    ctx: Context, source: PodCertificateProjection, mode: int, fs_user: int | None = None
) -> Payload:
    """A podCertificate projection: a new key and its certificate chain, from the signer."""
    if ctx.certs is None:
        raise PayloadError("NoCertificateSource", "this node has no certificate source")
    meta = ctx.pod.metadata
    paths = (source.credential_bundle_path, source.key_path, source.certificate_chain_path)
    key = CertKey(
        namespace=meta.ns,
        pod_name=meta.name,
        pod_uid=meta.uid,
        service_account=ctx.pod.spec.account,
        signer_name=source.signer_name,
        key_type=source.key_type,
        expiration_seconds=source.max_expiration_seconds or DEFAULT_MAX_EXPIRATION_S,
        source="|".join(paths),
        user_annotations=tuple(sorted(source.user_annotations.items())),
    )
    try:
        cred = ctx.certs.get(key)
    except CertError as exc:
        raise PayloadError("CertificateFailed", f"podCertificate: {exc}") from None
    out = Payload(refresh_at=cred.refresh_at())
    if source.credential_bundle_path:
        out.files[source.credential_bundle_path] = FileProjection(
            cred.key_pem + cred.chain_pem, mode, fs_user
        )
    if source.key_path:
        out.files[source.key_path] = FileProjection(cred.key_pem, mode, fs_user)
    if source.certificate_chain_path:
        out.files[source.certificate_chain_path] = FileProjection(cred.chain_pem, mode, fs_user)
    out.versions.append(
        f"podCertificate {source.signer_name} {source.key_type} "
        f"valid {cred.not_before:.0f}-{cred.not_after:.0f}"
    )
    return out


def trust_bundle_payload(
    ctx: Context, source: ClusterTrustBundleProjection, mode: int, fs_user: int | None = None
) -> Payload:
    """A clusterTrustBundle projection: one bundle by name, or a signer's matching bundles."""
    out = Payload()
    if source.name:
        stored = ctx.store.get("ClusterTrustBundle", "", source.name)
        found = [stored] if stored is not None else []
    else:
        found = ctx.store.cluster_trust_bundles(source.signer_name or "", source.label_selector)
    if not found:
        if source.optional:
            return out
        what = source.name or f"signer {source.signer_name}"
        raise PayloadError("NotFound", f"no ClusterTrustBundle found for {what}")
    blocks: list[str] = []
    for stored in found:
        spec = getattr(stored.obj, "spec", None)
        for block in _pem_blocks(getattr(spec, "trust_bundle", "")):
            if block not in blocks:
                blocks.append(block)
        out.versions.append(_version("ClusterTrustBundle", "", stored.name, Version.of(stored)))
    out.files[source.path] = FileProjection("".join(blocks).encode(), mode, fs_user)
    return out


def _pem_blocks(text: str) -> list[str]:
    """Certificate blocks, normalized: headers and text between blocks dropped."""
    blocks: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("-----BEGIN "):
            current = [line]
        elif current is not None:
            current.append(line)
            if line.startswith("-----END "):
                body = [ln for ln in current if ":" not in ln or ln.startswith("-----")]
                blocks.append("\n".join(body) + "\n")
                current = None
    return blocks


def volume_payload(ctx: Context, volume: Volume) -> Payload:
    """The payload of a pod volume of one of the four kinds."""
    if volume.config_map is not None:
        src = volume.config_map
        mode = _mode(src.default_mode, DEFAULT_FILE_MODE)
        return config_map_payload(ctx, src.name, src.items, bool(src.optional), mode)
    if volume.secret is not None:
        sec = volume.secret
        mode = _mode(sec.default_mode, DEFAULT_FILE_MODE)
        return secret_payload(ctx, sec.secret_name, sec.items, bool(sec.optional), mode)
    if volume.downward_api is not None:
        dapi = volume.downward_api
        return downward_payload(ctx, dapi.items, _mode(dapi.default_mode, DEFAULT_FILE_MODE))
    if volume.projected is not None:
        return projected_payload(ctx, volume)
    raise PayloadError("InvalidArgument", f"volume {volume.name!r} is not an object volume")


def projected_payload(ctx: Context, volume: Volume) -> Payload:
    """Every source of a projected volume; all problems named, nothing written if any."""
    assert volume.projected is not None
    default_mode = _mode(volume.projected.default_mode, DEFAULT_FILE_MODE)
    security = ctx.pod.spec.security_context
    secure = security is not None and (
        security.fs_group is not None or security.run_as_user is not None
    )
    token_mode = TOKEN_SECURE_MODE if secure else default_mode  # the kubelet: fsUser/fsGroup
    fs_user = security.run_as_user if security is not None else None
    out = Payload()
    problems: list[str] = []
    for index, source in enumerate(volume.projected.sources):
        try:
            out.merge(_projection(ctx, source, default_mode, (token_mode, fs_user)))
        except PayloadError as exc:
            problems.append(f"sources[{index}]: {exc}")
    if problems:
        raise PayloadError("ProjectionFailed", "; ".join(problems))
    return out


def _projection(
    ctx: Context, source: VolumeProjection, default_mode: int, secured: tuple[int, int | None]
) -> Payload:
    """One source's payload; `secured` is (mode, owner uid) of token and bundle files."""
    if source.config_map is not None:
        cm = source.config_map
        return config_map_payload(ctx, cm.name, cm.items, bool(cm.optional), default_mode)
    if source.secret is not None:
        sec = source.secret
        return secret_payload(ctx, sec.name, sec.items, bool(sec.optional), default_mode)
    if source.downward_api is not None:
        return downward_payload(ctx, source.downward_api.items, default_mode)
    if source.service_account_token is not None:
        return token_payload(ctx, source.service_account_token, *secured)
    if source.cluster_trust_bundle is not None:
        return trust_bundle_payload(ctx, source.cluster_trust_bundle, *secured)
    if source.pod_certificate is not None:
        return certificate_payload(ctx, source.pod_certificate, *secured)
    raise PayloadError(
        "Unsupported", f"projected source {', '.join(source.sources())} is not served"
    )
