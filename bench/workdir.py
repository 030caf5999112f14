"""Scratch directories for the benchmarks: outside the checkout, removed by the caller.

Benchmarks write logs, stores and root dirs of hundreds of MB. They go under
``$VOLFSM_BENCH_TMPDIR`` if set, else the system temp dir (``$TMPDIR``,
``/tmp``), never inside the repository, so an interrupted run leaves nothing
that `git status` shows.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


def scratch_dir(prefix: str) -> Path:
    """A new empty directory for one run, outside the checkout."""
    base = Path(os.environ.get("VOLFSM_BENCH_TMPDIR") or tempfile.gettempdir()).resolve()
    if base == CHECKOUT or CHECKOUT in base.parents:
        raise SystemExit(f"VOLFSM_BENCH_TMPDIR={base} is inside the checkout {CHECKOUT}")
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """`scratch_dir` for a `with` block: removed at its end, whatever happens."""
    path = scratch_dir(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
