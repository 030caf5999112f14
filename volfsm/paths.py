"""Where volfsm keeps its files: the data dir and the event log inside it."""

from __future__ import annotations

import os
from pathlib import Path

LOG_FILENAME = "volfsm.db"
"""The event log's file name inside the data dir."""

DEFAULT_DATA_DIR = Path("/var/lib/volfsm")
"""The data dir when neither an option nor `VOLFSM_DATA_DIR` names one."""

DATA_DIR_ENV = "VOLFSM_DATA_DIR"
"""Environment variable naming the data dir."""


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The data dir: `explicit`, else `$VOLFSM_DATA_DIR`, else `/var/lib/volfsm`."""
    if explicit is not None:
        return Path(explicit)
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env) if env else DEFAULT_DATA_DIR


def log_path(
    data_dir_opt: str | os.PathLike[str] | None = None,
    db: str | os.PathLike[str] | None = None,
) -> Path:
    """The event log file: `db` when given, else `<data dir>/volfsm.db`."""
    if db is not None:
        return Path(db)
    return data_dir(data_dir_opt) / LOG_FILENAME
