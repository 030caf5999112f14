"""`volfsm explain object KIND NAME [--at T]`: which version of a stored object was current.

Reads only the object's own stream (`object/<Kind>/<namespace>/<name>`):
every ObjectApplied / ObjectDeleted with its resource version, content
hash and key names, up to the moment asked about. Works on a copied log;
a Secret shows the same (its hash is keyed by a secret that stays on the
node, and there is no value in the log).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import typer

from projections.textfmt import TIME_HELP
from volfsm.cli.common import DataDirOpt, DbOpt, Output, OutputOpt, fail, open_log, parse_time
from volfsm.cli.objects import KIND_OF
from volfsm.render import fmt_ts, print_json, print_line

if TYPE_CHECKING:
    from projections.objects import ObjectVersion


def _version_line(version: ObjectVersion) -> str:
    from projections.objects import short_hash

    when = f"{fmt_ts(version.ts_us)}  seq {version.seq}"
    if version.deleted:
        return f"{when}  deleted (uid {version.uid})"
    keys = f"; keys: {', '.join(version.keys)}" if version.keys else ""
    return (
        f"{when}  {version.action} rv {version.resource_version} {short_hash(version.content_hash)}"
        f" (uid {version.uid}){keys}"
    )


def explain_object_cmd(
    kind: Annotated[
        str, typer.Argument(help="configmap, secret, pv, pvc, serviceaccount, csidriver, ...")
    ],
    name: Annotated[
        str, typer.Argument(help="NAMESPACE/NAME (NAME alone: in default), or NAME if unscoped.")
    ],
    at: Annotated[
        str | None,
        typer.Option("--at", help=f"As of this moment (default: the end of the log). {TIME_HELP}"),
    ] = None,
    output: OutputOpt = Output.table,
    data_dir: DataDirOpt = None,
    db: DbOpt = None,
) -> None:
    """Which version of a stored object (ConfigMap, Secret, ...) was current, and its history."""
    from events.streams import object_stream
    from projections.objects import ObjectVersions

    found = KIND_OF.get(kind.lower())
    if found is None:
        fail(f"unknown kind {kind!r}; known: {', '.join(sorted({k for k, _ in KIND_OF.values()}))}")
    object_kind, namespaced = found
    namespace, sep, bare = name.rpartition("/")
    if namespaced:
        namespace = namespace if sep else "default"
    elif sep:
        fail(f"a {object_kind} has no namespace: give NAME")
    at_us = parse_time(at, option="--at") if at is not None else None
    versions = ObjectVersions()
    with open_log(data_dir, db) as log:
        stream = object_stream(object_kind, namespace, bare)
        for env in log.read_stream(stream):
            if at_us is None or env.ts <= at_us:
                versions.apply(env)
    key = (object_kind, namespace, bare)
    history = versions.history.get(key, [])
    label = f"{object_kind} {namespace}/{bare}" if namespace else f"{object_kind} {bare}"
    if not history:
        when = f" at or before {fmt_ts(at_us)}" if at_us is not None else ""
        fail(f"the log records no {label}{when}")
    current = versions.current(key)
    if output is Output.json:
        doc: dict[str, Any] = {
            "kind": object_kind,
            "namespace": namespace,
            "name": bare,
            "at": fmt_ts(at_us) if at_us is not None else None,
            "current": msgspec.to_builtins(current) if current is not None else None,
            "history": [msgspec.to_builtins(v) for v in history],
        }
        print_json(doc)
        return
    moment = fmt_ts(at_us) if at_us is not None else "the end of the log"
    print_line(f"{label} at {moment}")
    if current is None:
        print_line("current: none (deleted)")
    else:
        print_line(f"current: {_version_line(current)}")
    print_line("history:")
    for version in history:
        print_line(f"  {_version_line(version)}")


def register(explain_app: typer.Typer) -> None:
    """Add `explain object` to the `explain` command group."""
    explain_app.command("object")(explain_object_cmd)
