"""HiGHS stays off the console: no banner or log on stdout, where tables and JSON go (issue 13)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLI_TIMEOUT_S = 120


@pytest.mark.smoke
def test_synthesize_writes_nothing_of_highs_on_stdout(tmp_path):
    """``taccl synthesize > out``: stdout holds the summary and table only, also from worker processes.

    HiGHS writes its banner once per process from C, so a fresh interpreter is the only sure test;
    ``--jobs 2`` starts workers, each a fresh process of its own.
    """
    out = tmp_path / "ag.json"
    command = [sys.executable, "-m", "taccl_py", "synthesize", "-t", "ndv2", "-c", "allgather", "--size", "1MB"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [*command, "--jobs", "2", "-o", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "HiGHS" not in done.stdout and "Copyright" not in done.stdout, done.stdout
    assert done.stdout.startswith("allgather on ndv2 (8 GPUs)"), done.stdout
    assert "HiGHS" not in done.stderr, "HiGHS's log goes to the logger at DEBUG, not to the console"
    assert out.exists()


def test_highs_log_goes_to_the_logger_at_debug(caplog, capfd):
    """With DEBUG on, a HiGHS solve's log lines reach the logger and still not the console."""
    import logging

    from taccl_py.synth import synthesize
    from taccl_py.topology import load_topology

    with caplog.at_level(logging.DEBUG, logger="taccl_py.solvers.highs"):
        synthesize(load_topology("ndv2"), "allgather", size_bytes=1_000_000, jobs=1)
    captured = capfd.readouterr()
    assert "HiGHS" not in captured.out and "HiGHS" not in captured.err
    assert any("HiGHS:" in record.getMessage() for record in caplog.records)
