"""Pod certificates for projected ``podCertificate`` sources (alpha in the kubelet, 1.34).

For each source the node generates a private key of the requested
``keyType`` (RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521, ED25519) and
has a certificate issued for it by a `CertSource`:

* `CommandCertSource` (``serve --cert-command CMD``): runs CMD with what a
  PodCertificateRequest carries in its environment (``VOLFSM_SIGNER_NAME``,
  ``VOLFSM_NAMESPACE``, ``VOLFSM_POD_NAME``, ``VOLFSM_POD_UID``,
  ``VOLFSM_SERVICE_ACCOUNT``, ``VOLFSM_NODE_NAME``,
  ``VOLFSM_MAX_EXPIRATION_SECONDS``, ``VOLFSM_KEY_TYPE``,
  ``VOLFSM_USER_ANNOTATIONS`` as JSON) and the public key (PEM, PKIX) on
  stdin; its stdout is the certificate chain, leaf first, PEM
  ``CERTIFICATE`` blocks only, and optionally a line ``beginRefreshAt:
  <RFC 3339 time>`` (the signer's refresh hint). `parse_chain` checks it.
* `LocalCA` (the default): a **node-local CA** (its key and self-signed
  certificate in ``<data-dir>/tokens/ca.pem``, 0600), trusted by no one
  else: it exists so that pods and tests see a real key, certificate chain
  and refresh. The certificate names the pod (``CN=<namespace>/<pod>``,
  URI SAN ``spiffe://volfsm.local/ns/<namespace>/sa/<service account>``)
  and lives ``maxExpirationSeconds`` (default 86400, as the API).

`CertManager` keeps one credential per (pod, source) and issues a new key
and certificate at the signer's ``beginRefreshAt`` (as the kubelet), 80%
into the lifetime when the signer gives none. A failed refresh keeps the
current credential until it expires. The private key never leaves the
node: the command gets the public key only, and nothing of a key or
certificate is logged or put in an error.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID
from loguru import logger

from volfsm.plugins.objectvol.command import CommandError, OperatorCommand
from volfsm.plugins.objectvol.tokens import REFRESH_FRACTION, write_private

log = logger.bind(logger_name="volfsm.plugins.objectvol.certs")

DEFAULT_MAX_EXPIRATION_S = 86400
REFRESH_RETRY_S = 60.0
"""After a failed refresh, the next try (the kubelet's refresh pass runs every minute)."""
MAX_CLOCK_SKEW_S = 300.0
"""How far in the future a certificate's notBefore may be (the API server's 5 minutes)."""
PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey
PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?-----END \1-----", re.S)
REFRESH_LINE = re.compile(r"beginRefreshAt:\s*(\S+)")
KEY_TYPES: dict[str, Callable[[], PrivateKey]] = {
    "RSA3072": lambda: rsa.generate_private_key(65537, 3072),
    "RSA4096": lambda: rsa.generate_private_key(65537, 4096),
    "ECDSAP256": lambda: ec.generate_private_key(ec.SECP256R1()),
    "ECDSAP384": lambda: ec.generate_private_key(ec.SECP384R1()),
    "ECDSAP521": lambda: ec.generate_private_key(ec.SECP521R1()),
    "ED25519": ed25519.Ed25519PrivateKey.generate,
}


class CertError(Exception):
    """No certificate could be had; names no key material."""


@dataclass(frozen=True)
class CertKey:
    """What a credential is for: one podCertificate source of one pod."""

    namespace: str
    pod_name: str
    pod_uid: str
    service_account: str
    signer_name: str
    key_type: str
    expiration_seconds: int
    source: str
    """The source's paths, telling two sources of a pod apart."""
    user_annotations: tuple[tuple[str, str], ...] = ()
    """The source's userAnnotations, for the signer (sorted pairs)."""


@dataclass(frozen=True)
class Issued:
    """A signer's answer: the chain (PEM, leaf first) and its times (unix seconds)."""

    chain_pem: bytes
    not_before: float
    not_after: float
    begin_refresh_at: float


class CertSource(Protocol):
    """Issues a certificate for a public key (a PodCertificateRequest's signer)."""

    def issue(self, key: CertKey, public_key: PublicKey) -> Issued:
        """The chain for `public_key`; `CertError` if none."""


def default_refresh_at(not_before: float, not_after: float) -> float:
    """80% into the lifetime: when to refresh if the signer gives no beginRefreshAt."""
    return not_before + REFRESH_FRACTION * (not_after - not_before)


@dataclass(frozen=True)
class Credential:
    """A private key and its certificate chain (PEM). Its repr shows neither."""

    key_pem: bytes
    chain_pem: bytes
    not_before: float
    not_after: float
    begin_refresh_at: float

    def __repr__(self) -> str:
        return f"Credential(not_before={self.not_before:.0f}, not_after={self.not_after:.0f})"

    def refresh_at(self) -> float:
        """When a new key and certificate are due (the signer's beginRefreshAt)."""
        return self.begin_refresh_at


def _pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class LocalCA:
    """A node-local CA: an ECDSA P-256 key and a self-signed certificate, kept in `path`."""

    def __init__(self, path: Path | None, node: str) -> None:
        self.node = node
        self.key, self.cert = self._load(path) if path and path.exists() else self._make(path)

    def _make(self, path: Path | None) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, f"volfsm node-local CA {self.node}")]
        )
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256())
        )
        if path is not None:
            write_private(path, _pem(key) + cert.public_bytes(serialization.Encoding.PEM))
        return key, cert

    @staticmethod
    def _load(path: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        data = path.read_bytes()
        key = serialization.load_pem_private_key(data, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise CertError(f"{path} holds no ECDSA CA key")
        return key, x509.load_pem_x509_certificate(data)

    def issue(self, key: CertKey, public_key: PublicKey) -> Issued:
        """The certificate then the CA's; refresh 80% into the lifetime."""
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        after = now + datetime.timedelta(seconds=key.expiration_seconds)
        spiffe = f"spiffe://volfsm.local/ns/{key.namespace}/sa/{key.service_account}"
        subject = x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, f"{key.namespace}/{key.pod_name}")]
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(after)
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(spiffe)]),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        chain = cert.public_bytes(serialization.Encoding.PEM) + self.cert.public_bytes(
            serialization.Encoding.PEM
        )
        start, end = now.timestamp(), after.timestamp()
        return Issued(chain, start, end, default_refresh_at(start, end))


class CertManager:
    """One credential per (pod, source), renewed with a new key at its refresh time."""

    def __init__(self, source: CertSource, clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self._clock = clock
        self._cache: dict[CertKey, Credential] = {}
        self._lock = threading.Lock()

    def get(self, key: CertKey) -> Credential:
        """The cached credential unless it is due; a new key and certificate otherwise.

        A failed refresh keeps the cached credential until it expires (retried
        after `REFRESH_RETRY_S`); `CertError` when there is none left."""
        with self._lock:
            cached = self._cache.get(key)
        now = self._clock()
        if cached is not None and now < cached.refresh_at():
            return cached
        try:
            fresh = self._issue(key)
        except CertError as exc:
            if cached is None:
                raise
            if now >= cached.not_after:
                raise CertError(f"certificate expired and refresh failed: {exc}") from None
            log.warning(
                "podCertificate {}/{} {}: refresh failed, the current certificate stays "
                "until it expires: {}",
                key.namespace,
                key.pod_name,
                key.signer_name,
                exc,
            )
            fresh = dataclasses.replace(
                cached, begin_refresh_at=min(now + REFRESH_RETRY_S, cached.not_after)
            )
        with self._lock:
            self._cache[key] = fresh
        return fresh

    def _issue(self, key: CertKey) -> Credential:
        make = KEY_TYPES.get(key.key_type)
        if make is None:
            raise CertError(f"unsupported keyType {key.key_type!r} (one of {', '.join(KEY_TYPES)})")
        private = make()
        issued = self.source.issue(key, private.public_key())
        return Credential(
            _pem(private),
            issued.chain_pem,
            issued.not_before,
            issued.not_after,
            issued.begin_refresh_at,
        )

    def forget_pod(self, pod_uid: str) -> None:
        """Drop a pod's credentials (its projected volume was torn down)."""
        with self._lock:
            for key in [k for k in self._cache if k.pod_uid == pod_uid]:
                del self._cache[key]


class CommandCertSource:
    """Runs an operator's command for each certificate (see the module doc)."""

    def __init__(self, command: str, node: str, clock: Callable[[], float] = time.time) -> None:
        self.command = OperatorCommand(command, "--cert-command")
        self.node = node
        self._clock = clock

    def issue(self, key: CertKey, public_key: PublicKey) -> Issued:
        """The command's chain for `public_key`, checked by `parse_chain`."""
        env = {
            "VOLFSM_SIGNER_NAME": key.signer_name,
            "VOLFSM_NAMESPACE": key.namespace,
            "VOLFSM_POD_NAME": key.pod_name,
            "VOLFSM_POD_UID": key.pod_uid,
            "VOLFSM_SERVICE_ACCOUNT": key.service_account,
            "VOLFSM_NODE_NAME": self.node,
            "VOLFSM_MAX_EXPIRATION_SECONDS": str(key.expiration_seconds),
            "VOLFSM_KEY_TYPE": key.key_type,
            "VOLFSM_USER_ANNOTATIONS": json.dumps(dict(key.user_annotations), sort_keys=True),
        }
        pem = public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        try:
            done = self.command.run(env=env, stdin=pem)
        except CommandError as exc:
            raise CertError(str(exc)) from None
        what = f"--cert-command {self.command.name!r}"
        if done.returncode != 0:
            line = done.stderr_line()
            raise CertError(f"{what} exited {done.returncode}{': ' + line if line else ''}")
        try:
            return parse_chain(done.stdout, public_key, key.expiration_seconds, self._clock())
        except CertError as exc:
            raise CertError(f"{what}: {exc}") from None


def parse_chain(out: bytes, public_key: PublicKey, max_lifetime_s: int, now: float) -> Issued:
    """A signer's output checked: PEM CERTIFICATE blocks only (leaf first) and an optional
    ``beginRefreshAt:`` line; the leaf for `public_key`, valid now, living at most
    `max_lifetime_s`. `CertError` names the problem, never the output."""
    try:
        text = out.decode("ascii")
    except UnicodeDecodeError:
        raise CertError("its output is not PEM text") from None
    certs = [_certificate(n, m) for n, m in enumerate(PEM_BLOCK.finditer(text), 1)]
    if not certs:
        raise CertError("it printed no PEM CERTIFICATE block")
    hint = _refresh_hint(PEM_BLOCK.sub("", text))
    leaf = certs[0]
    if _spki(leaf.public_key()) != _spki(public_key):
        raise CertError("the leaf certificate is not for the node's key (its public key differs)")
    start = leaf.not_valid_before_utc.timestamp()
    end = leaf.not_valid_after_utc.timestamp()
    if end <= now:
        raise CertError(f"the leaf certificate expired at {_iso(end)}")
    if start > now + MAX_CLOCK_SKEW_S:
        raise CertError(f"the leaf certificate is not valid before {_iso(start)}")
    if end - start > max_lifetime_s:
        raise CertError(
            f"the leaf certificate lives {end - start:.0f}s, over maxExpirationSeconds "
            f"{max_lifetime_s}"
        )
    refresh = default_refresh_at(start, end) if hint is None else hint
    if not start <= refresh < end:
        raise CertError(f"beginRefreshAt {_iso(refresh)} is outside the leaf's validity")
    chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)
    return Issued(chain, start, end, refresh)


def _certificate(number: int, block: re.Match[str]) -> x509.Certificate:
    if block[1] != "CERTIFICATE":
        raise CertError(f"PEM block {number} is a {block[1]} block, not a CERTIFICATE")
    try:
        return x509.load_pem_x509_certificate(block[0].encode())
    except ValueError:
        raise CertError(f"PEM block {number} is not a valid certificate") from None


def _refresh_hint(outside: str) -> float | None:
    """The ``beginRefreshAt:`` line's time; `CertError` for any other text."""
    hint: float | None = None
    for line in (ln.strip() for ln in outside.splitlines()):
        if not line:
            continue
        found = REFRESH_LINE.fullmatch(line)
        if found is None:
            raise CertError("it printed text other than PEM CERTIFICATE blocks and beginRefreshAt")
        try:
            when = datetime.datetime.fromisoformat(found[1])
        except ValueError:
            raise CertError("its beginRefreshAt is not an RFC 3339 time") from None
        if when.tzinfo is None:
            raise CertError("its beginRefreshAt has no time zone")
        hint = when.timestamp()
    return hint


def _spki(key: object) -> bytes:
    public_bytes = getattr(key, "public_bytes", None)
    if public_bytes is None:
        return b""
    data: bytes = public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return data


def _iso(when: float) -> str:
    return datetime.datetime.fromtimestamp(when, datetime.UTC).isoformat(timespec="seconds")
