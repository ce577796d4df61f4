"""One issue order per ``taccl`` group: routed collectives and the inner backend's calls run as they were called.

ProcessGroupNCCL runs a group's calls in the order they were issued, on its stream, so
``all_reduce(t, async_op=True); broadcast(t)`` broadcasts the reduced tensor. The ``taccl`` group
runs some calls itself (routed: a Communicator's algorithm) and hands the others to an inner
gloo/NCCL backend (delegated); :class:`IssueOrder` keeps the two in one order:

- GPU: a routed collective is issued on the calling thread, on its current stream, and returns a
  :class:`~taccl_py.runtime.backend.work.StreamWork`; a delegated call goes to the inner NCCL
  backend at once, whose stream waits for the caller's; the next routed call's stream waits for
  the inner backend's latest call (an event, which holds none of its tensors).
- CPU: a routed collective is a job on the group's
  :class:`~taccl_py.runtime.backend.ordered_worker.OrderedWorker` (so DDP's bucket all-reduces overlap
  backward); a delegated collective issued while routed ones are queued is a job behind them, and
  send and recv wait on the calling thread until those ran (a receive queued on the worker would
  hold back the routed calls a peer may need before it sends). With nothing queued, a delegated
  call goes to gloo at once, and async calls keep gloo's own order (which runs two at a time).

Calls made while a routed collective runs (a Communicator's own calls to the group: its
calibration, its fallback to the group's collective) go to the inner backend directly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from taccl_py.runtime.backend.ordered_worker import OrderedWorker
from taccl_py.runtime.backend.work import FutureWork, StreamWork

__all__ = ["IssueOrder", "POINT_TO_POINT"]

#: Inner-backend methods that run on the calling thread on CPU, once the queued jobs ran.
POINT_TO_POINT = frozenset({"send", "recv", "recv_anysource"})


class IssueOrder:
    """Run a group's routed collectives and inner-backend calls in the order they were issued.

    ``name`` names the worker thread; ``routes`` is False for a group that routes nothing (every
    call then goes straight to the inner backend, as torch's own groups do).
    """

    __slots__ = ("worker", "_routes", "_running", "_after_inner")

    def __init__(self, name: str, routes: bool) -> None:
        self.worker = OrderedWorker(name)
        self._routes = routes
        self._running = threading.local()  # .active: this thread is inside a routed collective
        self._after_inner: Any = None  # CUDA event: the inner NCCL backend's latest call ran

    def in_routed_call(self) -> bool:
        """Return whether this thread is running a routed collective (its own calls go to the inner backend)."""
        return self.worker.in_worker_thread() or getattr(self._running, "active", False)

    def routed(self, job: Callable[[], list[torch.Tensor]], tensor: torch.Tensor) -> Any:
        """Run ``job``, a routed collective on ``tensor``'s device; return its Work (GPU: now; CPU: on the worker)."""
        if tensor.device.type != "cuda":
            return FutureWork(self.worker.submit(job))
        # Issuing is all the host does (the link's NCCL calls and the reductions are stream-ordered):
        # the caller's stream, not the host, waits for the result.
        stream = torch.cuda.current_stream(tensor.device)
        inner, self._after_inner = self._after_inner, None
        if inner is not None:
            stream.wait_event(inner)
        self._running.active = True
        try:
            outputs = job()
        finally:
            self._running.active = False
        return StreamWork(outputs, stream)

    def inner(self, call: Callable[..., Any], method: str, device: torch.device, args: tuple, kwargs: dict) -> Any:
        """Run ``call`` (the inner backend's ``method``) after the calls issued before it; return its Work."""
        if device.type == "cuda":
            work = call(*args, **kwargs)
            # in a capture the event would fork the captured stream, and routed calls run no more there
            if self._routes and not torch.cuda.is_current_stream_capturing():
                self._after_inner = _event_after(work, device)
            return work
        if not self._routes or self.in_routed_call() or self.worker.idle():
            return call(*args, **kwargs)  # nothing issued before it is still to run: gloo's own order
        if method in POINT_TO_POINT:
            self.flush()
            return call(*args, **kwargs)
        return FutureWork(self.worker.submit(partial(_inner_call_job, call, args, kwargs)).then(_raise_inner_error))

    def flush(self) -> None:
        """Wait on the host until the jobs queued so far ran (nothing to wait for inside a routed call)."""
        if not self.in_routed_call() and not self.worker.idle():
            self.worker.flush().wait()

    def close(self) -> None:
        """Finish the queued jobs and stop the worker."""
        self.worker.close()


def _event_after(work: Any, device: torch.device) -> Any:
    """Return a CUDA event that completes with NCCL ``work`` (None: a synchronous call); it holds none of its tensors.

    The work's ``wait`` orders the current stream after it: here a side stream of this call
    alone, so the caller's stream is not held back (an async broadcast still overlaps its compute).
    """
    if work is None:  # torch 2.11's NCCL returns no Work for a call it ran on the current stream
        return torch.cuda.current_stream(device).record_event()
    side = torch.cuda.Stream(device=device)
    with torch.cuda.stream(side):
        work.wait()
        return side.record_event()


def _inner_call_job(
    call: Callable[..., Any], args: tuple, kwargs: dict[str, Any]
) -> tuple[list[torch.Tensor], BaseException | None]:
    """Run an inner-backend call to its end on the worker; return (its outputs, None) or ([], its error).

    The error comes back as a value: it is the caller's (a bad argument, gloo's own failure), and a
    job that raised would fail every routed collective after it (see OrderedWorker).
    """
    try:
        work = call(*args, **kwargs)
        work.wait()
    except RuntimeError as error:
        return [], error
    try:
        return list(work.get_future().value()), None
    except RuntimeError:  # a Work with no future: done, nothing to hand on
        return [], None


def _raise_inner_error(done: torch.futures.Future) -> list[torch.Tensor]:
    outputs, error = done.wait()
    if error is not None:
        raise error
    return outputs
