"""Golden files: exact expected output under tests/data/golden/.

Regenerate them after an intended change with

    VOLFSM_UPDATE_GOLDEN=1 python -m pytest tests/replay

(then review the diff: `git diff tests/data/golden`). Without the variable a
test fails on any difference and shows a unified diff.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "data" / "golden"
UPDATE_ENV = "VOLFSM_UPDATE_GOLDEN"


def check_golden(name: str, actual: str) -> None:
    """`actual` must equal tests/data/golden/<name> exactly (or rewrite it when asked)."""
    path = GOLDEN_DIR / name
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8")
        return
    assert path.exists(), f"{path} is missing; create it with {UPDATE_ENV}=1"
    expected = path.read_text(encoding="utf-8")
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                fromfile=f"golden/{name}",
                tofile="actual",
            )
        )
        raise AssertionError(
            f"output differs from golden/{name} (set {UPDATE_ENV}=1 to accept):\n{diff}"
        )
