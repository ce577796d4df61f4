"""Watchdog: a deadline for stream-ordered work, without a host wait per round."""

from __future__ import annotations

import threading
import time

import pytest

from taccl_py.errors import TransportError
from taccl_py.runtime.transports.watchdog import Watchdog


def wait_until(condition, limit_s: float = 5.0) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_work_that_finishes_in_time_leaves_no_error() -> None:
    expired = []
    watchdog = Watchdog(lambda: expired.append(True), poll_s=0.01)
    finished = threading.Event()
    watchdog.watch(finished.is_set, 5.0, "rank 0 round 1")
    finished.set()
    assert wait_until(lambda: watchdog.pending == 0)
    watchdog.check()
    watchdog.close()
    assert expired == []


def test_a_missed_deadline_expires_once_and_names_the_round() -> None:
    expired = []
    watchdog = Watchdog(lambda: expired.append(True), poll_s=0.01)
    watchdog.watch(lambda: True, 0.1, "rank 1 round 3")
    start = time.monotonic()
    watchdog.watch(lambda: False, 0.2, "rank 1 round 4 (2 sends, 1 receive)")
    assert wait_until(lambda: expired == [True])
    assert 0.15 < time.monotonic() - start < 5
    with pytest.raises(TransportError, match=r"rank 1 round 4 \(2 sends, 1 receive\) not complete after 0.2 s"):
        watchdog.check()
    with pytest.raises(TransportError, match="round 4"):  # no new work once expired
        watchdog.watch(lambda: True, 1.0, "rank 1 round 5")
    time.sleep(0.05)
    assert expired == [True]
    watchdog.close()


def test_an_idle_watchdog_wakes_for_new_work_and_closes() -> None:
    expired = []
    watchdog = Watchdog(lambda: expired.append(True), poll_s=0.01)
    watchdog.watch(lambda: True, 1.0, "first")
    assert wait_until(lambda: watchdog.pending == 0)
    time.sleep(0.05)  # the thread now waits with nothing to watch
    watchdog.watch(lambda: False, 0.1, "second")
    assert wait_until(lambda: expired == [True])
    watchdog.close()
    assert not any(t.name == "taccl-watchdog" and t.is_alive() for t in threading.enumerate())
