"""docker-compose.cluster.yml and deploy/: they parse, and name what the README says.

Docker cannot run here; this checks the compose file against the real
command lines (every `volfsm serve` and `volfsm analytics serve` argument is
accepted by the CLI's own parser) and the NATS configs against the real
`nats-server -t` (configuration test), and that the names fit together:
three clustered servers routing to each other, each node on its own server
with its own data and root dirs, the aggregator on all three.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import typer
import yaml

from tests.cluster.harness import REPO_ROOT
from volfsm.bus import find_nats_server
from volfsm.cli import app

COMPOSE = REPO_ROOT / "docker-compose.cluster.yml"
CLUSTER_CONF = REPO_ROOT / "deploy" / "nats" / "cluster.conf"
SERVERS = ("nats-1", "nats-2", "nats-3")
NODES = ("node-1", "node-2", "node-3")
NODE_PORTS = {"node-1": "9781:9780", "node-2": "9782:9780", "node-3": "9783:9780"}
CLIENT_PORTS = {"nats-1": "4222:4222", "nats-2": "4223:4222", "nats-3": "4224:4222"}
DASHBOARD_PORT = "9790:9790"
ALL_SERVERS = "nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222"


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and data["name"] == "volfsm-cluster"
    return dict(data["services"])


def option_value(args: list[str], option: str) -> str:
    return args[args.index(option) + 1]


def command(*path: str) -> Any:
    """The click command at `path` of the main CLI (`serve`, `analytics serve`)."""
    cmd: Any = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def test_three_nats_servers_clustered_from_one_config(services: dict[str, Any]) -> None:
    for name in SERVERS:
        srv = services[name]
        assert srv["image"] == "nats:2.10-alpine"
        assert srv["command"] == ["-c", "/etc/nats/cluster.conf", "--name", name]
        assert "./deploy/nats/cluster.conf:/etc/nats/cluster.conf:ro" in srv["volumes"]
        assert f"{name}-data:/data" in srv["volumes"]
        assert srv["ports"] == [CLIENT_PORTS[name]]
        assert "http://127.0.0.1:8222/healthz" in srv["healthcheck"]["test"]
    conf = CLUSTER_CONF.read_text()
    for name in SERVERS:
        assert f"nats-route://{name}:6222" in conf
    assert "store_dir: /data" in conf and "http: 8222" in conf


def test_cluster_config_passes_the_nats_server_config_test() -> None:
    done = subprocess.run(
        [find_nats_server(), "-t", "-c", str(CLUSTER_CONF)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "is valid" in done.stdout + done.stderr


@pytest.mark.parametrize("index", range(3))
def test_each_node_is_a_valid_serve_on_its_own_server_with_an_r3_stream(
    services: dict[str, Any], index: int
) -> None:
    name, server = NODES[index], SERVERS[index]
    svc = services[name]
    assert svc["image"] == "volfsm:local" and svc["build"] == "."
    assert svc["privileged"] is True and svc["init"] is True
    assert svc["entrypoint"] == ["volfsm"]
    assert svc["depends_on"] == {server: {"condition": "service_healthy"}}
    args = [str(a) for a in svc["command"]]
    assert args[0] == "serve"
    params = command("serve").make_context("serve", args[1:]).params  # raises on a bad option
    root = f"/var/lib/volfsm-cluster/{name}/kubelet"
    assert params["nats"] == f"nats://{server}:4222"
    assert params["node"] == name
    assert params["stream_replicas"] == 3
    assert params["data_dir"] == "/var/lib/volfsm"
    assert params["root_dir"] == root
    assert params["http"] == "0.0.0.0:9780"
    assert svc["ports"] == [NODE_PORTS[name]]
    assert f"{name}-data:/var/lib/volfsm" in svc["volumes"]
    [bind] = [v for v in svc["volumes"] if isinstance(v, dict)]
    assert (bind["type"], bind["source"], bind["target"]) == ("bind", root, root)
    assert bind["bind"] == {"propagation": "rshared", "create_host_path": True}


def test_aggregator_consumes_the_whole_cluster_and_serves_the_dashboard(
    services: dict[str, Any],
) -> None:
    agg = services["aggregator"]
    assert agg["image"] == "volfsm:local" and agg["entrypoint"] == ["volfsm"]
    assert agg["depends_on"] == {s: {"condition": "service_healthy"} for s in SERVERS}
    args = [str(a) for a in agg["command"]]
    assert args[:2] == ["analytics", "serve"]
    params = command("analytics", "serve").make_context("serve", args[2:]).params
    assert params["nats_url"] == ALL_SERVERS
    assert str(params["db"]) == "/var/lib/volfsm-analytics/analytics.db"
    assert params["http"] == "0.0.0.0:9790"
    assert agg["ports"] == [DASHBOARD_PORT]
    assert "analytics-data:/var/lib/volfsm-analytics" in agg["volumes"]


def test_volumes_declared_and_node_names_distinct(services: dict[str, Any]) -> None:
    data = yaml.safe_load(COMPOSE.read_text())
    declared = set(data["volumes"])
    used = {
        v.split(":", 1)[0]
        for svc in services.values()
        for v in svc.get("volumes", [])
        if isinstance(v, str) and not v.startswith("./")
    }
    assert used == declared
    names = [option_value([str(a) for a in services[n]["command"]], "--node") for n in NODES]
    assert names == list(NODES)
