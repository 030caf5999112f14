"""docker-compose.yml and the Dockerfile: they parse, and name what the README says.

Docker cannot run here; this checks the files against the real command
lines: every `volfsm serve` and `volfsm-csi-driver` argument in the compose
file is accepted by the parsers the programs use.
"""

from __future__ import annotations

import tomllib
from typing import Any

import click
import pytest
import typer
import yaml

from tests.service.helpers import REPO_ROOT
from volfsm.cli import app
from volfsm.csidriver.__main__ import build_parser
from volfsm.csidriver.admin import build_parser as admin_parser

COMPOSE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return dict(data["services"])


def option_value(args: list[str], option: str) -> str:
    return args[args.index(option) + 1]


ROOT_DIR = "/var/lib/volfsm-compose/root"
"""volfsm's own root dir on the host: never a kubelet's (/var/lib/kubelet)."""


def shared_root_mount(service: dict[str, Any]) -> dict[str, Any]:
    [mount] = [v for v in service["volumes"] if isinstance(v, dict) and v["target"] == ROOT_DIR]
    assert mount["source"] == ROOT_DIR
    return dict(mount)


def test_nats_service_runs_jetstream_with_a_health_check(services: dict[str, Any]) -> None:
    nats = services["nats"]
    assert nats["image"].startswith("nats:") and nats["image"].endswith("-alpine")
    assert "-js" in nats["command"]
    assert "http://127.0.0.1:8222/healthz?js-enabled-only=true" in nats["healthcheck"]["test"]


def test_volfsm_service_command_is_a_valid_serve_command_line(services: dict[str, Any]) -> None:
    svc = services["volfsm"]
    assert svc["image"] == "volfsm:local" and svc["build"] == "."
    assert svc["privileged"] is True and svc["init"] is True
    assert svc["depends_on"]["nats"]["condition"] == "service_healthy"
    args = list(svc["command"])
    assert args[0] == "serve" and svc["entrypoint"] == ["volfsm"]
    assert option_value(args, "--nats") == "nats://nats:4222"
    assert option_value(args, "--root-dir") == ROOT_DIR
    assert option_value(args, "--csi") == "csi.volfsm.dev=unix:///csi/csi.sock"
    assert option_value(args, "--http") == "0.0.0.0:9780"
    group: Any = typer.main.get_command(app)
    serve = group.commands["serve"]
    ctx = serve.make_context("serve", args[1:])  # raises on an unknown or malformed option
    assert ctx.params["nats"] == "nats://nats:4222"
    assert shared_root_mount(svc)["bind"]["propagation"] == "rshared"
    assert "csi-socket:/csi" in svc["volumes"]
    assert "9780:9780" in svc["ports"]


def test_csi_driver_beside_it_shares_the_socket_and_root(services: dict[str, Any]) -> None:
    drv = services["csi-driver"]
    assert drv["image"] == "volfsm:local" and drv["privileged"] is True
    assert drv["entrypoint"] == ["volfsm-csi-driver"]
    args = build_parser().parse_args(list(drv["command"]))
    assert args.endpoint == "unix:///csi/csi.sock"
    assert args.name == "csi.volfsm.dev"
    assert "csi-socket:/csi" in drv["volumes"]
    assert shared_root_mount(drv)["bind"]["propagation"] == "rshared"


def test_dockerfile_and_console_scripts() -> None:
    text = DOCKERFILE.read_text()
    assert text.splitlines()[2] == "FROM python:3.11-slim"
    assert "util-linux" in text and "e2fsprogs" in text
    assert "pip install --no-cache-dir ." in text
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"volfsm", "volfsm-csi-driver"} <= set(scripts)


def test_the_commands_in_the_compose_header_parse() -> None:
    header = [
        line.removeprefix("#").strip()
        for line in COMPOSE.read_text().splitlines()
        if line.startswith("#   docker compose exec ")
    ]
    runs = {line.split()[3]: line.split()[4:] for line in header}
    assert admin_parser().parse_args(runs["csi-driver"][1:]).name == "demo-vol-1"
    volfsm_lines = [line.split()[5:] for line in header if line.split()[3] == "volfsm"]
    group: Any = typer.main.get_command(app)
    for args in volfsm_lines:
        command: Any = group.commands[args[0]]
        if isinstance(command, click.Group):
            command = command.commands[args[1]]
            args = args[1:]
        command.make_context(args[0], args[1:])  # raises on an unknown or malformed option
    assert {args[0] for args in volfsm_lines} == {"apply", "wait", "get"}
