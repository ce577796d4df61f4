"""Full garbage collections are rarer in the processes the taccl command owns, and only there."""

from __future__ import annotations

import gc
import subprocess
import sys

from taccl_py.gc_tuning import FULL_COLLECTION_EVERY
from taccl_py.synth.jobs import run_jobs

_DEFAULT = (700, 10, 10)


def _thresholds_after(code: str) -> tuple[int, ...]:
    """Return the collector thresholds a fresh interpreter prints last, after ``code`` (from CPython's default)."""
    script = f"import gc; gc.set_threshold(*{_DEFAULT!r})\n{code}\nprint(tuple(gc.get_threshold()))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return tuple(int(field) for field in out.strip().splitlines()[-1].strip("()").split(","))


def test_importing_the_library_and_calling_it_leave_the_collector_alone() -> None:
    code = (
        "from taccl_py.synth import synthesize\n"
        "from taccl_py.topology.builtins import load_topology\n"
        "synthesize(load_topology('ndv2'), 'allgather', size_bytes=1 << 20)"
    )
    assert _thresholds_after(code) == _DEFAULT


def test_the_taccl_command_makes_full_collections_rarer() -> None:
    code = "from taccl_py.cli import main\nassert main(['topo', 'show', 'ndv2']) == 0"
    assert _thresholds_after(code) == (*_DEFAULT[:2], FULL_COLLECTION_EVERY)


def _thresholds(progress) -> tuple[int, ...]:
    return tuple(gc.get_threshold())


def test_synthesis_workers_collect_rarely() -> None:
    # each worker starts from a fresh interpreter (forkserver or spawn), at CPython's default
    seen = run_jobs([_thresholds, _thresholds], 2, None)
    assert {values[2] for values in seen} == {FULL_COLLECTION_EVERY}
