"""Service-account tokens for projected volumes (kubelet's token manager, §1.7).

A `TokenSource` issues a token for (namespace, service account, audiences,
expiration, bound pod). Two sources:

* `CommandTokenSource` (``serve --token-command CMD``): runs CMD with
  ``NAMESPACE SERVICE_ACCOUNT AUDIENCE EXPIRATION_SECONDS`` appended (AUDIENCE
  "" for the API server's default) and the pod in the environment
  (``VOLFSM_POD_NAME``, ``VOLFSM_POD_UID``); its stdout, stripped, is the
  token. An operator points it at their cluster's TokenRequest API (e.g. a
  script around ``kubectl create token``).
* `LocalSigner` (the default): a node-local ES256 key signs well-formed
  JWTs with the claims a kube-apiserver puts in bound tokens. **No API
  server accepts them**: they exist so that pods and tests see a real,
  expiring, refreshed token file. Signed with PyJWT over `cryptography`
  (both well kept; volfsm writes no crypto of its own).

`TokenManager` caches tokens per (namespace, service account, audiences,
expiration, pod uid) and refreshes as the kubelet does: once past 80% of
the lifetime or 24 h after issue, with up to 10 s of jitter. A failed
refresh keeps serving the cached token until it expires. No token text is
ever logged or put in an error.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from volfsm.plugins.objectvol.command import CommandError, OperatorCommand

DEFAULT_EXPIRATION_S = 3600
MAX_AGE_S = 24 * 3600
REFRESH_FRACTION = 0.8
MAX_JITTER_S = 10.0
REFRESH_RETRY_S = 60.0
"""After a failed refresh, the next try (the kubelet's retry comes with its next pod sync)."""


class TokenError(Exception):
    """No token could be had; the message never holds a token."""


@dataclass(frozen=True)
class TokenKey:
    """What a token is requested for (the kubelet's cache key)."""

    namespace: str
    service_account: str
    audiences: tuple[str, ...]
    expiration_seconds: int
    pod_name: str
    pod_uid: str


@dataclass(frozen=True)
class Token:
    """A token and its lifetime (unix seconds). Its repr hides the text."""

    text: str
    issued_at: float
    expires_at: float
    retry_at: float = 0.0
    """After a failed refresh: when to try again (0: no failure)."""

    def __repr__(self) -> str:
        return f"Token(issued_at={self.issued_at:.0f}, expires_at={self.expires_at:.0f})"

    def refresh_at(self) -> float:
        """When the kubelet would refresh it (no jitter): 80% of its life, or 24 h; after a
        failed refresh, the retry time."""
        if self.retry_at:
            return self.retry_at
        ttl = self.expires_at - self.issued_at
        return min(self.issued_at + MAX_AGE_S, self.expires_at - (1 - REFRESH_FRACTION) * ttl)


class TokenSource(Protocol):
    """Issues tokens (TokenRequest)."""

    def issue(self, key: TokenKey) -> Token:
        """A new token for `key`; `TokenError` if none."""


class LocalSigner:
    """Signs JWTs with a node-local P-256 key (kept 0600 in `key_path`, made on first use)."""

    def __init__(self, key_path: Path | None, issuer: str) -> None:
        self.issuer = issuer
        self._key = _load_or_make_key(key_path)
        self.key_id = uuid.uuid5(uuid.NAMESPACE_OID, self.public_pem().decode()).hex

    def public_pem(self) -> bytes:
        """The public key that verifies its tokens (PEM)."""
        return self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def issue(self, key: TokenKey) -> Token:
        """A bound service-account JWT with the claims an API server would give."""
        now = int(time.time())
        exp = now + key.expiration_seconds
        claims: dict[str, object] = {
            "iss": self.issuer,
            "sub": f"system:serviceaccount:{key.namespace}:{key.service_account}",
            "iat": now,
            "nbf": now,
            "exp": exp,
            "jti": str(uuid.uuid4()),
            "kubernetes.io": {
                "namespace": key.namespace,
                "pod": {"name": key.pod_name, "uid": key.pod_uid},
                "serviceaccount": {"name": key.service_account},
            },
        }
        if key.audiences:
            claims["aud"] = list(key.audiences)
        text = jwt.encode(claims, self._key, algorithm="ES256", headers={"kid": self.key_id})
        return Token(text=text, issued_at=now, expires_at=exp)


def _load_or_make_key(path: Path | None) -> ec.EllipticCurvePrivateKey:
    if path is not None and path.exists():
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if isinstance(loaded, ec.EllipticCurvePrivateKey):
            return loaded
    key = ec.generate_private_key(ec.SECP256R1())
    if path is not None:
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        write_private(path, pem)
    return key


def write_private(path: Path, data: bytes) -> None:
    """Write key material to `path` (mode 0600, its dir 0700, made if missing)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class CommandTokenSource:
    """Runs an operator's command for each token (see the module doc)."""

    def __init__(self, command: str) -> None:
        self.command = OperatorCommand(command, "--token-command")

    def issue(self, key: TokenKey) -> Token:
        """The command's stdout as the token; its expiry from the JWT if it is one."""
        args = (
            key.namespace,
            key.service_account,
            ",".join(key.audiences),
            str(key.expiration_seconds),
        )
        env = {"VOLFSM_POD_NAME": key.pod_name, "VOLFSM_POD_UID": key.pod_uid}
        now = time.time()
        try:
            done = self.command.run(args, env)
        except CommandError as exc:
            raise TokenError(str(exc)) from None
        text = done.stdout.decode(errors="replace").strip()
        if done.returncode != 0 or not text:
            raise TokenError(
                f"token command {self.command.name!r} exited {done.returncode}"
                f"{' with no token' if not text else ''}"
            )
        return Token(text=text, issued_at=now, expires_at=_expiry(text, now, key))


def _expiry(text: str, now: float, key: TokenKey) -> float:
    try:
        claims = jwt.decode(text, options={"verify_signature": False})
        return float(claims["exp"])
    except (jwt.PyJWTError, KeyError, TypeError, ValueError):
        return now + key.expiration_seconds


class TokenManager:
    """The kubelet's token manager: a cache refreshed after 80% of a token's life or 24 h.

    `max_ttl_s` (tests) caps every requested lifetime so refreshes come soon.
    """

    def __init__(
        self,
        source: TokenSource,
        max_ttl_s: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.max_ttl_s = max_ttl_s
        self._clock = clock
        self._cache: dict[TokenKey, Token] = {}
        self._lock = threading.Lock()

    def effective(self, key: TokenKey) -> TokenKey:
        """`key` with the lifetime capped by `max_ttl_s`."""
        if self.max_ttl_s is not None and key.expiration_seconds > self.max_ttl_s:
            return TokenKey(**{**key.__dict__, "expiration_seconds": self.max_ttl_s})
        return key

    def get(self, key: TokenKey) -> Token:
        """A token for `key`: the cached one unless it needs a refresh; `TokenError` if none."""
        key = self.effective(key)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and not self._requires_refresh(cached):
            return cached
        try:
            fresh = self.source.issue(key)
        except TokenError:
            now = self._clock()
            if cached is None:
                raise
            if now >= cached.expires_at:
                raise TokenError("token expired and refresh failed") from None
            # The kubelet: "Couldn't update token", serve the cached one; the next try comes
            # later, so a refresh timer does not run the token source in a loop meanwhile.
            fresh = dataclasses.replace(
                cached, retry_at=min(now + REFRESH_RETRY_S, cached.expires_at)
            )
        with self._lock:
            self._cache[key] = fresh
        return fresh

    def _requires_refresh(self, token: Token) -> bool:
        if token.retry_at:
            return self._clock() >= token.retry_at
        ttl = token.expires_at - token.issued_at
        jitter = random.uniform(0, min(MAX_JITTER_S, 0.05 * ttl))
        return self._clock() > token.refresh_at() - jitter

    def forget_pod(self, pod_uid: str) -> None:
        """Drop a pod's tokens (DeleteServiceAccountToken at teardown)."""
        with self._lock:
            for key in [k for k in self._cache if k.pod_uid == pod_uid]:
                del self._cache[key]
