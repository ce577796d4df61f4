"""The package's house rules: floors that import only downward, no circle, small folders and modules.

The structure check reads every module's imports (lazy ones too) as arrows and asserts that:

* no module import forms a circle, and no circle runs between folders;
* every arrow between top-level packages points to a lower floor of ``FLOORS`` (the order of
  ``docs/design.md`` section 2), except the deprecated aliases named in ``DEPRECATED_ARROWS``;
* no folder of the package holds more than ``MAX_MODULES_PER_FOLDER`` modules directly, and no
  module of the package, its tests or its scripts is over ``MAX_MODULE_LINES`` lines;
* the package root holds only its face and the cross-cutting helpers, and moved modules left no
  shim behind (``DEPRECATED_PATHS`` are the two old paths users had, kept with a warning).
"""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import networkx as nx
import pytest

import taccl_py

PACKAGE_DIR = Path(taccl_py.__file__).parent
REPO_DIR = PACKAGE_DIR.parent
# The package's face, the CLI entry, and the cross-cutting helpers; everything else lives in a stage package.
ROOT_MODULES = {"__init__", "__main__", "_io", "_xml", "errors", "files", "gc_tuning", "progress", "units"}
# Bottom to top: a module may import its own top-level package and the floors below its own.
FLOORS = (
    ("taccl_py", "taccl_py.errors", "taccl_py.progress", "taccl_py.gc_tuning"),
    ("taccl_py.units", "taccl_py._xml"),
    ("taccl_py._io",),
    ("taccl_py.topology",),
    ("taccl_py.ir",),
    ("taccl_py.bounds", "taccl_py.verify", "taccl_py.solvers", "taccl_py.placement"),
    ("taccl_py.simulate",),
    ("taccl_py.msccl", "taccl_py.mscclpp"),
    ("taccl_py.files", "taccl_py.deploy"),
    ("taccl_py.stages",),
    ("taccl_py.baselines",),
    ("taccl_py.synth",),
    ("taccl_py.build",),
    ("taccl_py.runtime",),
    ("taccl_py.cli",),
    ("taccl_py.__main__",),
)
# Old import paths the README or users had, kept with a DeprecationWarning until 0.3.
DEPRECATED_ARROWS = {("taccl_py.topology", "taccl_py.bounds"): "taccl_py.topology.lower_bound, LowerBound"}
DEPRECATED_PATHS = {
    "taccl_py.topology.lower_bound": "taccl_py.bounds.lower_bound",
    "taccl_py.synth.sketch.parse_sketch": "taccl_py.stages.sketch.parse_sketch",
}
MAX_MODULES_PER_FOLDER = 15
MAX_MODULE_LINES = 500
REMOVED_MODULES = (
    "taccl_py.algorithm",
    "taccl_py.algorithm_io",
    "taccl_py.algorithm_library",
    "taccl_py.collectives",
    "taccl_py.dataflow",
    "taccl_py.ddp",
    "taccl_py.happens_before",
    "taccl_py.lowering",
    "taccl_py.mscclpp.export_packets",
    "taccl_py.mscclpp.export_packing",
    "taccl_py.placement_chains",
    "taccl_py.runtime.backend_collectives",
    "taccl_py.runtime.backend_group",
    "taccl_py.runtime.backend_transport",
    "taccl_py.runtime.bench",
    "taccl_py.runtime.binding",
    "taccl_py.runtime.binding_cache",
    "taccl_py.runtime.calibration",
    "taccl_py.runtime.calibration_cache",
    "taccl_py.runtime.communicator_checks",
    "taccl_py.runtime.communicator_choice",
    "taccl_py.runtime.graphs",
    "taccl_py.runtime.group_log",
    "taccl_py.runtime.inplace_calls",
    "taccl_py.runtime.issue_order",
    "taccl_py.runtime.live_cluster",
    "taccl_py.runtime.native",
    "taccl_py.runtime.ordered_worker",
    "taccl_py.runtime.plan",
    "taccl_py.runtime.profile",
    "taccl_py.runtime.profile_model",
    "taccl_py.runtime.rank_plan",
    "taccl_py.runtime.selection",
    "taccl_py.runtime.timing",
    "taccl_py.runtime.transport",
    "taccl_py.runtime.watchdog",
    "taccl_py.sketch",
    "taccl_py.sketch_taccl",
    "taccl_py.synth.alltoall_plan",
    "taccl_py.synth.alltoall_routing",
    "taccl_py.synth.hierarchy",
    "taccl_py.synth.logical",
    "taccl_py.synth.lower_schedule",
    "taccl_py.synth.milp_matrix",
    "taccl_py.synth.ordering",
    "taccl_py.synth.plan",
    "taccl_py.synth.progress",
    "taccl_py.synth.routing",
    "taccl_py.synth.scheduling",
    "taccl_py.synth.sketch_auto",
    "taccl_py.synth.sketch_fields",
    "taccl_py.synth.sketch_model",
    "taccl_py.synth.sketch_taccl",
    "taccl_py.synth.solver",
    "taccl_py.synth.solver_cbc",
    "taccl_py.synth.solver_cpsat",
    "taccl_py.synth.solver_highs",
    "taccl_py.synth.tree_packing",
    "taccl_py.topology.alltoall_bound",
    "taccl_py.topology.bounds",
    "taccl_py.topology.bounds_cut",
    "taccl_py.topology.bounds_reduction",
    "taccl_py.topology.library",
    "taccl_py.topology.probe_build",
    "taccl_py.topology.probe_sources",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_DIR).with_suffix("").parts
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
    """Return the modules of the package as nodes and each import as an arrow from importer to imported."""
    files = {_module_name(path): path for path in PACKAGE_DIR.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for name, path in files.items():
        for target in _imported_modules(path, set(files)):
            # A package's __init__ importing its own modules is its face, not a circle back up.
            if target != name and not target.startswith(name + "."):
                graph.add_edge(name, target)
    return graph


def _folder(module: str) -> str:
    """Return the package folder ``module`` sits in (a package's face sits in its own folder)."""
    is_package = (REPO_DIR / module.replace(".", "/") / "__init__.py").exists()
    return module if is_package else module.rpartition(".")[0]


def _top_level(module: str) -> str:
    """Return the top-level package (or root module) ``module`` belongs to: ``taccl_py.synth``, ``taccl_py.files``."""
    return ".".join(module.split(".")[:2])


def _floor(module: str) -> int:
    top = _top_level(module)
    for index, members in enumerate(FLOORS):
        if top in members:
            return index
    raise AssertionError(f"{module}: no floor in FLOORS for {top}")


def test_the_package_has_no_import_circle():
    assert list(nx.simple_cycles(_import_graph())) == []


def test_no_circle_runs_between_folders():
    # A folder's face importing a subfolder, and the subfolder importing its parent's modules, is one room.
    folders = nx.DiGraph()
    for source, target in _import_graph().edges:
        a, b = _folder(source), _folder(target)
        deprecated = (_top_level(source), _top_level(target)) in DEPRECATED_ARROWS
        if a != b and not a.startswith(b + ".") and not b.startswith(a + ".") and not deprecated:
            folders.add_edge(a, b)
    assert list(nx.simple_cycles(folders)) == []


def test_every_arrow_between_packages_points_down_a_floor():
    upward = []
    for source, target in _import_graph().edges:
        if _top_level(source) == _top_level(target):
            continue
        if _floor(target) >= _floor(source) and (_top_level(source), _top_level(target)) not in DEPRECATED_ARROWS:
            upward.append(f"{source} -> {target}")
    assert not upward, "\n".join(upward)


def test_the_baselines_stand_without_the_synthesizer():
    graph = _import_graph()
    arrows = [
        (s, t) for s, t in graph.edges if _top_level(s) == "taccl_py.baselines" and _top_level(t) == "taccl_py.synth"
    ]
    assert arrows == []


def test_no_folder_holds_more_than_fifteen_modules():
    crowded = {
        str(folder.relative_to(REPO_DIR)): count
        for folder in [PACKAGE_DIR, *(p for p in PACKAGE_DIR.rglob("*") if p.is_dir())]
        if (count := len(list(folder.glob("*.py")))) > MAX_MODULES_PER_FOLDER
    }
    assert crowded == {}


def test_no_module_is_over_five_hundred_lines():
    paths = [*PACKAGE_DIR.rglob("*.py"), *(REPO_DIR / "tests").glob("*.py"), *(REPO_DIR / "scripts").glob("*.py")]
    long = {
        str(path.relative_to(REPO_DIR)): lines
        for path in paths
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_the_package_root_holds_only_its_face_and_cross_cutting_helpers():
    root_modules = {path.stem for path in PACKAGE_DIR.glob("*.py")}
    assert root_modules == ROOT_MODULES


@pytest.mark.parametrize("name", REMOVED_MODULES)
def test_a_moved_module_leaves_no_shim_behind(name):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)


@pytest.mark.parametrize(("old", "new"), sorted(DEPRECATED_PATHS.items()))
def test_an_old_path_users_had_still_resolves_with_a_warning(old, new):
    old_module, _, name = old.rpartition(".")
    new_module, _, new_name = new.rpartition(".")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(importlib.import_module(old_module), name)
    assert value is getattr(importlib.import_module(new_module), new_name)
    assert any(issubclass(w.category, DeprecationWarning) and new_module in str(w.message) for w in caught)
