"""`volfsm apply | delete pod | get | wait pod`: commands to a running `volfsm serve`.

They find the service through `--nats` (or `$VOLFSM_NATS`, or the
`nats.url` file the service writes in its data dir) and `--node` (or
`$VOLFSM_NODE`, the data dir's `node` file, the host name): every command
takes the same connection options (declared once, added by
`service_command`, gathered in `ServiceOptions`) and talks to the service
through `_call`. Exit codes: 0 done, 1 the service refused
or could not be reached (or a wait timed out), 2 a bad argument or file.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import msgspec
import typer

from projections.asw import OperationRecord
from projections.textfmt import describe_error, describe_operation
from volfsm.cli.common import DataDirOpt, Output, OutputOpt, fail
from volfsm.desired.errors import LoadError
from volfsm.desired.loader import load_objects
from volfsm.gate import gate_text
from volfsm.render import fmt_bytes, fmt_ts, print_json, print_line, print_table
from volfsm.service.client import (
    DEFAULT_TIMEOUT_S,
    NATS_ENV,
    NODE_ENV,
    CommandFailedError,
    ServiceClient,
    ServiceUnreachableError,
    Target,
    auth_options,
    find_target,
)
from volfsm.service.config import ConfigError

EXIT_FAILED = 1
"""Exit code when the service refused the command, was unreachable, or a wait timed out."""

POLL_INTERVAL_S = 0.2
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


def _auth(name: str, env: str, help_text: str) -> Any:
    return typer.Option(name, envvar=env, help=help_text, rich_help_panel=PANEL, show_default=False)


UserOpt = Annotated[str | None, _auth("--nats-user", "VOLFSM_NATS_USER", "NATS user.")]
PasswordOpt = Annotated[
    str | None, _auth("--nats-password", "VOLFSM_NATS_PASSWORD", "NATS password.")
]
TokenOpt = Annotated[str | None, _auth("--nats-token", "VOLFSM_NATS_TOKEN", "NATS token.")]
CredsOpt = Annotated[str | None, _auth("--nats-creds", "VOLFSM_NATS_CREDS", "NATS .creds file.")]
CaOpt = Annotated[str | None, _auth("--nats-tls-ca", "VOLFSM_NATS_TLS_CA", "CA for NATS TLS.")]
CertOpt = Annotated[
    str | None, _auth("--nats-tls-cert", "VOLFSM_NATS_TLS_CERT", "Client cert for NATS TLS.")
]
KeyOpt = Annotated[
    str | None, _auth("--nats-tls-key", "VOLFSM_NATS_TLS_KEY", "Client key for NATS TLS.")
]


@dataclass(frozen=True)
class ServiceOptions:
    """How a command finds and talks to the service: its connection options."""

    nats: str | None
    node: str | None
    data_dir: Path | None
    request_timeout: float
    nats_user: str | None
    nats_password: str | None
    nats_token: str | None
    nats_creds: str | None
    nats_tls_ca: str | None
    nats_tls_cert: str | None
    nats_tls_key: str | None

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> ServiceOptions:
        """The connection options among a command's parameters."""
        return cls(**{f.name: params[f.name] for f in fields(cls)})

    def target(self) -> Target:
        """Where the service is; a bad option exits 2, no service found exits 1."""
        try:
            options = auth_options(
                user=self.nats_user,
                password=self.nats_password,
                token=self.nats_token,
                creds=self.nats_creds,
                tls_ca=self.nats_tls_ca,
                tls_cert=self.nats_tls_cert,
                tls_key=self.nats_tls_key,
            )
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
        ("nats_user", UserOpt, None),
        ("nats_password", PasswordOpt, None),
        ("nats_token", TokenOpt, None),
        ("nats_creds", CredsOpt, None),
        ("nats_tls_ca", CaOpt, None),
        ("nats_tls_cert", CertOpt, None),
        ("nats_tls_key", KeyOpt, None),
    )
]
"""The options every service command takes, one per `ServiceOptions` field."""


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


def _call(opts: ServiceOptions, work: Callable[[ServiceClient], Awaitable[T]]) -> T:
    """Find the service, connect, run `work`, close; errors: one line on stderr, exit 1."""
    target = opts.target()

    async def main() -> T:
        async with ServiceClient(target, timeout=opts.request_timeout) as client:
            return await work(client)

    try:
        return asyncio.run(main())
    except ServiceUnreachableError as exc:
        _failed(str(exc))
    except CommandFailedError as exc:
        _failed(f"node {target.node}: {exc}")


def _split_name(text: str) -> tuple[str, str]:
    namespace, sep, name = text.partition("/")
    if not sep:
        namespace, name = "default", text
    if not namespace or not name or "/" in name:
        raise typer.BadParameter(f"expected NAMESPACE/NAME or NAME, got {text!r}")
    return namespace, name


# --------------------------------------------------------------- formatting


def _record(op: dict[str, Any] | None) -> OperationRecord | None:
    """An operation status from a reply, as the log's record (None if absent or malformed)."""
    if not op:
        return None
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
            rows.append([name, pod.get("phase", ""), "", "", "", "", ""])
        for vol in volumes:
            rows.append(
                [
                    name,
                    pod.get("phase", ""),
                    vol.get("name", ""),
                    vol.get("state", ""),
                    describe_op(vol.get("last_operation")),
                    describe_err(vol.get("last_error")),
                    describe_retry(vol.get("next_retry_us")),
                ]
            )
    print_line(_header(reply))
    print_table(
        "",
        ["POD", "PHASE", "VOLUME", "STATE", "LAST OP", "LAST ERROR", "NEXT RETRY"],
        rows,
    )
    for pod in reply.get("items", []):
        for vol in pod.get("volumes") or []:
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
        ["VOLUME", "STATE", "PLUGIN", "SIZE", "HOLDERS", "LAST OP", "LAST ERROR", "NEXT RETRY"],
        rows,
    )
    for vol in reply.get("items", []):
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
    """Apply PersistentVolumes, PersistentVolumeClaims and Pods (all or nothing)."""
    objects: list[dict[str, Any]] = []
    for source in filename:
        try:
            objects.extend(load_objects(source))
        except LoadError as exc:
            fail(str(exc))
    if not objects and not complete:
        fail(f"no objects in {', '.join(filename)}")
    reply = _call(opts, lambda c: c.apply(objects, complete=complete))
    if output is Output.json:
        print_json(reply)
        return
    for result in reply.get("results", []):
        where = f"{result['namespace']}/{result['name']}" if result["namespace"] else result["name"]
        print_line(f"{str(result['kind']).lower()}/{where} {result['action']}")
    for pod in reply.get("deleted", []):
        print_line(f"pod/{pod['namespace']}/{pod['name']} deleted (not in the desired state)")
    if reply.get("desired_complete"):
        print_line("desired state complete: volumes no pod wants may now be unmounted")


delete_app = typer.Typer(help="Remove objects from the node's desired state.", no_args_is_help=True)


@delete_app.command("pod")
@service_command
def delete_pod(
    pod: Annotated[
        str | None, typer.Argument(help="NAMESPACE/NAME (or NAME in default).", show_default=False)
    ] = None,
    uid: Annotated[str | None, typer.Option("--uid", help="Delete by pod UID instead.")] = None,
    *,
    opts: ServiceOptions,
) -> None:
    """Delete a pod: its volumes are then unmounted (`volfsm wait pod --for unmounted`)."""
    if (pod is None) == (uid is None):
        raise typer.BadParameter("give NAMESPACE/NAME or --uid", param_hint="POD")
    body: dict[str, str]
    if uid is not None:
        body, shown = {"uid": uid}, f"uid {uid}"
    else:
        assert pod is not None
        namespace, name = _split_name(pod)
        body, shown = {"namespace": namespace, "name": name}, f"{namespace}/{name}"
    _call(opts, lambda c: c.request("delete", body))
    print_line(f"pod/{shown} deleted")


class What(StrEnum):
    """What `get` lists."""

    pods = "pods"
    volumes = "volumes"


_WHAT_ALIASES = {
    "pod": "pods",
    "po": "pods",
    "volume": "volumes",
    "vol": "volumes",
    "pv": "volumes",
}


@service_command
def get(
    what: Annotated[str, typer.Argument(help="pods or volumes.", metavar="pods|volumes")],
    output: OutputOpt = Output.table,
    *,
    opts: ServiceOptions,
) -> None:
    """List pods (per volume: state, last operation, last error, next retry) or volumes."""
    key = _WHAT_ALIASES.get(what.lower(), what.lower())
    if key not in (What.pods, What.volumes):
        raise typer.BadParameter(f"{what!r}: expected pods or volumes", param_hint="WHAT")
    reply = _call(opts, lambda c: c.request("get", {"what": key}))
    if output is Output.json:
        print_json(reply)
    elif key == What.pods:
        print_pods(reply)
    else:
        print_volumes(reply)


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
    pod: Annotated[str, typer.Argument(help="NAMESPACE/NAME (or NAME in default).")],
    for_: Annotated[
        WaitFor, typer.Option("--for", help="mounted: every volume Mounted; unmounted: all gone.")
    ],
    timeout: Annotated[
        float, typer.Option("--timeout", min=0, help="Give up after this many seconds.")
    ] = 60.0,
    *,
    opts: ServiceOptions,
) -> None:
    """Wait until a pod's volumes are all mounted, or all unmounted (polls `get`)."""
    namespace, name = _split_name(pod)
    query = {"what": "pods", "namespace": namespace, "name": name}

    async def poll(client: ServiceClient) -> tuple[bool, list[dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            reply = await client.request("get", query)
            items = list(reply.get("items", []))
            if pod_condition(items, for_):
                return True, items
            if loop.time() >= deadline:
                return False, items
            await asyncio.sleep(min(POLL_INTERVAL_S, max(0.0, deadline - loop.time())))

    done, items = _call(opts, poll)
    if not done:
        _failed(
            f"pod {namespace}/{name} not {for_.value} after {timeout:g}s: "
            f"{explain_wait(items, for_)}"
        )
    print_line(f"pod/{namespace}/{name} {for_.value}")


def register(app: typer.Typer) -> None:
    """Add `apply`, `delete pod`, `get` and `wait pod` to the CLI."""
    app.command("apply")(apply)
    app.add_typer(delete_app, name="delete")
    app.command("get")(get)
    app.add_typer(wait_app, name="wait")
