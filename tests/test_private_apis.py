"""Every private attribute of another package that taccl_py uses still exists there (issue 28).

A private name can vanish in any release without a deprecation. Each one the package uses is
listed in ``PRIVATE_USES`` with the object that must have it, and checked against what is
installed; ``test_every_private_use_is_listed`` reads the package's source, so a new private use
fails here until it is listed. CI runs this with torch 2.13 (CPU) on Python 3.11-3.13, highspy as
pip resolves it, and pulp 3.3 and 4; the GPU runs used torch 2.11 (cu130).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.smoke

PACKAGE = Path(__file__).resolve().parents[1] / "taccl_py"
# The torch releases these checks have run against (README, "Set-up").
TESTED_TORCH = ("2.11", "2.13")

# name -> (module, dotted path of the object that has it, where taccl_py uses it)
PRIVATE_USES = {
    "_Highs": ("highspy._core", "", "solvers/highs.py consume_highs_banner: a bare instance for the banner"),
    "_core": ("highspy", "", "solvers/highs.py: the module holding _Highs"),
    "_base": (
        "torch",
        "Tensor",
        "runtime/executor/binding_cache.py owner_of: a view's base decides its binding's life",
    ),
    "_get_backend": ("torch.distributed", "ProcessGroup", "runtime/ddp.py: the gloo backend of a group"),
    "_register_backend": ("torch.distributed", "ProcessGroup", "runtime/backend/group.py: inner backends"),
    "_set_default_backend": ("torch.distributed", "ProcessGroup", "runtime/backend/group.py"),
    "_start_coalescing": ("torch._C._distributed_c10d", "Backend", "runtime/backend/work.py: NCCL rounds"),
    "_end_coalescing": ("torch._C._distributed_c10d", "Backend", "runtime/backend/work.py: NCCL rounds"),
    "_get_default_store": ("torch.distributed.distributed_c10d", "", "runtime/transports/cupy_nccl.py (getattr)"),
    "_SubParsersAction": ("argparse", "", "cli/*.py: the type of add_subparsers()'s result"),
    "_exit": ("os", "", "synth/jobs.py: a worker leaves without running atexit hooks"),
}
# Private names that taccl_py reads from an object it creates itself, checked where the object exists.
NCCL_OPTIONS_TIMEOUT = "_timeout"  # runtime/backend/work.py make_backend: ProcessGroupNCCL.Options
POOL_PROCESSES = "_processes"  # synth/jobs.py _stop_workers: a ProcessPoolExecutor's worker processes, by pid


def _resolve(module: str, path: str) -> object:
    target = importlib.import_module(module)
    for part in filter(None, path.split(".")):
        target = getattr(target, part)
    return target


def _package_names() -> set[str]:
    """Return every name taccl_py defines: modules, functions, classes, arguments, assigned names and attributes."""
    names = {path.stem for path in PACKAGE.rglob("*.py")}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return names


def _private_names_used() -> set[str]:
    """Return the single-underscore names taccl_py reads as attributes, imports, or passes to getattr."""
    used: set[str] = set()
    private = re.compile(r"_[A-Za-z]\w*")
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
                candidates = [node.attr]
            elif isinstance(node, ast.ImportFrom) and node.module:
                candidates = node.module.split(".") + [alias.name for alias in node.names]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
            ):
                candidates = [
                    a.value for a in node.args[1:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)
                ]
            else:
                continue
            used.update(name for name in candidates if private.fullmatch(name))
    return used


def test_every_private_use_is_listed():
    foreign = _private_names_used() - _package_names()
    listed = {*PRIVATE_USES, NCCL_OPTIONS_TIMEOUT, POOL_PROCESSES}
    assert foreign <= listed, f"list these private names in PRIVATE_USES: {sorted(foreign - listed)}"


@pytest.mark.parametrize("name", sorted(PRIVATE_USES))
def test_private_attribute_exists(name):
    module, path, where = PRIVATE_USES[name]
    pytest.importorskip(module.split(".")[0], reason=f"{module.split('.')[0]} is not installed")
    owner = _resolve(module, path)
    assert hasattr(owner, name), f"{module}{'.' + path if path else ''} has no {name} (used in {where})"


def test_the_torch_under_test_is_one_we_name():
    torch = pytest.importorskip("torch", reason="torch is not installed (the runtime extra)")
    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    low, high = (tuple(int(p) for p in v.split(".")) for v in TESTED_TORCH)
    assert low <= tuple(int(p) for p in release.split(".")) <= high, (
        f"torch {torch.__version__} is outside the tested {TESTED_TORCH[0]}-{TESTED_TORCH[1]}: "
        "run this file against it and widen TESTED_TORCH (and the README)"
    )


def test_nccl_options_take_a_timeout():
    dist = pytest.importorskip("torch.distributed", reason="torch is not installed (the runtime extra)")
    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL (a CPU build): ProcessGroupNCCL.Options cannot be made")
    assert hasattr(dist.ProcessGroupNCCL.Options(), NCCL_OPTIONS_TIMEOUT)


def test_a_process_pool_keeps_its_workers_by_pid():
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        assert pool.submit(abs, -1).result() == 1
        processes = getattr(pool, POOL_PROCESSES)
        assert [process.pid for process in processes.values()] == list(processes)


def test_pulp_3_still_bundles_cbc_where_we_look():
    import pulp

    if int(pulp.__version__.split(".")[0]) >= 4:
        pytest.skip(f"pulp {pulp.__version__} bundles no CBC (cbcbox or PATH instead)")
    assert hasattr(pulp.PULP_CBC_CMD, "pulp_cbc_path"), "solvers/cbc.py finds pulp 3's CBC there"
