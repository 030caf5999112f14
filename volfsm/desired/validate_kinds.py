"""Checks of the objects pods refer to, as the API server validates them.

Every problem of an object is reported at once. No message ever carries a
Secret's value: a bad value is named by its key only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from volfsm.desired.checks import MAX_DATA_BYTES, config_key_problem
from volfsm.desired.errors import InvalidObjectError, Problems
from volfsm.desired.kinds import (
    ClusterTrustBundle,
    ConfigMap,
    CSIDriver,
    Secret,
    ServiceAccount,
    b64decode,
)
from volfsm.desired.meta import ObjectMeta
from volfsm.desired.names import csi_driver_problem, dns_label_problem, dns_subdomain_problem
from volfsm.desired.validate_volumes import MAX_TOKEN_SECONDS, MIN_TOKEN_SECONDS

_PEM_BLOCK = re.compile(
    r"-----BEGIN (?P<type>[A-Z0-9 ]+)-----\r?\n(?P<body>.*?)-----END (?P=type)-----", re.S
)
_SIGNER = re.compile(r"[a-z0-9.-]+/[A-Za-z0-9._/-]+")


def _raise(path: str, problem: str | None) -> None:
    if problem is not None:
        raise InvalidObjectError(path, problem)


def _meta(meta: ObjectMeta, problems: Problems, *, namespaced: bool) -> None:
    with problems.check():
        _raise("metadata.name", dns_subdomain_problem(meta.name))
    if namespaced:
        with problems.check():
            _raise("metadata.namespace", dns_label_problem(meta.ns))


def _keys(data: Mapping[str, str], field: str, problems: Problems) -> None:
    for key in data:
        with problems.check():
            _raise(f"{field}[{key}]", config_key_problem(key))


def _size(values: Mapping[str, bytes], problems: Problems) -> None:
    total = sum(len(value) for value in values.values())
    if total > MAX_DATA_BYTES:
        problems.add(
            InvalidObjectError("data", f"too long: {total} bytes, at most {MAX_DATA_BYTES} allowed")
        )


def _decoded(data: Mapping[str, str], field: str, problems: Problems) -> dict[str, bytes]:
    """Each base64 value decoded; a bad one is named by its key, never shown."""
    out: dict[str, bytes] = {}
    for key, value in data.items():
        try:
            out[key] = b64decode(value)
        except ValueError as exc:
            problems.add(InvalidObjectError(f"{field}[{key}]", str(exc)))
    return out


def validate_config_map(cm: ConfigMap) -> None:
    """Names, keys (none in both data and binaryData), base64 binaryData, 1 MiB in all."""
    problems = Problems()
    _meta(cm.metadata, problems, namespaced=True)
    _keys(cm.data, "data", problems)
    _keys(cm.binary_data, "binaryData", problems)
    for key in sorted(set(cm.data) & set(cm.binary_data)):
        problems.add(InvalidObjectError(f"binaryData[{key}]", "duplicate of key in data"))
    values = {key: value.encode() for key, value in cm.data.items()}
    values.update(_decoded(cm.binary_data, "binaryData", problems))
    _size(values, problems)
    problems.raise_if_any()


def validate_secret(secret: Secret) -> None:
    """Names, keys, base64 data, 1 MiB in all; values never appear in a message."""
    problems = Problems()
    _meta(secret.metadata, problems, namespaced=True)
    _keys(secret.data, "data", problems)
    _keys(secret.string_data, "stringData", problems)
    values = _decoded(secret.data, "data", problems)
    values.update({key: value.encode() for key, value in secret.string_data.items()})
    _size(values, problems)
    if not secret.type:
        problems.add(InvalidObjectError("type", "must not be empty"))
    problems.raise_if_any()


def validate_service_account(account: ServiceAccount) -> None:
    """Names only."""
    problems = Problems()
    _meta(account.metadata, problems, namespaced=True)
    problems.raise_if_any()


def validate_cluster_trust_bundle(bundle: ClusterTrustBundle) -> None:
    """A name tied to its signer (`<signer with / as :>:...`), PEM CERTIFICATE blocks only."""
    problems = Problems()
    name, signer = bundle.metadata.name, bundle.spec.signer_name
    with problems.check():
        _raise("metadata.name", _ctb_name_problem(name, signer))
    if signer and _SIGNER.fullmatch(signer) is None:
        problems.add(
            InvalidObjectError("spec.signerName", f"{signer!r} must be a domain-prefixed path")
        )
    with problems.check():
        _raise("spec.trustBundle", pem_bundle_problem(bundle.spec.trust_bundle))
    problems.raise_if_any()


def _ctb_name_problem(name: str, signer: str) -> str | None:
    if not name or name in (".", "..") or "/" in name or "%" in name:
        return f"{name!r} must be a path segment name (no '/' or '%', not '.' or '..')"
    prefix = signer.replace("/", ":") + ":"
    if signer and not name.startswith(prefix):
        return f"must start with {prefix!r} (the signer name with '/' as ':')"
    if not signer and ":" in name:
        return "must not contain ':' without spec.signerName"
    return None


def pem_bundle_problem(text: str) -> str | None:
    """Why `text` is not a bundle of PEM CERTIFICATE blocks without headers, or None."""
    blocks = list(_PEM_BLOCK.finditer(text))
    if not blocks:
        return "must contain at least one PEM CERTIFICATE block"
    for index, block in enumerate(blocks):
        if block["type"] != "CERTIFICATE":
            return f"block {index} is a {block['type']}, only CERTIFICATE blocks are allowed"
        body = block["body"]
        if ":" in body:
            return f"block {index} has PEM headers, which are not allowed"
        try:
            b64decode(body)
        except ValueError:
            return f"block {index} is not valid base64"
    if len(text.encode()) > MAX_DATA_BYTES:
        return f"must be at most {MAX_DATA_BYTES} bytes"
    return None


def validate_csi_driver(driver: CSIDriver) -> None:
    """A driver name, token requests of unique audiences and allowed lifetimes."""
    problems = Problems()
    with problems.check():
        _raise("metadata.name", csi_driver_problem(driver.metadata.name))
    seen: set[str] = set()
    for index, request in enumerate(driver.spec.token_requests):
        where = f"spec.tokenRequests[{index}]"
        if request.audience in seen:
            problems.add(
                InvalidObjectError(f"{where}.audience", f"duplicate audience {request.audience!r}")
            )
        seen.add(request.audience)
        seconds = request.expiration_seconds
        if seconds is not None and not MIN_TOKEN_SECONDS <= seconds <= MAX_TOKEN_SECONDS:
            problems.add(
                InvalidObjectError(
                    f"{where}.expirationSeconds",
                    f"must be between {MIN_TOKEN_SECONDS} and 2^32 seconds",
                )
            )
    problems.raise_if_any()
