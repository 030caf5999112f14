"""Content hashes of stored objects: what the log records instead of the content.

The hash covers the object's canonical JSON (sorted keys, no spaces)
without the metadata an API server or the store fills in (uid,
resourceVersion, timestamps, managedFields), so the same content applied
twice hashes the same. A Secret's hash is an HMAC keyed by a random node
secret kept in the object store, never in the log: a copied log tells
which version of a Secret a pod had, but lets nobody test guesses of a
value against it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

VOLATILE_METADATA = frozenset(
    {"uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink"}
)
SECRET_KINDS = frozenset({"Secret"})


def canonical_json(raw: Mapping[str, Any]) -> bytes:
    """The object's content as canonical JSON bytes (volatile metadata left out)."""
    content = dict(raw)
    meta = content.get("metadata")
    if isinstance(meta, Mapping):
        content["metadata"] = {k: v for k, v in meta.items() if k not in VOLATILE_METADATA}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode()


def content_hash(kind: str, raw: Mapping[str, Any], secret_key: bytes) -> str:
    """ "sha256:<hex>", or for a Secret "hmac-sha256:<hex>" keyed by `secret_key`."""
    data = canonical_json(raw)
    if kind in SECRET_KINDS:
        return "hmac-sha256:" + hmac.new(secret_key, data, hashlib.sha256).hexdigest()
    return "sha256:" + hashlib.sha256(data).hexdigest()
