"""Name rules: path-safe components (pod UIDs, volume names) and Kubernetes DNS names."""

from __future__ import annotations

import re

MAX_COMPONENT = 253
_COMPONENT = re.compile(r"[A-Za-z0-9._-]+")
_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(
    r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
)
_CSI_DRIVER = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


def path_component_problem(value: str) -> str | None:
    """Why `value` cannot be one component of a path under the root dir, or None."""
    if not value:
        return "must not be empty"
    if value in (".", ".."):
        return f"{value!r} is not allowed"
    if len(value) > MAX_COMPONENT:
        return f"must be at most {MAX_COMPONENT} characters"
    if _COMPONENT.fullmatch(value) is None:
        return f"{value!r} may contain only letters, digits, '.', '_' and '-'"
    return None


def dns_label_problem(value: str) -> str | None:
    """Why `value` is not a DNS-1123 label (namespaces), or None."""
    if not value:
        return "must not be empty"
    if len(value) > 63:
        return "must be a DNS-1123 label of at most 63 characters"
    if _DNS_LABEL.fullmatch(value) is None:
        return (
            f"{value!r} must be a DNS-1123 label: lower-case letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return None


def dns_subdomain_problem(value: str) -> str | None:
    """Why `value` is not a DNS-1123 subdomain (object names), or None."""
    if not value:
        return "must not be empty"
    if len(value) > 253:
        return "must be a DNS-1123 subdomain of at most 253 characters"
    if _DNS_SUBDOMAIN.fullmatch(value) is None:
        return (
            f"{value!r} must be a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit"
        )
    return None


def csi_driver_problem(value: str) -> str | None:
    """Why `value` is not a CSI driver name (it becomes a directory name), or None."""
    if not value:
        return "must not be empty"
    if _CSI_DRIVER.fullmatch(value) is None:
        return (
            f"{value!r} must be at most 63 characters of letters, digits, '.', '_' and '-', "
            "starting and ending with a letter or digit"
        )
    return None


def volume_handle_problem(value: str) -> str | None:
    """Why `value` is not a usable CSI volume handle, or None."""
    if not value:
        return "must not be empty"
    if len(value) > 1024:
        return "must be at most 1024 characters"
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        return "must not contain control characters"
    return None
