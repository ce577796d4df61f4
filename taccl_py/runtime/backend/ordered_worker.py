"""Run collectives on one background thread, in submission order, and hand back futures.

The DDP hook (:mod:`taccl_py.runtime.ddp`) and the ``taccl`` process group
(:mod:`taccl_py.runtime.backend`) both launch a CPU collective from the autograd thread and must
not wait for it there, or communication could not overlap the rest of backward. An
:class:`OrderedWorker` owns one daemon thread that takes submitted jobs first in, first out and
completes each job's :class:`torch.futures.Future` with ``set_result`` or ``set_exception``. (GPU
collectives need no thread: they are issued on a CUDA stream of their own and the host goes on;
see :mod:`taccl_py.runtime.backend.issue_order`.)

Why one thread, in order: every rank submits its collectives in the same order (DDP launches
buckets by index; a process group sees its collectives in program order), so serving them first in,
first out keeps the ranks matched. Two threads could start bucket 1 on one rank and bucket 2 on
another, and both would wait forever. The jobs must also be the only users of their
communicator's process group: a collective issued there from another thread (DDP's broadcast of
buffers, say) could interleave with a job's messages in a different order on different ranks.

A job may run inside a context (``submit(job, around)``) and complete a CUDA-aware future
(``devices``): the future records the stream current inside that context at ``set_result``.

After a job fails, the worker fails every later job at once with a :class:`TransportError` that
names the first failure, so a broken peer surfaces as an exception from ``backward`` (or from a
Work's ``wait``) within the transport's timeout instead of a hang; :meth:`OrderedWorker.close`
stops the thread.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from taccl_py.errors import ArgumentError, TacclError, TransportError

__all__ = ["OrderedWorker", "CLOSE_TIMEOUT_S"]

logger = logging.getLogger(__name__)

#: Seconds :meth:`OrderedWorker.close` waits for the jobs already queued to finish.
CLOSE_TIMEOUT_S = 60.0

_STOP = object()


class OrderedWorker:
    """Run submitted jobs on one daemon thread, first in, first out; each job gets a Future.

    Parameters
    ----------
    name : str
        Name of the thread (shown in tracebacks and ``threading.enumerate()``).

    Notes
    -----
    A job is a callable with no arguments; its return value becomes the Future's result. A job
    that raises fails its Future with that exception (a :class:`~taccl_py.errors.TacclError` as
    it is, anything else wrapped in a :class:`~taccl_py.errors.TransportError`), and every job
    submitted afterwards fails at once, because the peers' message order is lost.

    Examples
    --------
    >>> worker = OrderedWorker("example")
    >>> worker.submit(lambda: 6 * 7).wait()
    42
    >>> worker.close()
    """

    __slots__ = ("_name", "_queue", "_thread", "_lock", "_failure", "_closed", "_unfinished")

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._failure: BaseException | None = None
        self._closed = False
        self._unfinished = 0  # jobs submitted and not yet run to the end
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def __reduce__(self) -> Any:
        raise TypeError(f"{type(self).__name__}: owns a thread and cannot be pickled")

    @property
    def failure(self) -> BaseException | None:
        """Return the exception of the first job that failed, or None."""
        return self._failure

    def in_worker_thread(self) -> bool:
        """Return whether the caller is this worker's thread (a job calling back into its owner)."""
        return threading.current_thread() is self._thread

    def idle(self) -> bool:
        """Return whether every job submitted so far has run (a call made now runs after all of them)."""
        with self._lock:
            return self._unfinished == 0

    @property
    def closed(self) -> bool:
        """Return whether :meth:`close` was called."""
        return self._closed

    def submit(
        self,
        job: Callable[[], Any],
        around: contextlib.AbstractContextManager | None = None,
        devices: list[torch.device] | None = None,
    ) -> torch.futures.Future:
        """Queue ``job`` behind the jobs already submitted; return the Future of its result.

        ``around``, when given, is entered on the worker thread for the job (``torch.cuda.stream(...)``);
        the result is set inside it too. With CUDA ``devices`` the Future is CUDA-aware: it records
        the job's stream when it completes, and ``wait``/``value`` order the waiter's current
        stream after it (``torch.futures.Future(devices=...)``).

        A failed job's Future holds a torch-level error, so C++ waiters (DDP's reducer, a
        process group's Work) raise too; in Python ``wait()`` raises RuntimeError whose message
        names the :class:`~taccl_py.errors.TransportError` (also kept in :attr:`failure`).

        Raises
        ------
        ArgumentError
            If the worker was closed.
        """
        future: torch.futures.Future = torch.futures.Future(devices=devices) if devices else torch.futures.Future()
        # torch.futures.Future.set_exception stores the exception as the *value* and re-raises it
        # only from Python; a callback that raises gives a real error that C++ waiters see.
        surfaced = future.then(_value_or_raise)
        with self._lock:
            if self._closed:
                raise ArgumentError(self._name, "submit", "the worker is closed", "a job before close()")
            failure = self._failure
            if failure is None:
                self._unfinished += 1
                self._queue.put((job, future, around))
        if failure is not None:
            future.set_exception(_after_failure(self._name, failure))
        return surfaced

    def flush(self) -> torch.futures.Future:
        """Return a Future that completes once every job submitted so far has finished."""
        return self.submit(_no_op)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Finish the queued jobs, stop the thread and wait up to ``timeout_s`` for it.

        Closing twice is harmless. A thread still busy after ``timeout_s`` (a collective whose
        peers never came) is left behind as a daemon and logged.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning("%s: worker still busy after %.1f s; leaving it as a daemon", self._name, timeout_s)

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            self._run_one(*item)
            # the job's references (its caller's tensors) went with _run_one's frame: a tensor the
            # caller drops is freed now, not when the next job comes (idle() is True only after this)
            del item
            with self._lock:
                self._unfinished -= 1

    def _run_one(self, job: Callable[[], Any], future: torch.futures.Future, around: Any) -> None:
        failure = self._failure
        if failure is not None:
            future.set_exception(_after_failure(self._name, failure))
            return
        with around if around is not None else contextlib.nullcontext():
            # A CUDA-aware future records the current stream at set_result: the job's stream.
            try:
                result = job()
            except Exception as exc:  # noqa: BLE001 - every failure must reach the waiting rank
                error = _as_taccl_error(self._name, exc)
                with self._lock:
                    self._failure = error
                logger.error("%s: job failed: %s", self._name, error)
                future.set_exception(error)
            else:
                future.set_result(result)


def _no_op() -> None:
    return None


def _value_or_raise(future: torch.futures.Future) -> Any:
    return future.wait()


def _as_taccl_error(name: str, exc: Exception) -> Exception:
    if isinstance(exc, TacclError):
        return exc
    error = TransportError(f"{name}: collective failed: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


def _after_failure(name: str, failure: BaseException) -> TransportError:
    error = TransportError(f"{name}: not run: an earlier collective failed ({failure})")
    error.__cause__ = failure
    return error
