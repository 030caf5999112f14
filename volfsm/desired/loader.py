"""Reading Kubernetes-shaped objects from YAML/JSON files, directories, stdin or text.

Multi-document YAML, JSON lists and `kind: List` objects are all spread into
one flat list of dicts, JSON-shaped (so they can be sent over the bus as
they are).

Scalars are read the way `kubectl` reads them (sigs.k8s.io/yaml over
go-yaml v2), so a manifest kubectl accepts means the same here:

* numbers as go-yaml resolves them: `0644` and `0o644` are octal (420),
  `0x1F`, `0b101`, `1_000` and `1e3` are numbers; YAML 1.1 base-60 numbers
  (`1:30`) are strings;
* timestamps stay strings;
* booleans are YAML 1.2's: only `true`/`false` (any case kubectl takes);
  `yes`/`no`/`on`/`off`/`y`/`n` stay strings. kubectl turns them into
  booleans, which the API server then refuses in every string field and
  takes in boolean fields: `volfsm.desired.normalize` reads those words as
  booleans in boolean fields, so both cases mean what kubectl means;
* a plain mapping key is the text as written (`on:` is the key "on", where
  kubectl would make it "true");
* `!!binary` values are refused (kubectl refuses them too);
* a key written twice in one mapping is refused, as kubectl refuses it (a key a `<<`
  merge brought in may be overridden); in JSON too, in the same words.

Text is JSON when it starts with `{` or `[` (kubectl looks at the content, not the
file's name): a `.json` file holding YAML is read as YAML.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from volfsm.desired.errors import LoadError

SUFFIXES = (".yaml", ".yml", ".json")

_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_NULL_TAG = "tag:yaml.org,2002:null"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_REPLACED = {
    _NULL_TAG,
    _BOOL_TAG,
    _INT_TAG,
    _FLOAT_TAG,
    "tag:yaml.org,2002:timestamp",
    "tag:yaml.org,2002:value",
}
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^[-+]?(?:0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+|[0-9][0-9_]*)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_GO_INT_RANGE = (-(2**63), 2**64)
"""What go-yaml reads as an integer (int64 or uint64); anything bigger becomes a float."""


def _go_int(text: str) -> int | float:
    """An integer as Go's strconv.ParseInt(text, 0, 64) after removing '_' (go-yaml v2)."""
    plain = text.replace("_", "")
    sign = -1 if plain.startswith("-") else 1
    digits = plain.lstrip("+-")
    prefix = digits[:2].lower()
    try:
        if prefix in ("0x", "0b", "0o"):
            value = int(digits[2:], {"0x": 16, "0b": 2, "0o": 8}[prefix])
        elif len(digits) > 1 and digits.startswith("0"):
            value = int(digits, 8)
        else:
            value = int(digits, 10)
    except ValueError:  # "08", "09": not octal; go-yaml falls back to a float
        return float(plain)
    value *= sign
    low, high = _GO_INT_RANGE
    return value if low <= value < high else float(value)


def _go_float(text: str) -> float:
    plain = text.replace("_", "")
    lowered = plain.lower().lstrip("+")
    if lowered in (".inf", "-.inf", ".nan"):
        return float(lowered.replace(".", ""))
    return float(plain)


def _refuse_repeated(key: Any, key_node: Node, first_line: dict[Any, int]) -> None:
    """Note where `key` is written in its mapping; refuse it written a second time, with
    go-yaml's words (kubectl: `mapping key "volumes" already defined at line 6`)."""
    if key in first_line:
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"mapping key {json.dumps(str(key))} already defined at line {first_line[key]}",
            key_node.start_mark,
        )
    first_line[key] = key_node.start_mark.line + 1


class _ObjectLoader(_BaseLoader):  # type: ignore[valid-type,misc]
    """A safe loader with kubectl's scalars (see the module docstring)."""

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        """A mapping whose plain scalar keys are the text as written; a key written twice
        is refused, as kubectl refuses it (a key a `<<` merge brought may be overridden)."""
        own = {id(key) for key, _ in node.value if key.tag != _MERGE_TAG}
        if isinstance(node, MappingNode):
            self.flatten_mapping(node)
        mapping: dict[Any, Any] = {}
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode) and not key_node.style:  # plain ('' from libyaml)
                key: Any = key_node.value
            else:
                key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    "found a key that is not a scalar",
                    key_node.start_mark,
                ) from None
            if id(key_node) in own:  # written here, not brought by a merge
                _refuse_repeated(key, key_node, first_line)
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping

    def construct_yaml_int(self, node: Node) -> int | float:
        """go-yaml's integers: 0644 and 0o644 are octal."""
        return _go_int(str(self.construct_scalar(node)))

    def construct_yaml_float(self, node: Node) -> float:
        """go-yaml's floats."""
        return _go_float(str(self.construct_scalar(node)))

    def construct_yaml_binary(self, node: Node) -> Any:
        """Refused, as kubectl refuses it."""
        raise yaml.constructor.ConstructorError(
            None,
            None,
            "!!binary is not supported (kubectl refuses it too): put base64 text in "
            "data or binaryData",
            node.start_mark,
        )


_ObjectLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _REPLACED]
    for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
}
for _tag, _regexp, _firsts in (
    (_NULL_TAG, _NULL, ["~", "n", "N", ""]),
    (_BOOL_TAG, _BOOL, list("tTfF")),
    (_INT_TAG, _INT, list("-+0123456789")),
    (_FLOAT_TAG, _FLOAT, list("-+.0123456789")),
):
    _ObjectLoader.add_implicit_resolver(_tag, _regexp, _firsts)
_ObjectLoader.add_constructor(_INT_TAG, _ObjectLoader.construct_yaml_int)
_ObjectLoader.add_constructor(_FLOAT_TAG, _ObjectLoader.construct_yaml_float)
_ObjectLoader.add_constructor("tag:yaml.org,2002:binary", _ObjectLoader.construct_yaml_binary)
assert _MERGE_TAG in {tag for rs in _ObjectLoader.yaml_implicit_resolvers.values() for tag, _ in rs}


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
    return parse_objects(text, str(path), json_errors=path.suffix == ".json")


class _RepeatedKey(ValueError):
    """A JSON object names a key twice."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object; a key written twice is refused (kubectl refuses it)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _RepeatedKey(key)
        found[key] = value
    return found


def _repeated_json_key(text: str, key: str) -> str:
    """The problem of a JSON text naming `key` twice, in go-yaml's words and with the lines
    (read as YAML, which JSON is, to find them) when YAML can say where."""
    try:
        for _ in yaml.load_all(text, Loader=_ObjectLoader):
            pass
    except yaml.MarkedYAMLError as exc:
        mark, problem = exc.problem_mark, exc.problem or ""
        if mark is not None and "already defined" in problem:
            return f"invalid JSON at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    except yaml.YAMLError:
        pass
    return f"invalid JSON: mapping key {json.dumps(key)} already defined"


def parse_objects(
    text: str, origin: str = "<text>", *, json_errors: bool = False
) -> list[dict[str, Any]]:
    """Objects from YAML (possibly multi-document) or JSON text; `origin` names it in errors.

    Text is JSON when it looks like JSON (starts with `{` or `[`), whatever its file is
    called, as kubectl decides; otherwise YAML (a `.json` file holding YAML too). JSON that
    does not parse is read as YAML, unless `json_errors` (a `.json` file): then its JSON
    error is the answer. A key written twice in a JSON object is refused.
    """
    if text.lstrip()[:1] in ("{", "["):
        try:
            data = json.loads(text, object_pairs_hook=_json_object)
        except _RepeatedKey as exc:
            raise LoadError(origin, _repeated_json_key(text, exc.key), 0) from None
        except json.JSONDecodeError as exc:
            if json_errors:
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
