"""Pod certificates for projected ``podCertificate`` sources (alpha in the kubelet, 1.34).

For each source the node generates a private key of the requested
``keyType`` (RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521, ED25519) and
has a certificate issued for it. The issuer here is a **node-local CA**
(its key and self-signed certificate in ``<data-dir>/tokens/ca.pem``,
0600), trusted by no one else: it exists so that pods and tests see a real
key, certificate chain and refresh. The certificate names the pod
(``CN=<namespace>/<pod>``, URI SAN
``spiffe://volfsm.local/ns/<namespace>/sa/<service account>``) and lives
``maxExpirationSeconds`` (default 86400, as the API). `CertManager` keeps one
credential per (pod, source) and issues a new key and certificate once 80%
of the lifetime has passed (the kubelet refreshes at the signer's
``beginRefreshAt``). Nothing of a key or certificate is logged.

Not done: ``serve --cert-command`` (an operator's signer); only the
node-local CA issues.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

from volfsm.plugins.objectvol.tokens import REFRESH_FRACTION, write_private

DEFAULT_MAX_EXPIRATION_S = 86400
PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
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


@dataclass(frozen=True)
class Credential:
    """A private key and its certificate chain (PEM). Its repr shows neither."""

    key_pem: bytes
    chain_pem: bytes
    not_before: float
    not_after: float

    def __repr__(self) -> str:
        return f"Credential(not_before={self.not_before:.0f}, not_after={self.not_after:.0f})"

    def refresh_at(self) -> float:
        """80% into its lifetime."""
        return self.not_before + REFRESH_FRACTION * (self.not_after - self.not_before)


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

    def issue(self, key: CertKey, public_key: object) -> tuple[bytes, float, float]:
        """(chain PEM: the certificate then the CA's, not before, not after)."""
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
            .public_key(public_key)  # type: ignore[arg-type]
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
        return chain, now.timestamp(), after.timestamp()


class CertManager:
    """One credential per (pod, source), renewed with a new key after 80% of its lifetime."""

    def __init__(self, ca: LocalCA, clock: Callable[[], float] = time.time) -> None:
        self.ca = ca
        self._clock = clock
        self._cache: dict[CertKey, Credential] = {}
        self._lock = threading.Lock()

    def get(self, key: CertKey) -> Credential:
        """The cached credential unless it is due; a new key and certificate otherwise."""
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and self._clock() < cached.refresh_at():
            return cached
        make = KEY_TYPES.get(key.key_type)
        if make is None:
            raise CertError(f"unsupported keyType {key.key_type!r} (one of {', '.join(KEY_TYPES)})")
        private = make()
        chain, not_before, not_after = self.ca.issue(key, private.public_key())
        fresh = Credential(_pem(private), chain, not_before, not_after)
        with self._lock:
            self._cache[key] = fresh
        return fresh

    def forget_pod(self, pod_uid: str) -> None:
        """Drop a pod's credentials (its projected volume was torn down)."""
        with self._lock:
            for key in [k for k in self._cache if k.pod_uid == pod_uid]:
                del self._cache[key]
