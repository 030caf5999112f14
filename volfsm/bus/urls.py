"""NATS server URLs: the check every command and the service make before connecting."""

from __future__ import annotations

from urllib.parse import urlsplit

URL_SCHEMES = ("nats://", "tls://", "ws://", "wss://")
"""Schemes a NATS server URL may have."""


def split_servers(urls: str) -> list[str]:
    """The server URLs of a comma-separated list (`nats://a:4222,nats://b:4222`).

    Raises ValueError naming the first entry that is empty, has no NATS
    scheme, no host, a port out of range or spaces in it.
    """
    servers = [u.strip() for u in urls.split(",")]
    for url in servers:
        problem = _problem(url)
        if problem:
            shown = f"NATS URL {url!r}" + (f" in {urls!r}" if url != urls.strip() else "")
            raise ValueError(f"{shown} {problem}")
    return servers


def _problem(url: str) -> str:
    if not url.startswith(URL_SCHEMES):
        return f"must start with one of {', '.join(URL_SCHEMES)}"
    if any(ch.isspace() for ch in url):
        return "has a space in it"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "has a port that is not a number from 1 to 65535"
    if not parts.hostname:
        return "names no host"
    if port is not None and not 1 <= port <= 65535:
        return "has a port that is not a number from 1 to 65535"
    return ""
