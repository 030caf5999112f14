"""Errors raised while reading and validating desired-state objects."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from volfsm.errors import InvalidObjectError, VolfsmError

__all__ = ["InvalidObjectError", "InvalidObjectsError", "LoadError", "Problems"]


class LoadError(VolfsmError):
    """A file, directory or stdin could not be read or parsed into objects."""

    def __init__(self, origin: str, message: str, document: int | None = None) -> None:
        self.origin = origin
        self.document = document
        self.message = message
        where = origin if document is None else f"{origin}: document {document}"
        super().__init__(f"{where}: {message}")


class InvalidObjectsError(InvalidObjectError):
    """Several objects or fields were rejected at once; nothing was recorded.

    `problems` holds each one; `str(err)` has one line per problem. Its own
    `field`/`message` are the first problem's, so code that reads one
    error still reads something true.
    """

    def __init__(self, problems: Sequence[InvalidObjectError]) -> None:
        flat = [p for problem in problems for p in flatten_problems(problem)]
        first = flat[0]
        super().__init__(first.path, first.message, first.obj)
        self.problems = tuple(flat)
        self.args = ("\n".join(str(p) for p in self.problems),)

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)

    def within(self, obj: str) -> InvalidObjectError:
        """Every problem attributed to `obj` (unless it already names an object)."""
        return InvalidObjectsError([p.within(obj) for p in self.problems])


def flatten_problems(err: InvalidObjectError) -> tuple[InvalidObjectError, ...]:
    """The single problems an error holds (itself, or each of an InvalidObjectsError's)."""
    return err.problems if isinstance(err, InvalidObjectsError) else (err,)


def raise_all(problems: Sequence[InvalidObjectError]) -> None:
    """Raise nothing for no problem, the problem itself for one, all of them for several."""
    flat = [p for problem in problems for p in flatten_problems(problem)]
    if len(flat) == 1:
        raise flat[0]
    if flat:
        raise InvalidObjectsError(flat)


class Problems:
    """Collects the problems of checks that each raise `InvalidObjectError`.

    `with problems.check(prefix):` runs one check and records its error (its
    path under `prefix`) instead of stopping there; `raise_if_any` then
    raises them all at once, attributed to `obj`.
    """

    def __init__(self, obj: str = "") -> None:
        self.obj = obj
        self.items: list[InvalidObjectError] = []

    @contextmanager
    def check(self, prefix: str = "") -> Iterator[None]:
        """Run the block; an InvalidObjectError it raises is recorded (path under `prefix`)."""
        try:
            yield
        except InvalidObjectError as exc:
            for problem in flatten_problems(exc):
                self.add(problem, prefix)

    def add(self, problem: InvalidObjectError, prefix: str = "") -> None:
        """Record one problem (its path under `prefix` unless it names an object already)."""
        if prefix and not problem.obj:
            path = f"{prefix}.{problem.path}" if problem.path else prefix
            problem = InvalidObjectError(path, problem.message)
        self.items.append(problem.within(self.obj) if self.obj else problem)

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        """Raise what was recorded (nothing if nothing was)."""
        raise_all(self.items)
