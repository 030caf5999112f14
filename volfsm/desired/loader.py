"""Reading Kubernetes-shaped objects from YAML/JSON files, directories, stdin or text.

Multi-document YAML, JSON lists and `kind: List` objects are all spread into
one flat list of dicts. Timestamps stay strings (the objects stay
JSON-shaped, so they can be sent over the bus as they are).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import yaml

from volfsm.desired.errors import LoadError

SUFFIXES = (".yaml", ".yml", ".json")
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"

_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _ObjectLoader(_BaseLoader):  # type: ignore[valid-type,misc]
    """A safe loader that leaves timestamps as strings."""


_ObjectLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
    for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
}


def load_objects(
    source: str | os.PathLike[str], *, stdin: TextIO | None = None
) -> list[dict[str, Any]]:
    """Objects from a file, a directory (its *.yaml, *.yml, *.json, sorted), '-' or text.

    A `str` holding a newline is parsed as text; '-' reads `stdin` (default
    sys.stdin); anything else is a path. Raises LoadError naming the file
    and the document index.
    """
    if isinstance(source, str) and source == "-":
        stream = stdin if stdin is not None else sys.stdin
        return parse_objects(stream.read(), "<stdin>")
    if isinstance(source, str) and "\n" in source:
        return parse_objects(source, "<text>")
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
        return [obj for file in files for obj in _load_file(file)]
    return _load_file(path)


def _load_file(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LoadError(str(path), "no such file or directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LoadError(str(path), f"cannot read: {exc}") from None
    return parse_objects(text, str(path), json_only=path.suffix == ".json")


def parse_objects(
    text: str, origin: str = "<text>", *, json_only: bool = False
) -> list[dict[str, Any]]:
    """Objects from YAML (possibly multi-document) or JSON text; `origin` names it in errors."""
    if json_only or text.lstrip()[:1] in ("{", "["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            if json_only:
                where = f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
                raise LoadError(origin, where, 0) from None
        else:
            return list(_objects(data, origin, 0))
    objects: list[dict[str, Any]] = []
    parsed = 0  # documents parsed so far: the index of the one being parsed
    try:
        for data in yaml.load_all(text, Loader=_ObjectLoader):
            objects.extend(_objects(data, origin, parsed))
            parsed += 1
    except yaml.YAMLError as exc:
        raise LoadError(origin, _yaml_problem(exc), parsed) from None
    return objects


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        problem = exc.problem or str(exc)
        return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return f"invalid YAML: {exc}"


def _objects(data: Any, origin: str, index: int) -> Iterator[dict[str, Any]]:
    """The objects one document holds: itself, a List's items, or a JSON list's items."""
    if data is None:
        return
    if isinstance(data, list):
        items, what = data, "list"
    elif isinstance(data, dict) and data.get("kind") == "List":
        items, what = data.get("items") or [], "List items"
        if not isinstance(items, list):
            raise LoadError(origin, "a List's items must be a list", index)
    elif isinstance(data, dict):
        yield data
        return
    else:
        raise LoadError(
            origin, f"expected an object or a list of objects, got {type(data).__name__}", index
        )
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            raise LoadError(
                origin, f"{what}[{position}]: expected an object, got {type(item).__name__}", index
            )
        if item.get("kind") == "List":
            yield from _objects(item, origin, index)
        else:
            yield item
