"""Peak memory of a process and everything it starts (forkserver workers included), sampled from /proc.

``getrusage(RUSAGE_CHILDREN)`` only counts children that were waited for, and a forkserver's
workers are not a synthesis's children at all, so a build that wants the memory of the
whole run samples the process tree instead: every ``interval_s`` it lists the root's live
descendants and reads each one's resident set (VmRSS) and high-water mark (VmHWM). Linux only;
elsewhere nothing is sampled and the peaks stay 0.

Descendants are found from each thread's ``/proc/PID/task/TID/children`` (Linux 3.5+), so a
sample reads only the tree's own files. Reading every process's ``stat`` instead costs about
5 ms a sample with 70 processes and grows with the host's process count (a Ray node runs
hundreds); it is kept for kernels without those files.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["TreeMemory", "process_tree"]

_PROC = Path("/proc")


def process_tree(root: int) -> list[int]:
    """Return ``root`` and its live descendants' pids (just ``root`` without /proc)."""
    if not _PROC.is_dir():
        return [root]
    children = _children_of if _has_children_files() else _scan_children().get
    tree, stack = [], [root]
    while stack:
        pid = stack.pop()
        tree.append(pid)
        stack.extend(children(pid) or ())
    return tree


def _has_children_files() -> bool:
    """Return True where the kernel lists each thread's children (CONFIG_PROC_CHILDREN)."""
    return (_PROC / "self" / "task" / str(os.getpid()) / "children").exists()


def _children_of(pid: int) -> list[int]:
    """Return the children of every thread of ``pid`` (none when it has ended)."""
    try:
        tasks = list((_PROC / str(pid) / "task").iterdir())
    except OSError:
        return []
    children = []
    for task in tasks:
        try:
            children.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:  # the thread ended while we listed
            continue
    return children


def _scan_children() -> dict[int, list[int]]:
    """Return every live process's children, by parent pid, from each one's ``stat``."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while we listed
            continue
        # The command name may hold spaces and parentheses; the fields after it are plain.
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    return children


def _resident_kB(pid: int) -> tuple[int, int]:
    """Return (VmRSS, VmHWM) of ``pid`` in kB, zeros when it is gone."""
    rss = hwm = 0
    try:
        for line in (_PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    except OSError:
        pass
    return rss, hwm


class TreeMemory:
    """Sample a process tree's memory on a thread until ``stop``.

    ``peak_total_MB``: the largest sum of resident sets seen at one sample (all processes at once);
    ``peak_process_MB``: the largest single process's high-water mark.
    """

    def __init__(self, root: int, interval_s: float = 0.25) -> None:
        self.root = root
        self.interval_s = interval_s
        self.peak_total_MB = 0.0
        self.peak_process_MB = 0.0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-memory", daemon=True)

    def start(self) -> TreeMemory:
        self._thread.start()
        return self

    def sample(self) -> None:
        """Take one sample now."""
        readings = [_resident_kB(pid) for pid in process_tree(self.root)]
        self.peak_total_MB = max(self.peak_total_MB, sum(rss for rss, _ in readings) / 1024)
        self.peak_process_MB = max(self.peak_process_MB, max((hwm for _, hwm in readings), default=0) / 1024)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        """Stop sampling (the peaks keep what was seen)."""
        self._stopped.set()
        self._thread.join()
