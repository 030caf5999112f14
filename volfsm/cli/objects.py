"""The stored objects on the command line: `apply`'s report, `get configmaps|secrets|...`,
`delete configmap|secret|pv|...`.

Exit codes of `apply`: 0 applied, 1 refused (nothing applied) or the
service unreachable, 2 a bad argument or file, 3 applied, but some objects
were skipped (kinds a node does not run, each named in one line on stderr).

`get` of a Secret shows its keys and their sizes, never a value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from volfsm.render import fmt_ts, print_line, print_table

EXIT_SKIPPED = 3
"""`apply` exit code: what could be applied was, but some objects were skipped."""

LISTS: dict[str, str] = {
    "configmaps": "configmaps",
    "configmap": "configmaps",
    "cm": "configmaps",
    "secrets": "secrets",
    "secret": "secrets",
    "persistentvolumes": "persistentvolumes",
    "persistentvolume": "persistentvolumes",
    "pvs": "persistentvolumes",
    "pv": "persistentvolumes",
    "persistentvolumeclaims": "persistentvolumeclaims",
    "persistentvolumeclaim": "persistentvolumeclaims",
    "pvcs": "persistentvolumeclaims",
    "pvc": "persistentvolumeclaims",
    "csidrivers": "csidrivers",
    "csidriver": "csidrivers",
    "serviceaccounts": "serviceaccounts",
    "serviceaccount": "serviceaccounts",
    "sa": "serviceaccounts",
    "clustertrustbundles": "clustertrustbundles",
    "clustertrustbundle": "clustertrustbundles",
    "ctb": "clustertrustbundles",
}
"""What `get` takes for stored objects (kubectl's names and short names) -> the list."""

DELETABLE: dict[str, tuple[str, bool]] = {
    "configmap": ("ConfigMap", True),
    "secret": ("Secret", True),
    "pv": ("PersistentVolume", False),
    "pvc": ("PersistentVolumeClaim", True),
    "serviceaccount": ("ServiceAccount", True),
    "clustertrustbundle": ("ClusterTrustBundle", False),
    "csidriver": ("CSIDriver", False),
}
"""`delete` subcommand -> (kind, namespaced)."""

KIND_OF: dict[str, tuple[str, bool]] = {
    **DELETABLE,
    **{kind.lower(): (kind, namespaced) for kind, namespaced in DELETABLE.values()},
    **{
        list_name: DELETABLE[command]
        for list_name, command in (
            ("configmaps", "configmap"),
            ("cm", "configmap"),
            ("secrets", "secret"),
            ("pvs", "pv"),
            ("persistentvolumes", "pv"),
            ("pvcs", "pvc"),
            ("persistentvolumeclaims", "pvc"),
            ("serviceaccounts", "serviceaccount"),
            ("sa", "serviceaccount"),
            ("clustertrustbundles", "clustertrustbundle"),
            ("ctb", "clustertrustbundle"),
            ("csidrivers", "csidriver"),
        )
    },
    "pod": ("Pod", True),
    "pods": ("Pod", True),
}
"""What `explain object` takes as KIND -> (kind, namespaced)."""


def object_list(what: str) -> str | None:
    """The stored-object list `what` names ("cm" -> "configmaps"), or None."""
    return LISTS.get(what.lower())


# ---------------------------------------------------------------- apply


def apply_lines(reply: dict[str, Any]) -> list[str]:
    """What `apply` prints: one line per object (a pod with its uid, and what it waits for if
    it is pending; a line more for a pod admission gave a token volume), then the deleted
    pods."""
    lines = []
    for result in reply.get("results", []):
        namespace = result.get("namespace") or ""
        where = f"{namespace}/{result['name']}" if namespace else result["name"]
        line = f"{str(result['kind']).lower()}/{where} {result['action']}"
        if result.get("kind") == "Pod" and result.get("uid"):
            line += f" (uid {result['uid']})"
        if result.get("waiting"):
            accepted = "" if result.get("action") == "still waiting" else "accepted, "
            line += f"; {accepted}waiting: {result['waiting']}"
        note = result.get("note")
        if note and result.get("kind") != "Pod":
            line += f" ({note})"
        lines.append(line)
        if note and result.get("kind") == "Pod":
            lines.append(f"pod/{where}: {note}")
    for pod in reply.get("deleted", []):
        lines.append(f"pod/{pod['namespace']}/{pod['name']} deleted (not in the desired state)")
    if reply.get("desired_complete"):
        lines.append("desired state complete: volumes no pod wants may now be unmounted")
    return lines


def skipped_lines(reply: dict[str, Any]) -> list[str]:
    """One line per skipped object (for stderr)."""
    return [str(item.get("message", item)) for item in reply.get("skipped", [])]


def report_skipped(reply: dict[str, Any]) -> None:
    """Name each skipped object on stderr and exit 3 if there was any."""
    lines = skipped_lines(reply)
    for line in lines:
        typer.echo(line, err=True)
    if lines:
        raise typer.Exit(EXIT_SKIPPED)


# ------------------------------------------------------------------ get


def _only(items: list[dict[str, Any]], name: str | None) -> list[dict[str, Any]]:
    if name is None:
        return items
    namespace, sep, bare = name.rpartition("/")
    return [
        item
        for item in items
        if item.get("name") == bare and (not sep or item.get("namespace") == namespace)
    ]


def filter_items(reply: dict[str, Any], name: str | None) -> list[dict[str, Any]]:
    """The items named NAME or NAMESPACE/NAME (all of them without a name)."""
    return _only(list(reply.get("items", [])), name)


def _who(item: dict[str, Any]) -> list[str]:
    return [item.get("namespace", ""), item.get("name", "")]


def _rv(item: dict[str, Any]) -> str:
    return str(item.get("resource_version", ""))


def _hash(item: dict[str, Any]) -> str:
    digest = str(item.get("content_hash", ""))
    kind, _, hexa = digest.partition(":")
    return f"{kind}:{hexa[:12]}" if hexa else digest


def _keys(summary: dict[str, Any]) -> str:
    keys = summary.get("keys") or {}
    return ", ".join(f"{key} ({size} B)" for key, size in keys.items()) or "-"


def _yes(value: Any) -> str:
    return "yes" if value else "no"


_COLUMNS: dict[str, tuple[list[str], Callable[[dict[str, Any], dict[str, Any]], list[str]]]] = {
    "configmaps": (
        ["NAMESPACE", "NAME", "KEYS", "RV", "HASH", "UPDATED"],
        lambda i, s: [*_who(i), _keys(s), _rv(i), _hash(i), fmt_ts(i.get("updated_us"))],
    ),
    "secrets": (
        ["NAMESPACE", "NAME", "TYPE", "KEYS", "RV", "UPDATED"],
        lambda i, s: [
            *_who(i),
            str(s.get("type", "")),
            _keys(s),
            _rv(i),
            fmt_ts(i.get("updated_us")),
        ],
    ),
    "persistentvolumes": (
        ["NAME", "CAPACITY", "DRIVER", "HANDLE", "MODE", "CLAIM", "RV"],
        lambda i, s: [
            i.get("name", ""),
            s.get("capacity", ""),
            s.get("driver", ""),
            s.get("volume_handle", ""),
            s.get("volume_mode", ""),
            s.get("claim", ""),
            _rv(i),
        ],
    ),
    "persistentvolumeclaims": (
        ["NAMESPACE", "NAME", "VOLUME", "CAPACITY", "PHASE", "MODE", "RV"],
        lambda i, s: [
            *_who(i),
            s.get("volume", ""),
            s.get("capacity", ""),
            s.get("phase", ""),
            s.get("volume_mode", ""),
            _rv(i),
        ],
    ),
    "csidrivers": (
        ["NAME", "ATTACH", "POD INFO", "FSGROUP POLICY", "REPUBLISH", "TOKENS", "MODES", "RV"],
        lambda i, s: [
            i.get("name", ""),
            _yes(s.get("attach_required")),
            _yes(s.get("pod_info_on_mount")),
            str(s.get("fs_group_policy", "")),
            _yes(s.get("requires_republish")),
            ", ".join(a or '""' for a in s.get("token_audiences") or []) or "-",
            ", ".join(s.get("volume_lifecycle_modes") or []),
            _rv(i),
        ],
    ),
    "serviceaccounts": (
        ["NAMESPACE", "NAME", "AUTOMOUNT TOKEN", "RV"],
        lambda i, s: [*_who(i), str(s.get("automount_service_account_token", "")), _rv(i)],
    ),
    "clustertrustbundles": (
        ["NAME", "SIGNER", "CERTIFICATES", "RV"],
        lambda i, s: [
            i.get("name", ""),
            s.get("signer_name", "") or "-",
            str(s.get("certificates", "")),
            _rv(i),
        ],
    ),
}


def print_objects(what: str, items: list[dict[str, Any]]) -> None:
    """A table of stored objects of one list."""
    headers, row = _COLUMNS[what]
    print_table("", headers, [row(item, item.get("summary") or {}) for item in items])


# --------------------------------------------------------------- delete


Call = Callable[..., Any]


def register_delete(delete_app: typer.Typer, service_command: Call, call: Call) -> None:
    """Add `delete configmap|secret|pv|pvc|serviceaccount|clustertrustbundle|csidriver`."""
    for command, (kind, namespaced) in DELETABLE.items():
        delete_app.command(command)(service_command(_delete_command(kind, namespaced, call)))


def _delete_command(kind: str, namespaced: bool, call: Call) -> Callable[..., None]:
    shape = "NAMESPACE/NAME (NAME alone: in default)" if namespaced else "NAME"

    def delete(name: str, *, opts: Any) -> None:
        namespace, sep, bare = name.rpartition("/")
        if not namespaced and sep:
            raise typer.BadParameter(f"a {kind} has no namespace: give NAME", param_hint="NAME")
        if not bare or "/" in namespace or (sep and not namespace):
            raise typer.BadParameter(f"expected {shape}, got {name!r}", param_hint="NAME")
        body = {"kind": kind, "name": bare}
        if namespaced:
            body["namespace"] = namespace or "default"
        call(opts, lambda client: client.request("delete", body))
        where = f"{body['namespace']}/{bare}" if namespaced else bare
        print_line(f"{kind.lower()}/{where} deleted")

    delete.__doc__ = f"Delete a {kind} from the node's object store."
    delete.__name__ = f"delete_{kind.lower()}"
    delete.__annotations__ = {
        "name": Annotated[str, typer.Argument(help=f"{shape}.", show_default=False)],
        "opts": Any,
        "return": None,
    }
    return delete
