"""Progress lines from inside long synthesis stages (MILPs, ordering, simulation), a few seconds apart.

A stage that runs for minutes on 64 GPUs reports through the caller's progress callback while it
works, not only when it starts and ends. Wall time decides only when a line is written, never
what is computed, so the result is the same on an idle or a busy machine.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["REPORT_INTERVAL_S", "ProgressTicker", "heartbeat", "no_progress", "prefixed"]

# Seconds between progress lines inside one stage: often enough that a long run never looks stuck,
# rarely enough that a terminal can read it (HiGHS's own MIP log waits 5 s, mip_min_logging_interval).
REPORT_INTERVAL_S = 2.0
_MIN_BEAT_S = 0.01  # a heartbeat thread never spins, whatever interval it is given


def no_progress(message: str) -> None:
    """Drop a progress line (the callback to use where the caller gave none)."""


class ProgressTicker:
    """Pass lines to ``progress`` (None: nowhere), those of ``tick`` at most every ``interval_s`` seconds.

    ``interval_s`` defaults to ``REPORT_INTERVAL_S`` as it is when the ticker is made.
    """

    __slots__ = ("progress", "interval_s", "_last_s")

    def __init__(self, progress: Callable[[str], None] | None, interval_s: float | None = None) -> None:
        self.progress = progress
        self.interval_s = REPORT_INTERVAL_S if interval_s is None else interval_s
        self._last_s = time.monotonic()

    def say(self, message: str) -> None:
        """Pass ``message`` on now and start the interval again."""
        if self.progress is not None:
            self.progress(message)
            self._last_s = time.monotonic()

    def due(self) -> bool:
        """Return True when a line is wanted and the interval has passed since the last one."""
        return self.progress is not None and time.monotonic() - self._last_s >= self.interval_s

    def tick(self, describe: Callable[[], str]) -> None:
        """Pass ``describe()`` on when the interval has passed (``describe`` is not called otherwise)."""
        if self.due():
            self.say(describe())


class _Prefixed:
    """A progress callback that puts ``prefix`` before each line and passes it to ``progress``."""

    __slots__ = ("progress", "prefix")

    def __init__(self, progress: Callable[[str], None], prefix: str) -> None:
        self.progress = progress
        self.prefix = prefix

    def __call__(self, message: str) -> None:
        self.progress(self.prefix + message)


def prefixed(progress: Callable[[str], None] | None, prefix: str) -> Callable[[str], None] | None:
    """Return a callback passing each line to ``progress`` after ``prefix`` (None for None)."""
    return None if progress is None else _Prefixed(progress, prefix)


@contextlib.contextmanager
def heartbeat(
    progress: Callable[[str], None] | None,
    what: str,
    interval_s: float | None = None,
    *,
    ticker: ProgressTicker | None = None,
) -> Iterator[None]:
    """Pass ``"<what>: still running, N s"`` to ``progress`` while the block runs, when nothing else spoke.

    For calls that hold no callbacks of their own, or too few (HiGHS's root LP; CP-SAT through
    OR-Tools' model builder, whose log callback does not bind in 9.15; CBC in a subprocess), and
    for pure-Python work (verification, simulation): those release the GIL or let threads switch,
    so a thread can speak meanwhile, from ``ticker`` (shared with the block's own reports, so a
    heartbeat comes only when they were quiet for its interval) or a new one of ``interval_s``.
    ``progress`` is then called from that thread. None: nothing runs.
    """
    if progress is None:
        yield
        return
    ticker = ticker if ticker is not None else ProgressTicker(progress, interval_s)
    interval = max(_MIN_BEAT_S, ticker.interval_s)
    stop = threading.Event()
    began = time.monotonic()

    def beat() -> None:
        while not stop.wait(interval):
            ticker.tick(lambda: f"{what}: still running, {time.monotonic() - began:.0f} s")

    thread = threading.Thread(target=beat, name="taccl-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
