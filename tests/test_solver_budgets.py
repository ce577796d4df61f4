"""Solver budgets are work, not seconds: same input, same bytes, on a busy machine and in workers.

A busy machine is made by a second Python process spinning on a core while the synthesis runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from taccl_py.cli import main
from taccl_py.ir.algorithm_json import generate_algorithm_json, read_algorithm
from taccl_py.ir.library import generate_library, read_library
from taccl_py.solvers import (
    BudgetBound,
    SolverOptions,
    SolveStatus,
    budget_of_status,
    default_node_limit,
    first_budget_bound,
    solver_settings,
)
from taccl_py.stages.logical import build_logical_graph
from taccl_py.stages.routing import route_chunks
from taccl_py.stages.sketch import auto_sketch
from taccl_py.synth import SynthesisResult, synthesize, write_library
from taccl_py.topology import load_topology

from helpers import assert_valid_algorithm

MB = 1_000_000
# Words that would put a wall time or a machine's load into a written file.
_TIMING_WORDS = ("wall", "elapsed", "seconds", "solve_s")


@pytest.fixture
def busy_core() -> Iterator[subprocess.Popen]:
    """Keep one core busy with a spinning Python process for the test's duration."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield spinner
    finally:
        spinner.kill()
        spinner.wait(timeout=10)


def _synthesize_file(folder, size: str, jobs: str, monkeypatch) -> bytes:
    # the same command in another folder: the file records the command (its provenance)
    folder.mkdir()
    monkeypatch.chdir(folder)
    argv = ["synthesize", "-t", "ndv2", "-c", "allgather", "--size", size, "--jobs", jobs, "-o", "ag.json"]
    assert main(argv) == 0
    return (folder / "ag.json").read_bytes()


def _assert_no_timing(text: str) -> None:
    lowered = text.lower()
    for word in _TIMING_WORDS:
        assert word not in lowered, f"a written file mentions {word!r}: outputs must not carry wall times"


# The default run checks 1 MB; 64 MB (about 19 s on 2 cores) runs with --runslow.
@pytest.mark.parametrize("size", ["1MB", pytest.param("64MB", marks=pytest.mark.slow)])
def test_same_bytes_on_a_busy_machine(size, tmp_path, busy_core, capsys, monkeypatch):
    loaded = _synthesize_file(tmp_path / "busy", size, "1", monkeypatch)
    assert busy_core.poll() is None, "the spinner ran throughout the first synthesis"
    busy_core.kill()
    busy_core.wait(timeout=10)
    quiet = _synthesize_file(tmp_path / "quiet", size, "1", monkeypatch)
    assert loaded == quiet, "the same command wrote different algorithms under load and without"
    _assert_no_timing(quiet.decode())
    assert json.loads(quiet)["provenance"]["command"].endswith(f"--size {size} --jobs 1 -o ag.json")
    assert_valid_algorithm(read_algorithm(str(tmp_path / "quiet" / "ag.json")))
    assert "budget: " in capsys.readouterr().err, "one line says which budget bound"


# One library of two sizes (1 KB: the latency regime's one candidate; 1 MB: the mesh's several), built
# serially and by two workers once for the module: the tests below each check one thing of them.
LIBRARY_SIZES = (1000, MB)


@pytest.fixture(scope="module")
def serial() -> SynthesisResult:
    """Return the NDv2 AllGather library of ``LIBRARY_SIZES`` synthesized in this process."""
    return synthesize(load_topology("ndv2"), "allgather", sizes=LIBRARY_SIZES, jobs=1)


@pytest.fixture(scope="module")
def parallel() -> tuple[SynthesisResult, list[str]]:
    """Return the same library synthesized by two workers, and the progress lines they sent."""
    lines: list[str] = []
    result = synthesize(load_topology("ndv2"), "allgather", sizes=LIBRARY_SIZES, jobs=2, progress=lines.append)
    return result, lines


def _assert_same_libraries(serial: SynthesisResult, parallel: SynthesisResult) -> None:
    assert parallel.candidates == serial.candidates and parallel.budget_bound == serial.budget_bound
    assert len(serial.candidates) > 2, "several candidates to share between the workers"
    assert generate_library(parallel.library) == generate_library(serial.library)
    for ours, theirs in zip(parallel.library.bands, serial.library.bands):
        assert generate_algorithm_json(ours.algorithm) == generate_algorithm_json(theirs.algorithm)
    _assert_no_timing(generate_library(serial.library))


def test_two_jobs_give_the_serial_bytes(serial, parallel):
    _assert_same_libraries(serial, parallel[0])


@pytest.mark.slow  # the bandwidth regime's candidates too (about 15 s on 2 cores)
def test_two_jobs_give_the_serial_bytes_at_64mb():
    topology = load_topology("ndv2")
    serial = synthesize(topology, "allgather", sizes=(MB, 64 * MB), jobs=1)
    _assert_same_libraries(serial, synthesize(topology, "allgather", sizes=(MB, 64 * MB), jobs=2))


def test_progress_lines_of_workers_reach_the_caller(parallel):
    _, lines = parallel
    assert any(line.startswith("[1/") and "verified" in line for line in lines), lines


@pytest.mark.smoke
def test_a_node_limited_model_returns_its_incumbent_and_says_so():
    topology = load_topology("dgx-a100", nodes=4)
    graph = build_logical_graph(topology, auto_sketch(topology))
    chunk_bytes = 64 * MB / (graph.num_ranks * 1)
    routing = route_chunks(graph, 1, chunk_bytes, chunk_bytes / 4, SolverOptions(node_limit=1))
    assert routing.status == SolveStatus.NODE_LIMIT.value == "node limit"
    for chunk, tree in enumerate(routing.trees):
        reached = {routing.root(chunk)} | {graph.links[link].dst for link in tree}
        assert reached == set(range(graph.num_ranks)), f"chunk {chunk} does not reach every rank"


def test_a_node_limited_synthesis_reports_the_node_limit():
    result = synthesize(load_topology("ndv2"), "allgather", size_bytes=MB, node_limit=1, jobs=1)
    assert result.budget_bound is BudgetBound.NODE_LIMIT and not result.timed_out
    assert any(candidate.endswith(":node limit") for candidate in result.candidates), result.candidates
    assert_valid_algorithm(result.algorithm)


def test_a_model_too_large_to_solve_is_reported_as_the_work_budget(monkeypatch):
    # Skipping a model for its size is a work budget of zero: the same every run, and said so.
    monkeypatch.setattr("taccl_py.solvers.MAX_MILP_COLUMNS", 10)
    result = synthesize(load_topology("ndv2"), "allgather", size_bytes=MB, jobs=1)
    assert result.budget_bound is BudgetBound.NODE_LIMIT and not result.timed_out
    assert_valid_algorithm(result.algorithm)


def test_budgets_rank_the_wall_clock_cap_first():
    assert first_budget_bound([None, BudgetBound.NODE_LIMIT, BudgetBound.WALL_CLOCK_CAP]) is BudgetBound.WALL_CLOCK_CAP
    assert first_budget_bound([None, BudgetBound.NODE_LIMIT]) is BudgetBound.NODE_LIMIT
    assert first_budget_bound([None]) is None
    assert budget_of_status(SolveStatus.TOO_LARGE.value) is BudgetBound.NODE_LIMIT
    assert budget_of_status(SolveStatus.OPTIMAL.value) is None


@pytest.mark.smoke
def test_a_tiny_wall_clock_cap_reports_the_cap_and_still_verifies(tmp_path, capsys):
    out = tmp_path / "ag.json"
    argv = ["synthesize", "-t", "ndv2", "-c", "allgather", "--size", "1MB", "--time-limit", "0.01", "--jobs", "1"]
    assert main([*argv, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "the wall-clock cap (0.01 s) stopped a MILP" in err and "may differ from run to run" in err
    assert_valid_algorithm(read_algorithm(str(out)))
    result = synthesize(load_topology("ndv2"), "allgather", size_bytes=MB, time_limit_s=0.01, jobs=1)
    assert result.timed_out and result.budget_bound is BudgetBound.WALL_CLOCK_CAP


def test_provenance_records_the_work_budgets(tmp_path, serial):
    result = serial
    settings = dict(result.library.provenance.solver_options)
    assert settings["threads"] == 1 and settings["random_seed"] == 0 and settings["gap_rel"] == pytest.approx(1e-3)
    assert str(default_node_limit(100)) in settings["node_limit"] and "by model size" in settings["node_limit"]
    assert settings["time_limit_s"] > 0, "the wall-clock safety cap is recorded too"
    write_library(result.library, tmp_path / "ag.library.json")
    header = json.loads((tmp_path / "ag.library.json").read_text())
    assert header["provenance"]["budget_bound"] == (None if result.budget_bound is None else result.budget_bound.value)
    assert read_library(tmp_path / "ag.library.json").provenance == result.library.provenance


def test_an_explicit_node_limit_is_recorded_as_a_number():
    assert dict(solver_settings(SolverOptions(node_limit=7)))["node_limit"] == 7


@pytest.mark.smoke
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"node_limit": 0}, r"node_limit: 0 nodes"),
        ({"jobs": 0}, r"jobs: 0 jobs"),
        ({"time_limit_s": 0}, r"time_limit: 0 s"),
    ],
)
def test_bad_budgets_are_refused(kwargs, message):
    from taccl_py.errors import ArgumentError

    with pytest.raises(ArgumentError, match=message):
        synthesize(load_topology("ndv2"), "allgather", size_bytes=MB, **kwargs)
