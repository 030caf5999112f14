"""NATS decentralized auth for tests: an operator, accounts and users as signed JWTs.

`JwtAuth` makes an operator, a system account and one application account
with JetStream enabled, writes the nats-server config that trusts them
(memory resolver, accounts preloaded), and writes `.creds` files (user JWT
plus NKey seed) for users with publish/subscribe permissions, as `nsc`
would. Keys are fresh Ed25519 NKeys from the `nkeys` package.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nkeys

from volfsm.bus.roles import Permissions

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
UNLIMITED_ACCOUNT = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
}
JETSTREAM_ON = {
    "mem_storage": -1,
    "disk_storage": -1,
    "streams": -1,
    "consumer": -1,
    "max_ack_pending": -1,
    "mem_max_stream_bytes": -1,
    "disk_max_stream_bytes": -1,
    "max_bytes_required": False,
}


def b64url(data: bytes) -> str:
    """Base64url without padding, as JWTs use."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def new_key(prefix: int) -> nkeys.KeyPair:
    """A fresh NKey pair of one role (operator, account or user prefix byte)."""
    return nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), prefix)))


def public(key: nkeys.KeyPair) -> str:
    """The public key as text (O..., A..., U...)."""
    return bytes(key.public_key).decode()


def sign_jwt(issuer: nkeys.KeyPair, subject: str, name: str, nats: dict[str, Any]) -> str:
    """A JWT with the `nats` claims about `subject`, signed by `issuer`."""
    claims: dict[str, Any] = {
        "iat": int(time.time()),
        "iss": public(issuer),
        "name": name,
        "sub": subject,
        "nats": {**nats, "version": 2},
    }
    claims["jti"] = (
        base64.b32encode(hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest())
        .decode()
        .rstrip("=")
    )
    head = b64url(json.dumps(HEADER).encode()) + "." + b64url(json.dumps(claims).encode())
    return head + "." + b64url(bytes(issuer.sign(head.encode())))


def creds_text(user_jwt: str, seed: bytes) -> str:
    """A `.creds` file: the user JWT and its NKey seed in nsc's layout."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed.decode()}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


class JwtAuth:
    """An operator trusting a system account and an application account with JetStream."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.operator = new_key(nkeys.PREFIX_BYTE_OPERATOR)
        self.system = new_key(nkeys.PREFIX_BYTE_ACCOUNT)
        self.account = new_key(nkeys.PREFIX_BYTE_ACCOUNT)
        op = public(self.operator)
        self.operator_jwt = sign_jwt(self.operator, op, "volfsm-test", {"type": "operator"})
        self.system_jwt = sign_jwt(
            self.operator,
            public(self.system),
            "SYS",
            {"type": "account", "limits": UNLIMITED_ACCOUNT},
        )
        self.account_jwt = sign_jwt(
            self.operator,
            public(self.account),
            "VOLFSM",
            {"type": "account", "limits": {**UNLIMITED_ACCOUNT, **JETSTREAM_ON}},
        )

    def server_config(self) -> str:
        """nats-server config text: trust the operator, preload both accounts."""
        operator_file = self.workdir / "operator.jwt"
        operator_file.write_text(self.operator_jwt)
        return (
            f'operator: "{operator_file}"\n'
            f'system_account: "{public(self.system)}"\n'
            "resolver: MEMORY\n"
            "resolver_preload: {\n"
            f'  "{public(self.system)}": "{self.system_jwt}"\n'
            f'  "{public(self.account)}": "{self.account_jwt}"\n'
            "}\n"
        )

    def user_creds(
        self,
        name: str,
        *,
        publish: Sequence[str] | None = None,
        subscribe: Sequence[str] | None = None,
        account: nkeys.KeyPair | None = None,
        responses: bool = False,
    ) -> Path:
        """Write `<name>.creds` for a new user of the account (or `account`), with permissions.

        None for `publish` / `subscribe` leaves that direction unrestricted;
        `responses` lets it answer each request it receives once (nsc's
        `--allow-pub-response`).
        """
        user = new_key(nkeys.PREFIX_BYTE_USER)
        claims: dict[str, Any] = {"type": "user", "subs": -1, "data": -1, "payload": -1}
        if publish is not None:
            claims["pub"] = {"allow": list(publish)}
        if subscribe is not None:
            claims["sub"] = {"allow": list(subscribe)}
        if responses:
            claims["resp"] = {"max": 1, "ttl": 0}
        user_jwt = sign_jwt(account or self.account, public(user), name, claims)
        path = self.workdir / f"{name}.creds"
        path.write_text(creds_text(user_jwt, bytes(user.seed)))
        path.chmod(0o600)
        return path


def role_creds(auth: JwtAuth, name: str, perms: Permissions) -> Path:
    """`<name>.creds` for a user with one role's permissions (`volfsm.bus.roles`)."""
    return auth.user_creds(
        name,
        publish=perms.publish,
        subscribe=perms.subscribe,
        responses=perms.allow_responses,
    )
