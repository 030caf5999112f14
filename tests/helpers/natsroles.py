"""NATS servers with volfsm's roles (deploy/nats/roles/users.conf) and each role's login.

`roles_config()` is the server config text: the shipped users.conf itself
(or the same block for other node names), preceded by the definitions of
its password variables. With `root=True` a test-only user with every
right is added and made the login of connections without credentials
(`no_auth_user`): the tests' own observers (reading the stream back,
damaging it on purpose) use it, while the side under test logs in as its
role.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from volfsm.bus.roles import (
    DEFAULT_STREAM,
    authorization_block,
    node_inbox_prefix,
    node_user,
    password_variable,
    role_users,
)

REPO = Path(__file__).resolve().parents[2]
USERS_CONF = REPO / "deploy" / "nats" / "roles" / "users.conf"
SHIPPED_NODES = ("n1", "n2")
"""The nodes of the shipped users.conf."""
ADMIN = "volfsm-admin"
AGGREGATOR = "volfsm-aggregator"
CLIENT = "volfsm-client"
ROOT = "test-root"


def password(user: str) -> str:
    """The password every test server gives `user`."""
    return f"{user}-secret"


def roles_config(nodes: Sequence[str] | None = None, *, root: bool = False) -> str:
    """Server config text with the roles; `nodes` None: the shipped users.conf (n1, n2)."""
    names = SHIPPED_NODES if nodes is None else tuple(nodes)
    block = USERS_CONF.read_text() if nodes is None else authorization_block(names)
    defs = "".join(f'{password_variable(u)}: "{password(u)}"\n' for u in role_users(names))
    if root:
        head = "  users = [\n"
        assert head in block
        block = block.replace(head, head + f'    {{user: "{ROOT}", password: "{ROOT}"}}\n', 1)
        defs += f"no_auth_user: {ROOT}\n"
    return defs + block


def login(user: str) -> dict[str, Any]:
    """`nats.connect` options for `user`."""
    return {"user": user, "password": password(user)}


def node_login(node: str) -> dict[str, Any]:
    """`nats.connect` options for node `node`, with its inbox prefix (as the service connects)."""
    return {**login(node_user(node)), "inbox_prefix": node_inbox_prefix(node)}


def cli_login(user: str) -> list[str]:
    """The CLI options that log in as `user`."""
    return ["--nats-user", user, "--nats-password", password(user)]


def node_serve_args(node: str) -> list[str]:
    """`volfsm serve` options of node `node` in the `node` role."""
    return [*cli_login(node_user(node)), "--stream-setup", "check"]


__all__ = [
    "ADMIN",
    "AGGREGATOR",
    "CLIENT",
    "DEFAULT_STREAM",
    "ROOT",
    "USERS_CONF",
    "cli_login",
    "login",
    "node_login",
    "node_serve_args",
    "password",
    "roles_config",
]
