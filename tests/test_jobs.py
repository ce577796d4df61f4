"""Worker jobs: their progress lines reach the caller while they run, not when they finish (issue 14)."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import pytest

from taccl_py.progress import heartbeat
from taccl_py.synth.jobs import run_jobs

WAIT_S = 20.0  # how long a job waits for the caller to have seen its first line


def _wait_for_caller(flag: str, progress) -> bool:
    """Report, then return True once the caller's callback has made ``flag`` (False after ``WAIT_S``)."""
    progress(f"started, waiting for {flag}")
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if Path(flag).exists():
            progress("seen")
            return True
        time.sleep(0.05)
    return False


def _mark_seen(lines: list[str], flag: Path, line: str) -> None:
    lines.append(line)
    flag.touch()


def test_worker_progress_reaches_the_caller_while_the_job_runs(tmp_path):
    flags = [tmp_path / "first", tmp_path / "second"]
    lines: list[str] = []
    seen = run_jobs(
        [partial(_wait_for_caller, str(flag)) for flag in flags],
        2,
        lambda line: _mark_seen(lines, flags[int("second" in line)], line),
    )
    assert seen == [True, True], "a job's first line reached the caller only after it finished"
    assert lines.count("seen") == 2, lines


def _square(value: int, progress) -> int:
    return value * value


def _given(progress) -> bool:
    return progress is not None


def test_workers_without_progress_return_values_in_order():
    assert run_jobs([partial(_square, 2), partial(_square, 3)], 2, None) == [4, 9]
    assert run_jobs([_given, _given], 2, None) == [False, False], "no progress: workers get None"


def _fail(message: str, progress) -> None:
    progress("about to fail")
    raise ValueError(message)


def test_a_worker_exception_is_raised_here_with_progress_on():
    lines: list[str] = []
    with pytest.raises(ValueError, match="broken job"):
        run_jobs([partial(_fail, "broken job"), partial(_square, 3)], 2, lines.append)


def _beating(progress) -> int:
    with heartbeat(progress, "solving", interval_s=0.01):
        time.sleep(0.2)
    return 1


def test_a_workers_heartbeat_thread_reaches_the_caller():
    """A heartbeat speaks from its own thread; in a worker, that thread too must reach the caller's queue."""
    lines: list[str] = []
    assert run_jobs([_beating, _beating], 2, lines.append) == [1, 1]
    assert any(line.startswith("solving: still running") for line in lines), lines


def _announce(name: str, progress) -> str:
    progress(f"start {name}")
    time.sleep(0.3)
    return name


def test_workers_take_the_costliest_job_first_and_return_values_in_order():
    lines: list[str] = []
    values = run_jobs([partial(_announce, name) for name in "abc"], 2, lines.append, costs=[1, 5, 3])
    assert values == ["a", "b", "c"]
    starts = [line for line in lines if line.startswith("start")]
    assert starts[-1] == "start a", f"the cheapest job should start last: {starts}"
