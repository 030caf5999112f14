"""What a running service leaves in its data dir for the CLI, and the settings error type.

Kept apart from `volfsm.service.config` (the whole option set, TOML and
TLS), so that a client command finds the service without loading them.
"""

from __future__ import annotations

from pathlib import Path

from volfsm.errors import VolfsmError

NODE_FILENAME = "node"
"""File in the data dir holding the node name the service runs as (read by the CLI)."""
NATS_URL_FILENAME = "nats.url"
"""File in the data dir holding the NATS URL the service uses (read by the CLI)."""


class ConfigError(VolfsmError):
    """A setting is missing, malformed or inconsistent; the message names the option."""


def saved_node(data_dir: Path) -> str:
    """The node name a service last ran as with this data dir ('' if none)."""
    try:
        return (data_dir / NODE_FILENAME).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def saved_nats_url(data_dir: Path) -> str:
    """The NATS URL a service with this data dir uses ('' if none)."""
    try:
        return (data_dir / NATS_URL_FILENAME).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""
