"""The shipped role configs say what `volfsm.bus.roles` says (the tests run with those lists).

users.conf is the authorization block `authorization_block` renders for
nodes n1 and n2 (and the role tests run a server on the file itself);
nsc-roles.sh, run with an `nsc` that records its arguments, asks for
exactly the same permissions per user (the JWT tests sign those lists).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from tests.helpers.natsroles import REPO, USERS_CONF
from volfsm.bus.roles import Permissions, authorization_block, role_users

NSC_SCRIPT = REPO / "deploy" / "nats" / "roles" / "nsc-roles.sh"
RECORDING_NSC = """#!/bin/sh
for arg in "$@"; do printf '%s\\0' "$arg"; done >> "$NSC_LOG"
printf '\\n' >> "$NSC_LOG"
"""


def test_users_conf_is_the_rendered_block() -> None:
    assert authorization_block(["n1", "n2"]) in USERS_CONF.read_text()


def nsc_users(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> dict[str, Permissions]:
    """What nsc-roles.sh asks nsc for: user -> permissions."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nsc").write_text(RECORDING_NSC)
    (bindir / "nsc").chmod(0o755)
    log = tmp_path / "nsc.log"
    run_env = {**os.environ, **(env or {}), "PATH": f"{bindir}:{os.environ['PATH']}"}
    run_env["NSC_LOG"] = str(log)
    subprocess.run(["sh", str(NSC_SCRIPT), *args], check=True, env=run_env, timeout=30)
    users: dict[str, Permissions] = {}
    for line in log.read_text().splitlines():
        argv = line.split("\0")[:-1]
        assert argv[:2] == ["add", "user"], shlex.join(argv)
        opts = list(zip(argv[2::2], argv[3::2], strict=False))
        name = dict(opts)["--name"]
        assert dict(opts)["--account"] == "VOLFSM"
        users[name] = Permissions(
            publish=tuple(v for k, v in opts if k == "--allow-pub"),
            subscribe=tuple(v for k, v in opts if k == "--allow-sub"),
            allow_responses=argv[-1] == "--allow-pub-response",
        )
    return users


def test_nsc_script_asks_for_the_role_permissions(tmp_path: Path) -> None:
    assert nsc_users(tmp_path, "VOLFSM", "n1", "edge-7") == role_users(["n1", "edge-7"])


def test_nsc_script_takes_another_stream_and_durable(tmp_path: Path) -> None:
    env = {"VOLFSM_STREAM": "EVENTS", "VOLFSM_DURABLE": "dash"}
    got = nsc_users(tmp_path, "VOLFSM", "n1", env=env)
    assert got == role_users(["n1"], stream="EVENTS", durable="dash")
