"""Imports go one way: volfsm -> projections -> events, and the lower layers stay free of
the service's heavy dependencies. The engine knows no volume type: it imports only the plugin
interface (`volfsm.plugins.base`, `volfsm.plugins.catalog`), never a concrete plugin."""

from __future__ import annotations

import ast
import shutil
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


PLUGIN_INTERFACE = frozenset({"volfsm.plugins.base", "volfsm.plugins.catalog"})
"""What of volfsm.plugins the engine may import."""


def imported_modules(path: Path, package: str) -> set[str]:
    """Every module `path` imports, relative imports resolved against `package` (the
    dotted package holding the file); `from a import b` counts as `a` and `a.b` (b may
    be a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = parts[: len(parts) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def concrete_plugins(names: set[str]) -> set[str]:
    """The volfsm.plugins modules among `names` that are not the plugin interface, by their
    top module ("volfsm.plugins.csi.client" -> "volfsm.plugins.csi")."""
    found = set()
    for name in names:
        top = ".".join(name.split(".")[:3])
        if name.startswith("volfsm.plugins.") and top not in PLUGIN_INTERFACE:
            found.add(top)
    return found


def concrete_plugin_imports(
    engine_dir: Path, package: str = "volfsm.engine"
) -> dict[str, set[str]]:
    """Per module under `engine_dir` (a copy of volfsm/engine), the concrete plugins it imports."""
    offenders: dict[str, set[str]] = {}
    for path in sorted(engine_dir.rglob("*.py")):
        rel = path.relative_to(engine_dir).with_suffix("")
        found = concrete_plugins(imported_modules(path, ".".join([package, *rel.parts[:-1]])))
        if found:
            offenders[rel.as_posix()] = found
    return offenders


def test_engine_imports_no_concrete_plugin() -> None:
    assert concrete_plugin_imports(ROOT / "volfsm" / "engine") == {}


@pytest.mark.parametrize(
    ("planted", "plugin"),
    [
        ("from volfsm.plugins.emptydir import MEDIUM_MEMORY\n", "volfsm.plugins.emptydir"),
        ("from volfsm.plugins.csi.client import valid_driver_name\n", "volfsm.plugins.csi"),
        ("import volfsm.plugins.csi.files\n", "volfsm.plugins.csi"),
        ("from volfsm.plugins import csi\n", "volfsm.plugins.csi"),
        ("from ...plugins.scripted import ScriptedPlugin\n", "volfsm.plugins.scripted"),
        (
            "def late() -> None:\n    from volfsm.plugins.csi import construct\n",
            "volfsm.plugins.csi",
        ),
    ],
)
def test_engine_plugin_check_catches_a_planted_import(
    tmp_path: Path, planted: str, plugin: str
) -> None:
    # Arrange: a copy of the engine with one concrete plugin import planted deep inside
    engine = tmp_path / "engine"
    shutil.copytree(
        ROOT / "volfsm" / "engine", engine, ignore=shutil.ignore_patterns("__pycache__")
    )
    target = engine / "reconstruct" / "specs.py"
    target.write_text(target.read_text() + "\n" + planted)

    # Act
    offenders = concrete_plugin_imports(engine)

    # Assert: exactly the planted import is named
    assert offenders == {"reconstruct/specs": {plugin}}


def test_engine_plugin_check_allows_the_plugin_interface(tmp_path: Path) -> None:
    module = tmp_path / "ok.py"
    module.write_text(
        "from volfsm.plugins import base, catalog\n"
        "from volfsm.plugins.base import VolumePlugin\n"
        "import volfsm.plugins.catalog\n"
    )
    assert concrete_plugins(imported_modules(module, "volfsm.engine")) == set()
