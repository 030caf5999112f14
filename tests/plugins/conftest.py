"""Plugin tests share the node fixtures (janitor, layout, outside) of tests/paths."""

from __future__ import annotations

from tests.paths.conftest import janitor, layout, outside

__all__ = ["janitor", "layout", "outside"]
