"""The package's house rules: no import cycle, a lean package root, removed paths gone."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import networkx as nx
import pytest

import taccl_py

PACKAGE_DIR = Path(taccl_py.__file__).parent
# The package's face, the CLI entry, and the cross-cutting helpers; everything else lives in a stage package.
ROOT_MODULES = {"__init__", "__main__", "_io", "_xml", "errors", "files", "units"}
REMOVED_MODULES = (
    "taccl_py.algorithm",
    "taccl_py.algorithm_io",
    "taccl_py.algorithm_library",
    "taccl_py.collectives",
    "taccl_py.dataflow",
    "taccl_py.ddp",
    "taccl_py.happens_before",
    "taccl_py.lowering",
    "taccl_py.placement_chains",
    "taccl_py.runtime.plan",
    "taccl_py.sketch",
    "taccl_py.sketch_taccl",
    "taccl_py.synth.plan",
    "taccl_py.topology.library",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    """Return the package modules ``path`` imports, at any depth of the file (lazy imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in known)
    return found


def _import_graph() -> nx.DiGraph:
    files = {_module_name(path): path for path in PACKAGE_DIR.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for name, path in files.items():
        for target in _imported_modules(path, set(files)):
            # A package's __init__ importing its own modules is its face, not a cycle back up.
            if target != name and not target.startswith(name + "."):
                graph.add_edge(name, target)
    return graph


def test_the_package_has_no_import_cycle():
    assert list(nx.simple_cycles(_import_graph())) == []


def test_the_package_root_holds_only_its_face_and_cross_cutting_helpers():
    root_modules = {path.stem for path in PACKAGE_DIR.glob("*.py")}
    assert root_modules == ROOT_MODULES


@pytest.mark.parametrize("name", REMOVED_MODULES)
def test_a_moved_module_leaves_no_shim_behind(name):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)
