"""Progress from inside a synthesis candidate's stages, not only at their boundaries (issue 14)."""

from __future__ import annotations

import pytest

from taccl_py.ir.algorithm_json import generate_algorithm_json
from taccl_py.synth import progress as progress_module
from taccl_py.synth import synthesize
from taccl_py.synth.progress import ProgressTicker
from taccl_py.topology import load_topology

MB = 1_000_000


@pytest.fixture(scope="module")
def quiet_run():
    """ndv2 AllGather at 1 MB without progress: what every run with progress must equal."""
    return synthesize(load_topology("ndv2"), "allgather", size_bytes=MB, jobs=1)


def test_a_candidate_reports_from_inside_its_milps_ordering_verification_and_simulation(monkeypatch, quiet_run):
    """With the interval at zero every periodic report fires: each long stage must have one."""
    monkeypatch.setattr(progress_module, "REPORT_INTERVAL_S", 0.0)
    lines: list[str] = []
    result = synthesize(load_topology("ndv2"), "allgather", size_bytes=MB, jobs=1, progress=lines.append)
    inside = [line for line in lines if line.startswith("[1/")]
    assert any("routing: MILP of" in line and "columns" in line and "work budget" in line for line in inside), lines
    assert any("routing: " in line and (" in " in line and line.endswith(" s")) for line in inside), lines
    assert any("routing: " in line and " nodes, " in line for line in inside), "HiGHS's callback reports mid-solve"
    assert any("ordering: " in line and "sends placed" in line for line in inside), lines
    assert any("verifying" in line for line in inside), lines
    assert any("simulating" in line and "sizes done" in line for line in inside), lines
    # Wall time decides only when a line is written, never what is computed.
    assert generate_algorithm_json(result.algorithm) == generate_algorithm_json(quiet_run.algorithm)


def test_ticker_waits_its_interval_and_says_at_once():
    lines: list[str] = []
    ticker = ProgressTicker(lines.append, interval_s=3600.0)
    ticker.tick(lambda: "not yet")
    ticker.say("now")
    assert lines == ["now"]
    ProgressTicker(None, interval_s=0.0).tick(lambda: pytest.fail("describe is not called without a callback"))
