"""The local engine: each instance built in a fresh Python process of its own, ``slots`` at once.

A worker (``python -m taccl_py.build.local FOLDER``) reads its instance and options from a private
temporary folder, builds it (``taccl_py.build.run.build_instance``) and leaves the result there as a
pickle for the driver, which reads it only when the worker exited with status 0. A fresh process per
instance keeps each one's wall time and peak memory its own, and a crash takes only its own instance.
"""

from __future__ import annotations

import logging
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from taccl_py._io import write_bytes_atomic
from taccl_py.build.instance import BuildOptions, Instance, InstanceResult, instance_timeout_s, timed_out_error
from taccl_py.build.run import build_instance
from taccl_py.errors import ArgumentError
from taccl_py.gc_tuning import collect_cycles_rarely

__all__ = ["LocalEngine", "main"]

logger = logging.getLogger(__name__)

_POLL_S = 0.1  # how often the driver looks for finished workers
_STOP_WAIT_S = 2.0  # how long a worker has to exit after SIGTERM before it gets SIGKILL
_REQUEST, _RESULT, _LOG = "request.pickle", "result.pickle", "worker.log"


@dataclass(eq=False, slots=True)
class _Task:
    """One worker process, the temporary folder it talks to the driver through, and its time limit (s)."""

    instance: Instance
    process: subprocess.Popen
    folder: Path
    timeout_s: float
    deadline_s: float
    timed_out: bool = False


class LocalEngine:
    """Build instances in worker processes on this machine, ``slots`` at once (the driver's ``Engine``)."""

    name = "local"

    def __init__(self, options: BuildOptions, slots: int = 1, timeout_s: float | None = None) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ArgumentError(None, "jobs", f"{slots!r} instances at once", "a positive number of worker processes")
        self.options = options
        self.slots = slots
        self.timeout_s = instance_timeout_s(options) if timeout_s is None else timeout_s
        self._tasks: set[_Task] = set()

    def submit(self, instance: Instance) -> object:
        """Start a worker process building ``instance``; return its handle."""
        folder = Path(tempfile.mkdtemp(prefix="taccl-build-"))
        (folder / _REQUEST).write_bytes(pickle.dumps((instance, self.options)))
        with (folder / _LOG).open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(folder)], stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        task = _Task(instance, process, folder, self.timeout_s, time.monotonic() + self.timeout_s)
        self._tasks.add(task)
        return task

    def wait(self, handles: Collection[object]) -> list[tuple[object, InstanceResult | str]]:
        """Block until one or more workers of ``handles`` ended (or ran out of time); return their results or errors."""
        while True:
            finished = [(task, _outcome(task)) for task in handles if _ended(task)]
            if finished:
                for task, _found in finished:
                    self._forget(task)
                return finished
            time.sleep(_POLL_S)

    def close(self) -> None:
        """End every worker still running and remove the temporary folders."""
        for task in list(self._tasks):
            _stop(task.process)
            self._forget(task)

    def _forget(self, task: _Task) -> None:
        self._tasks.discard(task)
        shutil.rmtree(task.folder, ignore_errors=True)


def _ended(task: _Task) -> bool:
    """Return True when ``task``'s worker exited, killing it first when it passed its deadline."""
    if task.process.poll() is None and time.monotonic() > task.deadline_s:
        task.timed_out = True
        _stop(task.process)
    return task.process.poll() is not None


def _outcome(task: _Task) -> InstanceResult | str:
    """Return the result a worker left, or one line saying why it left none."""
    status = task.process.returncode
    if status == 0 and (task.folder / _RESULT).is_file():
        return pickle.loads((task.folder / _RESULT).read_bytes())
    if task.timed_out:
        return timed_out_error(task.timeout_s)
    how = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
    last = _last_line(task.folder / _LOG)
    return f"worker {how}: {last}" if last else f"worker {how}"


def _last_line(log: Path) -> str:
    """Return the last non-blank line of a worker's log (its exception, when it raised)."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def _stop(process: subprocess.Popen) -> None:
    """End ``process``: SIGTERM, then SIGKILL when it has not exited within ``_STOP_WAIT_S``."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(_STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Build the instance a worker folder asks for and leave its result there; return the exit status."""
    collect_cycles_rarely()
    folder = Path((sys.argv[1:] if argv is None else argv)[0])
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    instance, options = pickle.loads((folder / _REQUEST).read_bytes())
    result = build_instance(instance, options, progress=logger.info)
    write_bytes_atomic(folder / _RESULT, pickle.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
