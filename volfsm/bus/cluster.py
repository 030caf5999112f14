"""Run an N-server NATS JetStream cluster on loopback ports (tests, benches, local demos).

Each member is a `NatsServer` (client port, store dir `<base>/<name>`, server
name) started with a config file that adds the cluster block (route port,
routes to every member) and a monitoring port. `start()` returns once every
member reports healthy (`/healthz`: JetStream up, meta leader known, its
streams current). One member can be stopped, killed (SIGKILL), paused or
restarted on the same ports and store, so the others see an outage, not a
new server; `stream_leader` names the member leading a stream's RAFT group.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import TracebackType

from nats.js import JetStreamContext

from volfsm.bus.server import NatsServer, NatsServerError, free_port

DEFAULT_CLUSTER_NAME = "volfsm"


class NatsClusterError(NatsServerError):
    """The cluster (or one member) did not become healthy in time, or no such member."""


class ClusterMember:
    """One server of a `NatsCluster`: its `NatsServer`, route and monitoring ports."""

    def __init__(self, server: NatsServer, route_port: int, monitor_port: int) -> None:
        self.server = server
        self.route_port = route_port
        self.monitor_port = monitor_port

    @property
    def name(self) -> str:
        """The server name (JetStream peers are known by it; it survives restarts)."""
        return self.server.server_name

    @property
    def url(self) -> str:
        """The client URL."""
        return self.server.url

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self.server.running

    def health(self) -> tuple[int, str]:
        """(HTTP status, body) of the member's `/healthz`; (0, reason) if it does not answer."""
        url = f"http://{self.server.host}:{self.monitor_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2.0) as resp:
                return int(resp.status), resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode(errors="replace")
        except (OSError, ValueError) as exc:
            return 0, str(exc)

    def healthy(self) -> bool:
        """True if the member runs and `/healthz` answers ok."""
        if not self.running:
            return False
        status, body = self.health()
        if status != 200:
            return False
        try:
            return bool(json.loads(body).get("status") == "ok")
        except ValueError:
            return False


def cluster_config(
    cluster_name: str,
    host: str,
    route_port: int,
    route_ports: list[int],
    monitor_port: int,
    extra: str = "",
) -> str:
    """The config file of one member (client port, store and name come from the command line)."""
    routes = "\n".join(f"    nats-route://{host}:{port}" for port in route_ports)
    return (
        f"http: {host}:{monitor_port}\n"
        "cluster {\n"
        f"  name: {cluster_name}\n"
        f"  listen: {host}:{route_port}\n"
        "  routes: [\n"
        f"{routes}\n"
        "  ]\n"
        "}\n"
        f"{extra}"
    )


class NatsCluster:
    """`size` clustered JetStream servers under `base_dir`, one sub-dir (store, log) each.

    `extra_config` is appended to every member's config file (limits,
    accounts...). Use as a context manager or call `start()` / `stop()`.
    """

    def __init__(
        self,
        base_dir: str | Path,
        size: int = 3,
        *,
        cluster_name: str = DEFAULT_CLUSTER_NAME,
        host: str = "127.0.0.1",
        server_names: list[str] | None = None,
        extra_config: str = "",
        binary: str | None = None,
        start_timeout_s: float = 60.0,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one server")
        if server_names is not None and len(server_names) != size:
            raise ValueError(f"{len(server_names)} server names for {size} servers")
        token = uuid.uuid4().hex[:6]
        names = server_names or [f"nats-{i + 1}-{token}" for i in range(size)]
        self.base_dir = Path(base_dir)
        self.cluster_name = cluster_name
        self.start_timeout_s = start_timeout_s
        route_ports = [free_port(host) for _ in range(size)]
        self.members: list[ClusterMember] = []
        for name, route_port in zip(names, route_ports, strict=True):
            monitor_port = free_port(host)
            config = cluster_config(
                cluster_name, host, route_port, route_ports, monitor_port, extra_config
            )
            server = NatsServer(
                self.base_dir / name,
                host=host,
                config_text=config,
                binary=binary,
                server_name=name,
                start_timeout_s=start_timeout_s,
            )
            self.members.append(ClusterMember(server, route_port, monitor_port))

    # ---------------------------------------------------------------- names

    @property
    def urls(self) -> list[str]:
        """Every member's client URL."""
        return [m.url for m in self.members]

    @property
    def url(self) -> str:
        """Every member's client URL, comma-separated (as `--nats` takes them)."""
        return ",".join(self.urls)

    @property
    def names(self) -> list[str]:
        """Every member's server name."""
        return [m.name for m in self.members]

    def member(self, which: int | str) -> ClusterMember:
        """A member by index or by server name."""
        if isinstance(which, int):
            return self.members[which]
        for m in self.members:
            if m.name == which:
                return m
        raise NatsClusterError(f"no server named {which!r} in cluster {self.cluster_name}")

    # ------------------------------------------------------------- lifecycle

    def start(self) -> NatsCluster:
        """Start every member that is not running; wait until all are healthy."""
        try:
            for m in self.members:
                m.server.start()
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, which: int | str | None = None, timeout_s: float | None = None) -> None:
        """Until `which` member (default: every running one) answers `/healthz` ok."""
        members = [self.member(which)] if which is not None else self.members
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        waiting = [m for m in members if m.running]
        while waiting:
            waiting = [m for m in waiting if not m.healthy()]
            if not waiting:
                return
            if time.monotonic() > deadline:
                detail = "; ".join(f"{m.name}: {m.health()[1].strip()[:200]}" for m in waiting)
                raise NatsClusterError(f"cluster {self.cluster_name} not healthy: {detail}")
            time.sleep(0.1)

    def stop(self, which: int | str | None = None) -> None:
        """Shut down one member (SIGTERM), or all of them. Idempotent."""
        for m in [self.member(which)] if which is not None else self.members:
            m.server.stop()

    def kill(self, which: int | str) -> None:
        """SIGKILL one member: a crash."""
        self.member(which).server.kill()

    def pause(self, which: int | str) -> None:
        """SIGSTOP one member (hung: holds its sockets, answers nothing)."""
        self.member(which).server.pause()

    def resume(self, which: int | str) -> None:
        """SIGCONT a paused member."""
        self.member(which).server.resume()

    def restart(self, which: int | str, *, kill: bool = False, wait: bool = True) -> None:
        """Stop (or kill) one member and start it again on its ports and store.

        With `wait`, return once it is healthy again (caught up with its streams).
        """
        member = self.member(which)
        member.server.restart(kill=kill)
        if wait:
            self.wait_healthy(member.name)

    # -------------------------------------------------------------- queries

    @staticmethod
    async def stream_leader(js: JetStreamContext, stream: str) -> str | None:
        """The server name leading `stream`'s RAFT group (None while it has no leader)."""
        info = await js.stream_info(stream)
        cluster = info.cluster
        return cluster.leader if cluster is not None else None

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
