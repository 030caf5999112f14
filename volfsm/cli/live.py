"""What the service commands share beyond the connection: pods named the one way, files
checked before they are parsed, and `--follow`.

* A pod is `NAMESPACE/NAME` or its uid (`volfsm.cli.refs.parse_pod`); a
  `get` reply is matched on the client, so a bare `NAME` is a uid if the
  node has a pod with that uid, else `default/NAME`.
* `apply -f` files are measured before anything parses them: one bigger
  than a message the bus carries (the server's max_payload, which the
  embedded server derives from `volfsm serve --max-command-bytes`) is
  refused with the limit, instead of being parsed and then refused.
* `--follow` polls and prints again only what changed.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from projections.textfmt import size_text
from volfsm.cli.refs import PodRef, listing

FOLLOW_INTERVAL_S = 0.5
SUFFIXES = (".yaml", ".yml", ".json")
"""The files `apply -f DIR` reads (as `volfsm.desired.loader` does)."""


# --------------------------------------------------------------------- pods


def pod_label(pod: dict[str, Any]) -> str:
    """'namespace/name' of a pod in a reply."""
    return f"{pod.get('namespace', '')}/{pod.get('name', '')}"


def match_node_pods(items: Iterable[dict[str, Any]], ref: PodRef) -> list[dict[str, Any]]:
    """The pods of a `get pods` reply that `ref` names (its uid, else its name)."""
    pods = list(items)
    same_uid = [p for p in pods if p.get("uid") == ref.text]
    if same_uid:
        return same_uid
    return [p for p in pods if (p.get("namespace"), p.get("name")) == (ref.namespace, ref.name)]


def unknown_on_node(ref: PodRef, items: Iterable[dict[str, Any]], node: str) -> str:
    """'no pod shop/web-0 on node n1; pods it has: ...'."""
    shown = ref.text if "/" in ref.text else f"{ref.text} (uid, or {ref.namespace}/{ref.name})"
    labels = sorted({pod_label(p) for p in items if p.get("name")})
    return f"no pod {shown} on node {node}; pods it has: {listing(labels)}"


# -------------------------------------------------------------------- files


class TooLargeError(ValueError):
    """A file is larger than one command may carry."""


@dataclass(frozen=True, slots=True)
class Source:
    """One `-f` argument: a file, a directory or '-' (stdin), and its size (None for stdin)."""

    name: str
    size: int | None


def measure(sources: Iterable[str]) -> list[Source]:
    """Each source with its size in bytes (a directory: its YAML and JSON files together).

    FileNotFoundError (with the name) for a path that does not exist.
    """
    out = []
    for name in sources:
        if name == "-":
            out.append(Source(name, None))
            continue
        path = Path(name)
        if path.is_dir():
            files = [p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file()]
            out.append(Source(name, sum(p.stat().st_size for p in files)))
        else:
            out.append(Source(name, path.stat().st_size))
    return out


def check_sizes(sources: Iterable[Source], limit: int, where: str) -> None:
    """TooLargeError naming the first source larger than `limit`, or all of them together."""
    total = 0
    for src in sources:
        if src.size is None:
            continue
        total += src.size
        if src.size > limit:
            raise TooLargeError(
                f"{src.name} is {size_text(src.size)}, more than one command to {where} may "
                f"carry ({size_text(limit)}): split it into smaller files"
            )
    if total > limit:
        raise TooLargeError(
            f"the files are {size_text(total)} together, more than one command to {where} may "
            f"carry ({size_text(limit)}): apply them in several commands"
        )


def read_stdin(limit: int, where: str) -> str:
    """Standard input as text, refused (TooLargeError) once it passes `limit` bytes."""
    data = sys.stdin.buffer.read(limit + 1)
    if len(data) > limit:
        raise TooLargeError(
            f"standard input is more than one command to {where} may carry ({size_text(limit)})"
        )
    return data.decode("utf-8", errors="replace")


# ------------------------------------------------------------------- follow


async def follow(
    poll: Callable[[], Awaitable[Any]],
    key: Callable[[Any], Any],
    show: Callable[[Any], None],
    *,
    until: Callable[[Any], bool] = lambda _: False,
    interval: float = FOLLOW_INTERVAL_S,
) -> Any:
    """Poll; show a result when `key` of it changed; return the first result `until` accepts.

    SIGTERM (like Ctrl-C) ends it quietly: the last result is returned.
    """
    import asyncio
    import contextlib
    import signal

    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    last: Any = object()
    while True:
        result = await poll()
        seen = key(result)
        if seen != last:
            show(result)
            sys.stdout.flush()
            last = seen
        if until(result) or stop.is_set():
            return result
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


def stable(reply: dict[str, Any]) -> Any:
    """What of a `get` reply counts as a change (not the seq, lag or retry countdowns)."""
    items = reply.get("items", [])
    return [
        {k: v for k, v in item.items() if k not in ("next_retry_us",)}
        if "volumes" not in item
        else {
            **{k: v for k, v in item.items() if k != "volumes"},
            "volumes": [
                {k: v for k, v in vol.items() if k not in ("next_retry_us",)}
                for vol in item.get("volumes") or []
            ],
        }
        for item in items
    ]
