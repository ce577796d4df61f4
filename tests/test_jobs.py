"""Worker jobs: their progress lines reach the caller while they run, not when they finish (issue 14),
and no worker outlives the run that started it: not an exception, a signal or a killed parent (issue 43).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest

from taccl_py.progress import heartbeat
from taccl_py.synth.jobs import run_jobs

WAIT_S = 20.0  # how long a job waits for the caller to have seen its first line
GONE_S = 15.0  # how long ended processes may take to disappear (a loaded 2-core machine)
REPO = Path(__file__).resolve().parents[1]
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads processes from Linux's /proc")


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
    progress(f"start {name} {time.monotonic()!r}")  # CLOCK_MONOTONIC: one clock for every process
    time.sleep(0.3)
    return name


def test_workers_take_the_costliest_job_first_and_return_values_in_order():
    lines: list[str] = []
    values = run_jobs([partial(_announce, name) for name in "abc"], 2, lines.append, costs=[1, 5, 3])
    assert values == ["a", "b", "c"]
    # Lines from two workers may arrive out of order on a loaded machine: order them by when each job began.
    starts = sorted((float(line.split()[2]), line.split()[1]) for line in lines if line.startswith("start"))
    # Two workers can take the last two jobs within microseconds (one freed, one late to start), so
    # the cheapest job is known to come last by waiting for a free worker, not by its timestamp's rank.
    began = {name: at for at, name in starts}
    assert began["a"] - starts[0][0] >= 0.2, f"the cheapest job took a worker before a costlier one: {starts}"


# -- no worker outlives its run (issue 43) -----------------------------------------------------------


def _alive(pid: int) -> bool:
    """Return whether process ``pid`` runs (a zombie, dead but not reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _session(sid: int) -> dict[int, int]:
    """Return the live processes of session ``sid``, each with its parent's pid (orphans count: their sid stays)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            found[int(entry.name)] = int(fields[1])
    return found


def _gone(pids, deadline_s: float = GONE_S) -> set[int]:
    """Return which of ``pids`` still run after ``deadline_s`` (SIGKILLed then, so no test leaves them behind)."""
    deadline = time.monotonic() + deadline_s
    while (left := {pid for pid in pids if _alive(pid)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def _sleep_then_mark(folder: str, name: str, progress) -> None:
    """Write this process's pid to ``folder/name.pid``, sleep ``WAIT_S``, then write ``folder/name.done``."""
    Path(folder, f"{name}.pid").write_text(str(os.getpid()))
    time.sleep(WAIT_S)
    Path(folder, f"{name}.done").touch()


def _fail_once_started(folder: str, progress) -> None:
    """Raise once the sleeping job has started (its pid file exists)."""
    while not Path(folder, "sleeper.pid").exists():
        time.sleep(0.05)
    raise ValueError("broken job")


@needs_proc
def test_a_failing_job_ends_the_running_ones_instead_of_waiting_for_them(tmp_path):
    jobs = [partial(_sleep_then_mark, str(tmp_path), "sleeper"), partial(_fail_once_started, str(tmp_path))]
    with pytest.raises(ValueError, match="broken job"):
        run_jobs(jobs, 2, None)
    assert not (tmp_path / "sleeper.done").exists(), "run_jobs waited for the sleeping job to finish"
    assert _gone([int((tmp_path / "sleeper.pid").read_text())]) == set()


_KILLED_PARENT = """
import sys
from functools import partial
from test_jobs import _sleep_then_mark
from taccl_py.synth.jobs import run_jobs
run_jobs([partial(_sleep_then_mark, sys.argv[1], name) for name in ("a", "b")], 2, None)
"""


def _wait_for_files(paths: list[Path], process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not all(path.exists() for path in paths):
        assert process.poll() is None and time.monotonic() < deadline, "the workers never started"
        time.sleep(0.05)


@needs_proc
def test_workers_exit_when_their_parent_is_killed(tmp_path):
    """SIGKILL runs no cleanup in the parent: each worker must notice by itself that its parent is gone."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _KILLED_PARENT, str(tmp_path)], cwd=Path(__file__).parent, start_new_session=True
    )
    pid_files = [tmp_path / "a.pid", tmp_path / "b.pid"]
    try:
        _wait_for_files(pid_files, parent)
        workers = [int(path.read_text()) for path in pid_files]
        parent.kill()
        parent.wait(timeout=30)
        assert _gone(workers) == set(), "a worker outlived its SIGKILLed parent"
    finally:
        _gone(_session(parent.pid), deadline_s=0)


def _signal_as_from_a_shell(ignore_sigint: bool) -> None:
    """Give the child SIGINT as a shell gives a job: default (foreground) or ignored (a background ``&`` job)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.SIG_IGN if ignore_sigint else signal.SIG_DFL)


def _threads(pid: int) -> int:
    """Return how many threads process ``pid`` runs (0 once it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except (FileNotFoundError, ProcessLookupError):
        return 0


def _wait_for_a_ready_worker(run: subprocess.Popen) -> None:
    """Return once a worker (a process of ``run``'s session it did not start itself) runs a second thread.

    The second thread is the parent watch the worker starts before its first job: from then on a
    Ctrl-C to the process group finds it ignoring SIGINT, as a worker does for the rest of its life.
    """
    deadline = time.monotonic() + 120
    while True:
        assert run.poll() is None and time.monotonic() < deadline, "no worker started"
        workers = [pid for pid, ppid in _session(run.pid).items() if pid != run.pid and ppid != run.pid]
        if any(_threads(pid) > 1 for pid in workers):
            return
        time.sleep(0.05)


@needs_proc
@pytest.mark.parametrize(
    ("signum", "to_group", "status"),
    [(signal.SIGTERM, False, 143), (signal.SIGINT, True, 130)],
    ids=["sigterm-to-the-process", "sigint-to-a-background-jobs-group"],
)
def test_a_signalled_synthesis_exits_quietly_and_leaves_no_process(tmp_path, signum, to_group, status):
    """SIGTERM left the forkserver and workers running; SIGINT to a background run's group ended in a traceback."""
    target, stderr_path = tmp_path / "ar.json", tmp_path / "stderr"
    command = [sys.executable, "-m", "taccl_py", "synthesize", "-t", "ndv2", "--nodes", "2", "-c", "allreduce"]
    with stderr_path.open("w") as stderr:  # a file, not a pipe: a leftover worker would hold a pipe open
        run = subprocess.Popen(
            [*command, "--jobs", "2", "-o", str(target)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=partial(_signal_as_from_a_shell, to_group),
        )
    try:
        _wait_for_a_ready_worker(run)
        if to_group:
            os.killpg(run.pid, signum)
        else:
            run.send_signal(signum)
        assert run.wait(timeout=60) == status
    finally:
        left = _gone(_session(run.pid))
    text = stderr_path.read_text()
    assert "Traceback" not in text and len(text.splitlines()) <= 2, text[-2000:]
    assert left == set(), "processes of the run outlived it"
    assert not target.exists()
