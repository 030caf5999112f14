"""Imports go one way: volfsm -> projections -> events, and the lower layers stay free of
the service's heavy dependencies."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "events": {"projections", "volfsm", "nats", "grpc", "transitions"},
    "projections": {"volfsm", "nats", "grpc", "transitions"},
}


def imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_upwards(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_top_levels(path) & FORBIDDEN[package])
        for path in (ROOT / package).rglob("*.py")
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert offenders == {}


def test_layer_check_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import transitions\nfrom volfsm.fsm import DEVICE\n")
    assert imported_top_levels(bad) == {"transitions", "volfsm"}
