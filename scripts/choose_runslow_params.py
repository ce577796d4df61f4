"""Choose the parameters of the suite's sweeps that the default run can leave to ``--runslow`` with no coverage lost.

A sweep runs one test over many parameters; most parameters take the same lines and branches of
``taccl_py`` as another. From a default run measured with per-test coverage contexts, this script
walks the sweeps' parameters from the slowest and moves one to ``--runslow`` when every branch arc
it covers is still covered by some test left in the default run. Each sweep keeps at least one
parameter. Multi-process tests (their ranks are not measured), smoke tests (``scripts/smoke.sh`` runs
them on other Pythons and pulps) and the sweeps in ``KEPT_WHOLE`` stay whole. The choice is written
to ``tests/runslow_params.py``, which ``tests/conftest.py`` reads.

    pip install pytest-cov
    python -m pytest -q --cov=taccl_py --cov-branch --cov-context=test --cov-report= --junitxml=run.xml
    python scripts/choose_runslow_params.py .coverage run.xml
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter, defaultdict
from contextlib import closing
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "tests" / "runslow_params.py"

#: Sweeps whose point is the spread of their parameters, which line coverage cannot see.
KEPT_WHOLE = {
    "tests/test_alltoall_bound.py::test_topo_show_prints_the_same_bytes_under_every_hash_seed": "compares seeds",
    "tests/test_solver_budgets.py::test_same_bytes_on_a_busy_machine": "compares loads",
    "tests/test_jobs.py::test_a_signalled_synthesis_exits_quietly_and_leaves_no_process": "a subprocess",
    "tests/test_executor.py::test_every_dtype_and_op": "torch's arithmetic per dtype, not ours",
}

#: Parameters faster than this (s of the measured run) are left in the default run: moving them saves nothing.
MIN_SECONDS = 0.3

LINE_LENGTH = 120  # pyproject.toml's [tool.ruff]


def arcs_per_test(coverage_file: Path) -> dict[str, set[tuple[int, int, int]]]:
    """Return the branch arcs (file id, from line, to line) each test's setup, call and teardown covered.

    Reads the coverage data file's SQLite tables; it must hold branch data with test contexts.
    """
    arcs: dict[str, set[tuple[int, int, int]]] = defaultdict(set)
    with closing(sqlite3.connect(coverage_file)) as db:
        names = {cid: context.rsplit("|", 1)[0] for cid, context in db.execute("select id, context from context")}
        for cid, fid, start, end in db.execute("select context_id, file_id, fromno, tono from arc"):
            arcs[names[cid]].add((fid, start, end))
    if not arcs:
        raise SystemExit(
            f"{coverage_file}: no branch arcs with test contexts (run with --cov-branch --cov-context=test)"
        )
    return arcs


def seconds_per_test(junit_xml: Path) -> dict[str, float]:
    """Return each test's time (s) from a pytest JUnit report, by node id."""
    seconds = {}
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        seconds[f"{path}::{case.get('name')}"] = float(case.get("time", 0.0))
    return seconds


def tests_kept_whole() -> set[str]:
    """Return the node ids of the tests marked ``multiprocess`` or ``smoke``.

    Coverage does not see multi-process tests' ranks; the smoke run checks other Pythons and pulps.
    """
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-m", "multiprocess or smoke"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return {line for line in done.stdout.splitlines() if "::" in line}


def choose_runslow(arcs: dict[str, set[tuple[int, int, int]]], seconds: dict[str, float], kept: set[str]) -> list[str]:
    """Return the parameters to leave to ``--runslow``, slowest first; the rest still cover every arc of ``arcs``.

    Only tests that ran (have arcs) count; ``kept`` names tests and whole sweeps that stay.
    """
    sweeps: dict[str, list[str]] = defaultdict(list)
    for test in arcs:
        if "[" in test:
            sweeps[test.split("[")[0]].append(test)
    covering = Counter(arc for test_arcs in arcs.values() for arc in test_arcs)
    left = {sweep: len(tests) for sweep, tests in sweeps.items()}
    candidates = [
        test
        for sweep, tests in sweeps.items()
        if len(tests) > 1 and sweep not in kept
        for test in tests
        if test not in kept and seconds.get(test, 0.0) >= MIN_SECONDS
    ]
    moved = []
    for test in sorted(candidates, key=lambda test: (-seconds[test], test)):
        sweep = test.split("[")[0]
        if left[sweep] > 1 and all(covering[arc] > 1 for arc in arcs[test]):
            covering.subtract(arcs[test])
            left[sweep] -= 1
            moved.append(test)
    return moved


def render(moved: list[str], seconds: dict[str, float]) -> str:
    """Return the text of ``tests/runslow_params.py`` for ``moved``."""
    by_sweep: dict[str, list[str]] = defaultdict(list)
    for test in sorted(moved):
        sweep, _, rest = test.partition("[")
        by_sweep[sweep].append(rest[:-1])
    lines = [
        '"""Sweep parameters the default run leaves to ``--runslow``: none covers a branch of taccl_py the rest miss.',
        "",
        f"Written by ``scripts/choose_runslow_params.py`` on {date.today().isoformat()}: {len(moved)} parameters,",
        f"{sum(seconds[test] for test in moved):.0f} s of the measured (coverage-traced) run. ``tests/conftest.py``",
        "marks them slow; it stops the run where a name here no longer matches a parameter.",
        '"""',
        "",
        "RUNSLOW_PARAMS: dict[str, tuple[str, ...]] = {",
    ]
    for sweep, ids in by_sweep.items():
        one_line = f"    {json.dumps(sweep)}: ({json.dumps(ids[0])},),"
        if len(ids) == 1 and len(one_line) <= LINE_LENGTH:  # as ruff format writes it
            lines.append(one_line)
            continue
        lines.append(f"    {json.dumps(sweep)}: (")
        lines.extend(f"        {json.dumps(param)}," for param in ids)
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("coverage_file", type=Path, help="coverage data of a default run with test contexts")
    parser.add_argument("junit_xml", type=Path, help="the same run's --junitxml report (test times)")
    parser.add_argument("-o", "--output", type=Path, default=OUTPUT, help=f"default: {OUTPUT.relative_to(ROOT)}")
    args = parser.parse_args()
    arcs = arcs_per_test(args.coverage_file)
    seconds = seconds_per_test(args.junit_xml)
    moved = choose_runslow(arcs, seconds, set(KEPT_WHOLE) | tests_kept_whole())
    args.output.write_text(render(moved, seconds), encoding="utf-8")
    print(f"{args.output}: {len(moved)} parameters, {sum(seconds[test] for test in moved):.0f} s of the measured run")


if __name__ == "__main__":
    main()
