"""`volfsm apply | delete pod | get | wait pod`: commands to a running `volfsm serve`.

They find the service through `--nats` (or `$VOLFSM_NATS`, or the
`nats.url` file the service writes in its data dir) and `--node` (or
`$VOLFSM_NODE`, the data dir's `node` file, the host name): every command
takes the same connection options (declared once, added by
`service_command`, gathered in `ServiceOptions`) and talks to the service
through `_call`. Exit codes: 0 done, 1 the service refused
or could not be reached (or a wait timed out), 2 a bad argument or file,
3 (`apply`) applied, but objects of kinds a node does not run were skipped.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import msgspec
import typer

from projections.textfmt import describe_error, describe_operation
from volfsm.bus.credopts import CREDENTIAL_PARAMETERS, NatsCredentials
from volfsm.cli import objects as object_cli
from volfsm.cli.common import DataDirOpt, Output, OutputOpt, fail
from volfsm.cli.live import (
    TooLargeError,
    check_sizes,
    follow,
    match_node_pods,
    measure,
    pod_label,
    read_stdin,
    stable,
    unknown_on_node,
)
from volfsm.cli.refs import PodRef, listing, parse_pod
from volfsm.gate import gate_text
from volfsm.render import fmt_bytes, fmt_ts, print_json, print_line, print_table
from volfsm.service.datadir import ConfigError
from volfsm.service.target import (
    DEFAULT_TIMEOUT_S,
    NATS_ENV,
    NODE_ENV,
    CommandClient,
    CommandFailedError,
    ServiceUnreachableError,
    Target,
    find_target,
)

if TYPE_CHECKING:
    from projections.asw import OperationRecord

EXIT_FAILED = 1
"""Exit code when the service refused the command, was unreachable, or a wait timed out."""

POLL_INTERVAL_S = 0.2
ANY_SERVER_TAKES = 1 << 20
"""NATS's default max_payload: files up to this size are parsed before connecting."""
PANEL = "Finding the service"

T = TypeVar("T")

NatsOpt = Annotated[
    str | None,
    typer.Option(
        "--nats",
        envvar=NATS_ENV,
        help="NATS URL of the service. Default: <data-dir>/nats.url.",
        rich_help_panel=PANEL,
        show_default=False,
    ),
]
NodeOpt = Annotated[
    str | None,
    typer.Option(
        "--node",
        envvar=NODE_ENV,
        help="Node to talk to. Default: <data-dir>/node, else the host name.",
        rich_help_panel=PANEL,
        show_default=False,
    ),
]
TimeoutOpt = Annotated[
    float,
    typer.Option(
        "--request-timeout", min=0.1, help="Seconds to wait for each reply.", rich_help_panel=PANEL
    ),
]


@dataclass(frozen=True)
class ServiceOptions:
    """How a command finds and talks to the service: its connection options."""

    nats: str | None
    node: str | None
    data_dir: Path | None
    request_timeout: float
    credentials: NatsCredentials

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> ServiceOptions:
        """The connection options among a command's parameters."""
        return cls(
            nats=params["nats"],
            node=params["node"],
            data_dir=params["data_dir"],
            request_timeout=params["request_timeout"],
            credentials=NatsCredentials.of(params),
        )

    def target(self) -> Target:
        """Where the service is; a bad option exits 2, no service found exits 1."""
        try:
            options = self.credentials.connect_options()
            return find_target(
                nats_url=self.nats, node=self.node, data_dir=self.data_dir, options=options
            )
        except ConfigError as exc:
            fail(str(exc))
        except ServiceUnreachableError as exc:
            _failed(str(exc))


_SERVICE_PARAMETERS = [
    inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
    for name, annotation, default in (
        ("nats", NatsOpt, None),
        ("node", NodeOpt, None),
        ("data_dir", DataDirOpt, None),
        ("request_timeout", TimeoutOpt, DEFAULT_TIMEOUT_S),
    )
] + CREDENTIAL_PARAMETERS
"""The options every service command takes: where the service is, then the credentials."""


def service_command(command: Callable[..., None]) -> Callable[..., None]:
    """Give `command` the options that find the service; it receives them as `opts`.

    Typer reads a command's options from its signature: the wrapper's is the
    command's own parameters (without `opts`) plus `_SERVICE_PARAMETERS`, so
    the eleven options are declared once instead of in every command.
    """
    own = [
        p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "opts"
    ]
    names = {p.name for p in _SERVICE_PARAMETERS}

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        opts = ServiceOptions.of(kwargs)
        command(opts=opts, **{k: v for k, v in kwargs.items() if k not in names})

    parameters = [*own, *_SERVICE_PARAMETERS]
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
    setattr(wrapper, "__signature__", inspect.Signature(parameters, return_annotation=None))  # noqa: B010
    return wrapper


def _failed(message: str) -> NoReturn:
    typer.echo(f"volfsm: error: {message}", err=True)
    raise typer.Exit(EXIT_FAILED)


def _call(
    opts: ServiceOptions,
    work: Callable[[CommandClient], Awaitable[T]],
    *,
    waits: bool = False,
) -> T:
    """Find the service, connect, run `work`, close; errors: one line on stderr, exit 1.

    A plain connection (no TLS, no .creds) goes through the small socket client
    (`volfsm.service.liteclient`), and a `work` that never `waits` (sleeps) runs
    without an event loop; nats-py and asyncio are loaded only for the rest.
    """
    target = opts.target()
    try:
        from volfsm.service import liteclient

        plain = liteclient.usable(target)
        if plain and not waits:
            try:
                lite = liteclient.LiteServiceClient(target, timeout=opts.request_timeout)
                return run_now(work(lite))
            except liteclient.NeedsFullClient:
                plain = False  # the server wants TLS or nkeys: nats-py, from the start
        return _run_loop(target, opts.request_timeout, work, plain=plain)
    except ServiceUnreachableError as exc:
        _failed(str(exc))
    except CommandFailedError as exc:
        _failed(f"node {target.node}: {exc}")


def _run_loop(
    target: Target, timeout: float, work: Callable[[CommandClient], Awaitable[T]], *, plain: bool
) -> T:
    import asyncio

    from volfsm.service import liteclient

    async def main() -> T:
        if plain:
            try:
                return await work(liteclient.LiteServiceClient(target, timeout=timeout))
            except liteclient.NeedsFullClient:
                pass  # nothing was sent: start again with nats-py
        from volfsm.service.client import ServiceClient  # nats-py: TLS, .creds, nkeys

        async with ServiceClient(target, timeout=timeout) as client:
            return await work(client)

    return asyncio.run(main())


def run_now(awaitable: Awaitable[T]) -> T:
    """Run a coroutine that never suspends (the plain client's calls) without an event loop."""
    coro = awaitable.__await__()
    try:
        next(coro)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("this command needs an event loop: call _call(..., waits=True)")


# --------------------------------------------------------------- formatting


def _record(op: dict[str, Any] | None) -> OperationRecord | None:
    """An operation status from a reply, as the log's record (None if absent or malformed)."""
    if not op:
        return None
    from projections.asw import OperationRecord

    try:
        return msgspec.convert(op, OperationRecord)
    except msgspec.ValidationError:
        return None


def describe_op(op: dict[str, Any] | None) -> str:
    """An operation status from a reply, worded as every command words it ('' for None)."""
    return describe_operation(_record(op))


def describe_err(op: dict[str, Any] | None) -> str:
    """An error status from a reply, worded as every command words it ('' for None)."""
    return describe_error(_record(op))


def describe_retry(next_retry_us: Any) -> str:
    """When a failed operation may run again, as a time and 'in Ns'."""
    if not isinstance(next_retry_us, int):
        return ""
    left = next_retry_us - time.time_ns() // 1000
    return f"{fmt_ts(next_retry_us)} (in {max(0, left) / 1e6:.1f}s)" if left > 0 else "now"


def describe_usage(vol: dict[str, Any]) -> str:
    """'12MiB/60MiB (20%)' from a volume's last stats gathering ('' if none)."""
    used, capacity = vol.get("used_bytes"), vol.get("capacity_bytes")
    if not isinstance(used, int) or not isinstance(capacity, int) or capacity <= 0:
        return ""
    return f"{fmt_bytes(used)}/{fmt_bytes(capacity)} ({100 * used // capacity}%)"


def _header(reply: dict[str, Any]) -> str:
    relay = reply.get("relay") or {}
    nats = "connected" if relay.get("connected") else "disconnected"
    lag = reply.get("publish_lag")
    return (
        f"node {reply.get('node', '?')}, seq {reply.get('last_seq', 0)}, "
        f"publish lag {lag if lag is not None else '?'} (NATS {nats})"
    )


def recovery_lines(reply: dict[str, Any]) -> list[str]:
    """What a restart left to know: the unmount gate, orphans, pod dirs that stay."""
    lines: list[str] = []
    gate = gate_text(reply)
    if gate:
        lines.append(gate)
    report = reply.get("reconstruction") or {}
    for orphan in report.get("orphans") or []:
        status = orphan.get("status", "?")
        text = f"orphan {orphan.get('path')}: {orphan.get('why')}; cleanup {status}"
        if orphan.get("error"):
            text += f": {orphan['error']}"
        lines.append(text)
        lines.extend(f"  {kept}" for kept in orphan.get("stayed") or [])
    for uid, why in (reply.get("pod_dir_failures") or {}).items():
        lines.append(f"pod dir {uid} stays: {why}")
    return lines


def _pod_name(pod: dict[str, Any]) -> str:
    if not pod.get("name"):
        return f"uid {pod.get('uid', '?')} (found on the node)"
    return f"{pod.get('namespace', '')}/{pod.get('name', '')}"


def print_pods(reply: dict[str, Any]) -> None:
    """Pods, one row per pod-volume."""
    rows: list[list[str]] = []
    for pod in reply.get("items", []):
        name = _pod_name(pod)
        volumes = pod.get("volumes") or []
        if not volumes:
            rows.append([name, pod.get("phase", ""), "", "", "", "", "", ""])
        for vol in volumes:
            rows.append(
                [
                    name,
                    pod.get("phase", ""),
                    vol.get("name", ""),
                    vol.get("state", ""),
                    describe_usage(vol),
                    describe_op(vol.get("last_operation")),
                    describe_err(vol.get("last_error")),
                    describe_retry(vol.get("next_retry_us")),
                ]
            )
    print_line(_header(reply))
    print_table(
        "",
        ["POD", "PHASE", "VOLUME", "STATE", "USED", "LAST OP", "LAST ERROR", "NEXT RETRY"],
        rows,
    )
    for pod in reply.get("items", []):
        for vol in pod.get("volumes") or []:
            if vol.get("abnormal"):
                why = vol.get("condition") or "no message"
                print_line(f"{_pod_name(pod)} {vol.get('name')} is abnormal: {why}")
            if vol.get("state") == "Uncertain" and vol.get("reason"):
                print_line(f"{_pod_name(pod)} {vol.get('name')} is Uncertain: {vol['reason']}")
            if vol.get("waiting"):
                print_line(f"{_pod_name(pod)} {vol.get('name')} waiting: {vol['waiting']}")
    for line in recovery_lines(reply):
        print_line(line)


def print_volumes(reply: dict[str, Any]) -> None:
    """Volumes, one row each."""
    rows = [
        [
            vol.get("volume_id", ""),
            vol.get("state", ""),
            vol.get("plugin", ""),
            fmt_bytes(vol.get("size_bytes")),
            describe_usage(vol),
            str(len(vol.get("held_by") or [])),
            describe_op(vol.get("last_operation")),
            describe_err(vol.get("last_error")),
            describe_retry(vol.get("next_retry_us")),
        ]
        for vol in reply.get("items", [])
    ]
    print_line(_header(reply))
    print_table(
        "",
        ["VOLUME", "STATE", "PLUGIN", "SIZE", "USED", "HOLDERS", "LAST OP", "LAST ERROR",
         "NEXT RETRY"],
        rows,
    )  # fmt: skip
    for vol in reply.get("items", []):
        if vol.get("abnormal"):
            print_line(
                f"{vol.get('volume_id')} is abnormal: {vol.get('condition') or 'no message'}"
            )
        if vol.get("state") == "Uncertain" and vol.get("reason"):
            print_line(f"{vol.get('volume_id')} is Uncertain: {vol['reason']}")
    for line in recovery_lines(reply):
        print_line(line)


# ----------------------------------------------------------------- commands


@service_command
def apply(
    filename: Annotated[
        list[str],
        typer.Option(
            "--filename",
            "-f",
            help="YAML or JSON file, directory (*.yaml, *.yml, *.json) or - for stdin. Repeatable.",
        ),
    ],
    complete: Annotated[
        bool,
        typer.Option(
            "--complete",
            help="These objects are the node's whole desired state: delete the pods they do "
            "not name, then let unmounts start (after a restart nothing is unmounted until "
            "this, or the service's --desired-grace if its log is intact).",
        ),
    ] = False,
    output: OutputOpt = Output.table,
    *,
    opts: ServiceOptions,
) -> None:
    """Apply Pods, PVs, PVCs, ConfigMaps, Secrets, ServiceAccounts, ClusterTrustBundles and
    CSIDrivers (all or nothing; other kinds are skipped, exit 3)."""
    try:
        sources = measure(filename)
    except OSError as exc:
        fail(f"{exc.filename}: {exc.strerror.lower() if exc.strerror else exc}")
    small = all(src.size is not None for src in sources)
    small = small and sum(src.size or 0 for src in sources) <= ANY_SERVER_TAKES
    parsed = _load(filename, ANY_SERVER_TAKES, "any NATS server") if small else None
    if parsed is not None and not parsed and not complete:
        fail(f"no objects in {', '.join(filename)}")

    async def send(client: CommandClient) -> dict[str, Any]:
        objects = parsed
        if objects is None:  # large: measured against this server's limit before parsing
            await client.connect()
            where = f"node {client.target.node}"
            try:
                check_sizes(sources, client.max_payload, where)
                objects = _load(filename, client.max_payload, where)
            except TooLargeError as exc:
                fail(str(exc))
            if not objects and not complete:
                fail(f"no objects in {', '.join(filename)}")
        return await client.apply(objects, complete=complete)

    reply = _call(opts, send)
    if output is Output.json:
        print_json(reply)
    else:
        for line in object_cli.apply_lines(reply):
            print_line(line)
    object_cli.report_skipped(reply)


def _load(sources: list[str], limit: int, where: str) -> list[dict[str, Any]]:
    """The objects of every `-f` source, parsed only after their sizes were checked."""
    from volfsm.desired.errors import LoadError  # yaml and the object model: only to apply
    from volfsm.desired.loader import load_objects, parse_objects

    objects: list[dict[str, Any]] = []
    for source in sources:
        try:
            if source == "-":
                objects.extend(parse_objects(read_stdin(limit, where), "<stdin>"))
            else:
                objects.extend(load_objects(source))
        except LoadError as exc:
            fail(str(exc))
    return objects


delete_app = typer.Typer(help="Remove objects from the node's desired state.", no_args_is_help=True)


@delete_app.command("pod")
@service_command
def delete_pod(
    pod: Annotated[
        str | None,
        typer.Argument(
            help="NAMESPACE/NAME (NAME alone: in default) or the pod's uid.", show_default=False
        ),
    ] = None,
    uid: Annotated[str | None, typer.Option("--uid", hidden=True)] = None,  # old: POD is a uid
    *,
    opts: ServiceOptions,
) -> None:
    """Delete a pod: its volumes are then unmounted (`volfsm wait pod --for unmounted`)."""
    if (pod is None) == (uid is None):
        raise typer.BadParameter("give the pod: NAMESPACE/NAME or its uid", param_hint="POD")
    ref = _pod_ref(pod if pod is not None else str(uid))

    async def delete(client: CommandClient) -> str:
        items = await _pods(client)
        found = match_node_pods(items, ref)
        desired = [p for p in found if p.get("desired")]
        if not desired:
            if found:
                _failed(f"pod {ref.text} on node {client.target.node} is already deleted")
            fail(unknown_on_node(ref, items, client.target.node))
        chosen = desired[-1]
        await client.request("delete", {"uid": chosen["uid"]})
        return pod_label(chosen)

    shown = _call(opts, delete)
    print_line(f"pod/{shown} deleted")


def _pod_ref(text: str) -> PodRef:
    try:
        return parse_pod(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="POD") from None


async def _pods(client: CommandClient) -> list[dict[str, Any]]:
    reply = await client.request("get", {"what": "pods"})
    return list(reply.get("items", []))


class What(StrEnum):
    """What `get` lists."""

    pods = "pods"
    volumes = "volumes"


_WHAT_ALIASES = {
    "pod": "pods",
    "po": "pods",
    "volume": "volumes",
    "vol": "volumes",
}


@service_command
def get(
    what: Annotated[
        str,
        typer.Argument(
            help="pods, volumes, or stored objects: configmaps (cm), secrets, pvs, pvcs, "
            "csidrivers, serviceaccounts (sa), clustertrustbundles (ctb).",
            metavar="pods|volumes|configmaps|secrets|pvs|pvcs|csidrivers|...",
        ),
    ],
    name: Annotated[
        str | None,
        typer.Argument(
            help="Only this pod (NAMESPACE/NAME or uid) or volume (its id).",
            show_default=False,
        ),
    ] = None,
    output: OutputOpt = Output.table,
    follow_: Annotated[
        bool,
        typer.Option("--follow", "-w", help="Keep watching: print again whenever it changes."),
    ] = False,
    *,
    opts: ServiceOptions,
) -> None:
    """List pods (per volume: state, usage, last operation, last error, next retry), volumes,
    or the objects kept in the node's object store (a Secret's keys and sizes, never values)."""
    stored = object_cli.object_list(what)
    if stored is not None:
        if follow_:
            raise typer.BadParameter("--follow watches pods and volumes only", param_hint="WHAT")
        _get_objects(opts, stored, name, output)
        return
    key = _WHAT_ALIASES.get(what.lower(), what.lower())
    if key not in (What.pods, What.volumes):
        raise typer.BadParameter(f"{what!r}: expected pods or volumes", param_hint="WHAT")
    ref = _pod_ref(name) if name is not None and key == What.pods else None

    async def fetch(client: CommandClient) -> dict[str, Any]:
        reply = await client.request("get", {"what": key})
        if name is not None:
            reply["items"] = _only(reply, key, name, ref, client.target.node)
        return reply

    def show(reply: dict[str, Any]) -> None:
        if follow_ and output is Output.json:
            print_line(msgspec.json.encode(reply).decode())  # one document per line
            return
        if follow_:
            print_line(f"--- {fmt_ts(time.time_ns() // 1000)}")
        if output is Output.json:
            print_json(reply)
        elif key == What.pods:
            print_pods(reply)
        else:
            print_volumes(reply)

    if not follow_:
        show(_call(opts, fetch))
        return

    async def watch(client: CommandClient) -> None:
        await follow(lambda: fetch(client), stable, show)

    with contextlib.suppress(KeyboardInterrupt):
        _call(opts, watch, waits=True)


def _get_objects(opts: ServiceOptions, what: str, name: str | None, output: Output) -> None:
    """`get configmaps|secrets|...`: the stored objects (NAME or NAMESPACE/NAME: only those)."""
    reply = _call(opts, lambda c: c.request("get", {"what": what}))
    items = object_cli.filter_items(reply, name)
    if name is not None and not items:
        fail(f"no {what} named {name} on the node")
    if output is Output.json:
        print_json({**reply, "items": items})
    else:
        object_cli.print_objects(what, items)


def _only(
    reply: dict[str, Any], key: str, name: str, ref: PodRef | None, node: str
) -> list[dict[str, Any]]:
    """The items of `reply` that `name` names; an unknown one exits 2 listing what there is."""
    items = list(reply.get("items", []))
    if ref is not None:
        found = match_node_pods(items, ref)
        if not found:
            fail(unknown_on_node(ref, items, node))
        return found
    found = [v for v in items if v.get("volume_id") == name]
    if not found:
        ids = sorted(str(v.get("volume_id")) for v in items)
        fail(f"no volume {name} on node {node}; volumes it has: {listing(ids)}")
    return found


class WaitFor(StrEnum):
    """Condition `wait pod` waits for."""

    mounted = "mounted"
    unmounted = "unmounted"


def pod_condition(items: list[dict[str, Any]], for_: WaitFor) -> bool:
    """Whether the pods named (all uids with that namespace/name) meet the condition.

    mounted: a desired one has every volume Mounted; unmounted: none is
    desired and none holds a volume (phase Gone, or unknown to the node).
    """
    if for_ is WaitFor.mounted:
        return any(p.get("desired") and p.get("phase") == "Mounted" for p in items)
    return all(not p.get("desired") and p.get("phase") == "Gone" for p in items)


def explain_wait(items: list[dict[str, Any]], for_: WaitFor) -> str:
    """Which volumes hold the pod back, and why."""
    if not items:
        return "the node does not know this pod (apply it first)"
    parts: list[str] = []
    for pod in items:
        if for_ is WaitFor.mounted and not pod.get("desired"):
            parts.append(f"pod uid {pod.get('uid')} is not desired (deleted)")
            continue
        if for_ is WaitFor.unmounted and pod.get("desired"):
            parts.append(f"pod uid {pod.get('uid')} is still desired (delete it first)")
        for vol in pod.get("volumes") or []:
            state = vol.get("state", "")
            if (for_ is WaitFor.mounted and state == "Mounted") or (
                for_ is WaitFor.unmounted and state not in ("Mounted", "Uncertain")
            ):
                continue
            why = describe_err(vol.get("last_error"))
            retry = describe_retry(vol.get("next_retry_us"))
            text = f"volume {vol.get('name')} is {state}"
            if vol.get("waiting"):
                text += f"; waiting: {vol['waiting']}"
            if why:
                text += f"; last error {why}"
            if retry:
                text += f"; next retry {retry}"
            parts.append(text)
    return "; ".join(parts) or f"phase {', '.join(str(p.get('phase')) for p in items)}"


wait_app = typer.Typer(help="Wait for a condition on the node.", no_args_is_help=True)


@wait_app.command("pod")
@service_command
def wait_pod(
    pod: Annotated[str, typer.Argument(help="NAMESPACE/NAME (NAME alone: in default) or uid.")],
    for_: Annotated[
        WaitFor, typer.Option("--for", help="mounted: every volume Mounted; unmounted: all gone.")
    ],
    timeout: Annotated[
        float, typer.Option("--timeout", min=0, help="Give up after this many seconds.")
    ] = 60.0,
    follow_: Annotated[
        bool,
        typer.Option("--follow", "-w", help="Print each change of the pod's volumes meanwhile."),
    ] = False,
    *,
    opts: ServiceOptions,
) -> None:
    """Wait until a pod's volumes are all mounted, or all unmounted (polls `get`)."""
    ref = _pod_ref(pod)

    async def poll(client: CommandClient) -> tuple[bool, list[dict[str, Any]]]:
        import asyncio

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout

        async def pods() -> list[dict[str, Any]]:
            return match_node_pods(await _pods(client), ref)

        def over(items: list[dict[str, Any]]) -> bool:
            return pod_condition(items, for_) or loop.time() >= deadline

        if follow_:
            items = await follow(pods, _volume_states, _print_progress, until=over,
                                 interval=POLL_INTERVAL_S)  # fmt: skip
            return pod_condition(items, for_), items
        while True:
            items = await pods()
            if over(items):
                return pod_condition(items, for_), items
            await asyncio.sleep(min(POLL_INTERVAL_S, max(0.0, deadline - loop.time())))

    done, items = _call(opts, poll, waits=True)
    shown = pod_label(items[-1]) if items else f"{ref.namespace}/{ref.name}"
    if not done:
        _failed(f"pod {shown} not {for_.value} after {timeout:g}s: {explain_wait(items, for_)}")
    print_line(f"pod/{shown} {for_.value}")


def _volume_states(items: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    return [
        (
            str(p.get("uid")),
            str(v.get("name")),
            str(v.get("state")),
            describe_err(v.get("last_error")),
        )
        for p in items
        for v in p.get("volumes") or []
    ]


def _print_progress(items: list[dict[str, Any]]) -> None:
    now = fmt_ts(time.time_ns() // 1000)
    if not items:
        print_line(f"{now}  the node has no such pod (not yet, or no more)")
    for pod in items:
        for vol in pod.get("volumes") or []:
            err = describe_err(vol.get("last_error"))
            text = f"{now}  {pod_label(pod)} {vol.get('name')}: {vol.get('state')}"
            print_line(text + (f" (last error {err})" if err else ""))


def register(app: typer.Typer) -> None:
    """Add `apply`, `delete pod|configmap|...`, `get` and `wait pod` to the CLI."""
    app.command("apply")(apply)
    object_cli.register_delete(delete_app, service_command, _call)
    app.add_typer(delete_app, name="delete")
    app.command("get")(get)
    app.add_typer(wait_app, name="wait")
