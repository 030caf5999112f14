"""Small field rules shared by the object checks: file paths, modes, config keys.

Each returns the problem as text (None when the value is fine), like
`volfsm.desired.names`; `check` in `validate` turns it into an error.
"""

from __future__ import annotations

import re

MAX_MODE = 0o777
MAX_PATH_BYTES = 4096
MAX_ELEMENT_BYTES = 255
MAX_DATA_BYTES = 1 << 20
"""The API server's limit on a ConfigMap's or Secret's data (1 MiB)."""

_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def local_path_problem(path: str) -> str | None:
    """Why `path` is not a file path a volume may write (ValidateLocalNonReservedPath)."""
    if not path:
        return "must not be empty"
    if path.startswith("/"):
        return "must be a relative path"
    elements = path.split("/")
    if ".." in elements:
        return "must not contain '..'"
    if path.startswith(".."):
        return "must not start with '..'"
    if len(path.encode()) > MAX_PATH_BYTES:
        return f"must be at most {MAX_PATH_BYTES} bytes"
    if any(len(element.encode()) > MAX_ELEMENT_BYTES for element in elements):
        return f"each path element must be at most {MAX_ELEMENT_BYTES} bytes"
    return None


def mode_problem(mode: int | None) -> str | None:
    """Why `mode` is not a file mode a volume may set (0 to 0777), or None."""
    if mode is None or 0 <= mode <= MAX_MODE:
        return None
    return f"must be a number between 0 and 0777 (octal), both inclusive; got {mode:#o} ({mode})"


def config_key_problem(key: str) -> str | None:
    """Why `key` is not a ConfigMap/Secret key, or None."""
    if not key:
        return "must not be empty"
    if len(key) > 253:
        return "must be at most 253 characters"
    if key in (".", ".."):
        return f"{key!r} is not allowed"
    if _CONFIG_KEY.fullmatch(key) is None:
        return f"{key!r} may contain only letters, digits, '-', '_' and '.'"
    return None


def no_backsteps_problem(path: str) -> str | None:
    """Why a hostPath is refused: a '..' element (ValidatePathNoBacksteps), or None."""
    if not path:
        return "must not be empty"
    if ".." in path.split("/"):
        return "must not contain '..'"
    return None
