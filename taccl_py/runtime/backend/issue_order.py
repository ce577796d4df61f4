"""One issue order per ``taccl`` group: routed collectives and the inner backend's calls run as they were called.

ProcessGroupNCCL runs a group's calls in the order they were issued, on its stream, so
``all_reduce(t, async_op=True); broadcast(t)`` broadcasts the reduced tensor. The ``taccl`` group
runs some calls itself (routed: a Communicator's algorithm) and hands the others to an inner
gloo/NCCL backend (delegated); :class:`IssueOrder` keeps the two in one order:

- GPU: the group has one internal CUDA stream per device, as ProcessGroupNCCL does. A routed
  collective is issued on the calling thread: the internal stream waits (an event) for the
  caller's current stream, the call runs on the internal stream, its tensors are marked used there
  (``record_stream``, so the caching allocator keeps their memory until it ran), and it returns a
  :class:`~taccl_py.runtime.backend.work.StreamWork` whose ``wait`` makes the waiter's stream
  wait; the caller's stream never waits at issue, so compute issued after an async collective
  overlaps it. A delegated call goes to the inner NCCL backend at once, issued with the internal
  stream current after it waited for the caller's, so NCCL's stream follows the routed calls
  issued before it; the next routed call waits for the inner backend's latest call (an event,
  which holds none of its tensors). A synchronous NCCL call that ran on the internal stream and
  returned no Work makes the caller's stream wait for it, as it would have waited on its own
  stream. ``flush`` (``barrier``) makes the caller's stream wait for the internal one. While the
  thread captures a CUDA graph, calls go to the inner backend on the caller's stream, as before
  (``torch.cuda.graph`` synchronizes the device before capturing, so nothing routed is pending).
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
from collections.abc import Callable, Sequence
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

    __slots__ = ("worker", "_routes", "_running", "_after_inner", "_streams")

    def __init__(self, name: str, routes: bool) -> None:
        self.worker = OrderedWorker(name)
        self._routes = routes
        self._running = threading.local()  # .active: this thread is inside a routed collective
        self._after_inner: Any = None  # CUDA event: the inner NCCL backend's latest call ran
        self._streams: dict[int, Any] = {}  # device index -> the group's internal CUDA stream

    def in_routed_call(self) -> bool:
        """Return whether this thread is running a routed collective (its own calls go to the inner backend)."""
        return self.worker.in_worker_thread() or getattr(self._running, "active", False)

    def internal_stream(self, device: torch.device) -> Any:
        """Return the group's internal CUDA stream on ``device``, made on first use."""
        index = torch.device(device).index
        stream = self._streams.get(index)
        if stream is None:
            stream = self._streams.setdefault(index, torch.cuda.Stream(device=device))
        return stream

    def routed(self, job: Callable[[], Any], tensors: Sequence[torch.Tensor]) -> Any:
        """Run ``job``, a routed collective on ``tensors`` (inputs and outputs); return its Work.

        CPU: a job on the worker. GPU: issued now on the internal stream, after the caller's
        stream; the caller's stream does not wait (the Work's ``wait`` makes it).
        """
        device = tensors[0].device
        if device.type != "cuda":
            return FutureWork(self.worker.submit(job))
        internal = self.internal_stream(device)
        internal.wait_stream(torch.cuda.current_stream(device))
        inner, self._after_inner = self._after_inner, None
        if inner is not None:
            internal.wait_event(inner)
        for tensor in tensors:  # their memory is not handed out again before the internal stream used it
            tensor.record_stream(internal)
        self._running.active = True
        try:
            # Issuing is all the host does: the link's NCCL calls and the reductions are stream-ordered.
            with torch.cuda.stream(internal):
                outputs = job()
        finally:
            self._running.active = False
        return StreamWork(outputs, internal)

    def joined(self, works: Sequence[Any], outputs: list[torch.Tensor]) -> Any:
        """Return one Work for ``works`` (CUDA: routed or delegated) that completes when all of them have.

        The internal stream waits for each; the caller's stream only when the joined Work is waited on.
        """
        device = outputs[0].device
        if torch.cuda.is_current_stream_capturing():  # the captured stream alone: as the calls ran
            stream = torch.cuda.current_stream(device)
        else:
            stream = self.internal_stream(device)
        with torch.cuda.stream(stream):
            for work in works:
                if work is not None:  # None: a synchronous NCCL call, already on the stream it ran on
                    work.wait()
        return StreamWork(outputs, stream)

    def inner(self, call: Callable[..., Any], method: str, device: torch.device, args: tuple, kwargs: dict) -> Any:
        """Run ``call`` (the inner backend's ``method``) after the calls issued before it; return its Work."""
        if device.type == "cuda":
            return self._inner_on_gpu(call, device, args, kwargs)
        if not self._routes or self.in_routed_call() or self.worker.idle():
            return call(*args, **kwargs)  # nothing issued before it is still to run: gloo's own order
        if method in POINT_TO_POINT:
            self.flush()
            return call(*args, **kwargs)
        return FutureWork(self.worker.submit(partial(_inner_call_job, call, args, kwargs)).then(_raise_inner_error))

    def _inner_on_gpu(self, call: Callable[..., Any], device: torch.device, args: tuple, kwargs: dict) -> Any:
        """Run an inner NCCL call after the routed calls on the internal stream; return its Work."""
        # in a capture an event would fork the captured stream, and routed calls run no more there;
        # inside a routed call the internal stream is already current
        if not self._routes or self.in_routed_call() or torch.cuda.is_current_stream_capturing():
            work = call(*args, **kwargs)
            if self._routes and not torch.cuda.is_current_stream_capturing():
                self._after_inner = _event_after(work, device)
            return work
        caller = torch.cuda.current_stream(device)
        internal = self.internal_stream(device)
        internal.wait_stream(caller)
        with torch.cuda.stream(internal):  # NCCL's stream waits for the current one: the internal stream
            work = call(*args, **kwargs)
            self._after_inner = _event_after(work, device)
        if work is None:  # ran synchronously on the internal stream: the caller's stream follows it
            caller.wait_stream(internal)
        return work

    def flush(self) -> None:
        """Wait on the host until the jobs queued so far ran; order the current CUDA streams after the internal ones."""
        if self.in_routed_call():
            return  # nothing to wait for inside a routed call
        for stream in list(self._streams.values()):
            torch.cuda.current_stream(stream.device).wait_stream(stream)
        if not self.worker.idle():
            self.worker.flush().wait()

    def close(self) -> None:
        """Finish the queued jobs and stop the worker."""
        self.worker.close()


def _event_after(work: Any, device: torch.device) -> Any:
    """Return a CUDA event that completes with NCCL ``work`` (None: a synchronous call); it holds none of its tensors.

    The work's ``wait`` orders the current stream after it: here a side stream of this call
    alone, so neither the caller's stream nor the internal one is held back (an async broadcast
    still overlaps compute and the routed calls issued after it on other ranks' request).
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
