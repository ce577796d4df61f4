"""A deadline for work the host does not wait for: GPU transfers queued on a stream.

A transport whose messages only order a CUDA stream (no host wait per round) still owes its
caller a timeout. :class:`Watchdog` polls each watched item's completion from one background
thread; an item past its deadline expires the transport (aborts its communicator, so the stuck
kernels end) and leaves a :class:`~taccl_py.errors.TransportError` that names the item, raised by
the transport's next call (:meth:`Watchdog.check`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from taccl_py.errors import TransportError

__all__ = ["POLL_S", "Watchdog"]

logger = logging.getLogger(__name__)

#: How often (s) the watchdog looks at what it watches: a cheap query per item.
POLL_S = 0.05


@dataclass
class _Watched:
    done: Callable[[], bool]
    deadline: float  # time.monotonic()
    what: str
    timeout_s: float


class Watchdog:
    """Expire, once, when a watched item is not done by its deadline.

    ``expire`` runs on the watchdog's thread after the first missed deadline (e.g. abort the NCCL
    communicator); every later :meth:`check` raises the error that names the item. The error is
    set before ``expire`` runs, so ``expire`` may wait (the CuPy transport waits for a post in
    flight to leave NCCL) without delaying it; the thread ends after ``expire``.
    """

    def __init__(self, expire: Callable[[], None], name: str = "taccl-watchdog", poll_s: float = POLL_S) -> None:
        self._expire = expire
        self._name = name
        self._poll_s = poll_s
        self._watched: list[_Watched] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._error: str | None = None
        self._thread: threading.Thread | None = None

    def watch(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Watch ``done()`` until it returns True; expire if it has not within ``timeout_s`` (s)."""
        self.check()
        with self._lock:
            self._watched.append(_Watched(done, time.monotonic() + timeout_s, what, timeout_s))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        self._wake.set()

    def check(self) -> None:
        """Raise TransportError if an item missed its deadline."""
        if self._error is not None:
            raise TransportError(self._error)

    @property
    def pending(self) -> int:
        """Return how many watched items are not known to be done yet."""
        with self._lock:
            return len(self._watched)

    def close(self) -> None:
        """Stop the thread (items still watched are forgotten)."""
        with self._lock:
            self._stop = True
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            self._wake.clear()  # before looking, so a watch() from here on wakes the wait below
            with self._lock:
                if self._stop:
                    return
                # Items finish in order on one stream, so the oldest holds up the rest.
                self._watched = [item for item in self._watched if not item.done()]
                now = time.monotonic()
                late = next((item for item in self._watched if now >= item.deadline), None)
                idle = not self._watched
            if late is not None:
                self._fail(late)
                return
            self._wake.wait(None if idle else self._poll_s)

    def _fail(self, item: _Watched) -> None:
        self._error = f"{item.what} not complete after {item.timeout_s:g} s; the communicator was aborted"
        logger.error("%s", self._error)
        try:
            self._expire()
        except Exception:  # the error above is what the caller needs; the abort's own failure is secondary
            logger.exception("expiring after a missed deadline failed")
