"""Turning command-line text into values without pydantic (start-up time).

Typer 0.29 checks every option's value through a pydantic TypeAdapter it
builds on first use: importing pydantic and building the adapters costs a
quarter of a second before any command runs. The values volfsm's commands
take are simple (text, numbers with bounds, flags, paths, a choice of an
enum, lists of these), so `plain_param` gives each such parameter a
`RuntimeParam` that does the same checks in a few lines; any other
annotation keeps Typer's own. `volfsm.cli.lazy.adapt` installs them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

from typer import _click as click  # Typer vendors its own click
from typer._coercion import RuntimeParam
from typer.core import TyperArgument, TyperOption

SIMPLE = (str, int, float, bool, Path)


@dataclass(frozen=True)
class PlainRuntimeParam(RuntimeParam):
    """Checks and converts a value of a simple annotation (see the module doc)."""

    def _coerce_value(self, value: Any, param: Any, ctx: click.Context) -> Any:
        origin: Any = get_origin(self.annotation)
        if origin is list:
            (item,) = get_args(self.annotation)
            values = value if isinstance(value, list | tuple) else [value]
            return [self._one(item, v, param, ctx) for v in values]
        return self._one(self.annotation, value, param, ctx)

    def _one(self, kind: Any, value: Any, param: Any, ctx: click.Context) -> Any:
        try:
            if isinstance(kind, type) and issubclass(kind, enum.Enum):
                return _choice(kind, value, self.parameter_info.case_sensitive)
            if kind is bool:
                return _flag(value)
            if kind is int or kind is float:
                return self._number(kind, value)
            if kind is Path:
                return self._path(value)
            return str(value)
        except ValueError as exc:
            raise click.exceptions.BadParameter(str(exc), ctx=ctx, param=param) from None

    def _number(self, kind: type[int] | type[float], value: Any) -> int | float:
        try:
            number = kind(value)
        except (TypeError, ValueError):
            word = "a whole number" if kind is int else "a number"
            raise ValueError(f"{value!r} is not {word}") from None
        info = self.parameter_info
        if info.min is not None and number < info.min:
            raise ValueError(f"{number} is less than {info.min}")
        if info.max is not None and number > info.max:
            raise ValueError(f"{number} is more than {info.max}")
        return number

    def _path(self, value: Any) -> Path:
        path = Path(value)
        info = self.parameter_info
        if info.exists and not path.exists():
            raise ValueError(f"{path}: no such file or directory")
        if not info.dir_okay and path.is_dir():
            raise ValueError(f"{path} is a directory")
        if not info.file_okay and path.exists() and not path.is_dir():
            raise ValueError(f"{path} is not a directory")
        return path


def _choice(kind: type[enum.Enum], value: Any, case_sensitive: bool) -> enum.Enum:
    if isinstance(value, kind):
        return value
    text = str(value)
    for member in kind:
        if member.value == text or (
            not case_sensitive and str(member.value).lower() == text.lower()
        ):
            return member
    raise ValueError(f"{text!r} is not one of {', '.join(str(m.value) for m in kind)}")


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on", "y", "t"):
        return True
    if text in ("0", "false", "no", "off", "n", "f", ""):
        return False
    raise ValueError(f"{value!r} is not a yes or no")


def _simple(annotation: Any) -> bool:
    if get_origin(annotation) is list:
        args = get_args(annotation)
        return len(args) == 1 and _simple(args[0])
    if annotation in SIMPLE:
        return True
    return isinstance(annotation, type) and issubclass(annotation, enum.Enum)


def plain_param(param: Any) -> None:
    """Give a Typer option or argument of a simple annotation the plain coercion."""
    if not isinstance(param, TyperOption | TyperArgument):
        return
    kind = param.type_descriptor
    info = kind.parameter_info
    if kind.file_annotation is not None or info.parser is not None or not _simple(kind.annotation):
        return
    if param._runtime_param is None:
        param._runtime_param = PlainRuntimeParam(info, kind.annotation)
