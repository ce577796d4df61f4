"""Test policy: tests marked ``slow`` run only with ``--runslow`` (the default run: 6 to 8 minutes on 2 idle cores).

So do the sweep parameters named in ``runslow_params.py``: each covers no branch of taccl_py that the
rest of the default run misses (``scripts/choose_runslow_params.py`` chose them from a coverage run).

The suite runs with the Communicator's automatic calibration off (TACCL_CALIBRATION=off), set here
at import, before any rank process starts, so the fork server and every rank inherit it: otherwise
each Communicator's first call would time 64 KB-64 MB collectives. tests/test_calibration.py
turns it back on inside the ranks that test it.
"""

from __future__ import annotations

import multiprocessing
import os

import pytest

from taccl_py.gc_tuning import collect_cycles_rarely

from runslow_params import RUNSLOW_PARAMS

# taccl_py.runtime.communicator.calibration_cache.CALIBRATION_ENV, spelled out: importing it here would import torch
os.environ["TACCL_CALIBRATION"] = "off"


#: What the suite's ranks and job workers import besides the launcher's preload. A rank unpickles
#: its function by module name, so without these it imports the test module's pytest, helpers and
#: synthesis stack itself: measured on the 151 ranks of ``-m multiprocess``, 48 CPU-s between fork
#: and the rank's first line, 21 with them preloaded (the forkserver imports them once, ~0.7 s).
RANK_PRELOAD = ["pytest", "helpers", "mp_utils", "ddp_helpers", "taccl_py.synth", "taccl_py.files", "taccl_py.mscclpp"]


def pytest_configure(config: pytest.Config) -> None:
    """Start this process's forkserver with the rank launcher's preload and the suite's (``RANK_PRELOAD``).

    A process has one forkserver, and its preload is whatever was set when it started: in a worker
    where a synthesis with jobs ran first, every rank launched later imported torch and
    torch._dynamo itself (about 100 of the default run's 1,190 CPU-seconds). The launcher sets its
    own list on every launch, so setting the suite's here was undone by the first launch: the server
    is started here, before either can. The xdist controller runs no test, so it starts none
    (torch's import, about 3 s of CPU).
    """
    collect_cycles_rarely()  # as the taccl command does: the workers synthesize in-process
    if getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput"):
        return
    from multiprocessing import forkserver

    from taccl_py.runtime.launch import FORKSERVER_PRELOAD

    multiprocessing.set_forkserver_preload([*FORKSERVER_PRELOAD, *RANK_PRELOAD])
    forkserver.ensure_running()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Three xdist workers per two cores for ``-n auto``: many tests wait on rank processes, sockets and sleeps.

    One worker per core left the 2 cores idle for a third of the run (about 670 s of CPU over 516 s);
    three kept them 98 % busy, as four did, and each worker spends about 10 s of CPU collecting.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(2, cores * 3 // 2)


def mark_runslow_params(items: list[pytest.Item], *, whole_sweeps: bool = True) -> None:
    """Mark slow the parameters ``RUNSLOW_PARAMS`` names; raise where a name matches no collected parameter.

    A sweep is checked only where it was collected, so a run of a few files or ``-m smoke`` passes;
    ``whole_sweeps`` False (the run names tests by node id) checks none.
    """
    by_id = {item.nodeid: item for item in items}
    collected = {nodeid.split("[")[0] for nodeid in by_id}
    for sweep, params in RUNSLOW_PARAMS.items():
        if sweep not in collected:
            continue
        for param in params:
            item = by_id.get(f"{sweep}[{param}]")
            if item is not None:
                item.add_marker(pytest.mark.slow)
            elif whole_sweeps:
                raise pytest.UsageError(f"tests/runslow_params.py: {sweep}[{param}] is no longer collected")


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect, so every parameter of a collected sweep is there
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_runslow_params(items, whole_sweeps=not any("::" in arg for arg in config.args))
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
