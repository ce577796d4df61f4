"""The pieces under the ``taccl`` process group: its Work, its message transport, its backends.

:class:`FutureWork` is what a call run on the group's worker thread returns (CPU), :class:`StreamWork`
what a routed collective on a GPU returns; :class:`BackendTransport` moves the
Communicator's messages over a gloo or NCCL backend object that belongs to the ``taccl`` group
alone (the torch.distributed registry does not know it, so ``dist.isend(group=...)`` cannot
reach it); :func:`make_backend` builds such backends.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from taccl_py.errors import TransportError
from taccl_py.runtime.transports.interface import Message, Pending, Transport
from taccl_py.runtime.transports.torch_dist import WorkPending

__all__ = ["FutureWork", "StreamWork", "BackendTransport", "make_backend"]


class FutureWork(dist.Work):
    """The Work of a call that runs on the group's worker thread (CPU): ``wait`` blocks the host until it ran.

    (The Work of ``_create_work_from_future`` returns from ``wait`` even when its future holds an
    error, so a failed collective would pass silently.) The Communicator's per-message timeout,
    the group's, bounds every collective; ``wait(timeout)`` can give up sooner, and the timeout
    is then the work's :meth:`exception` too, as ProcessGroupNCCL reports one.
    """

    def __init__(self, future: torch.futures.Future) -> None:
        super().__init__()
        self._future = future
        self._timed_out: BaseException | None = None
        self._done = threading.Event()
        future.add_done_callback(lambda _: self._done.set())

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Return True once the call finished; raise its error if it failed (a RuntimeError through c10d).

        With ``timeout``, raise TransportError when the call has not finished by then (it keeps
        running: the group's own timeout ends it).
        """
        limit_s = None if timeout is None or timeout.total_seconds() <= 0 else timeout.total_seconds()
        if not self._done.wait(limit_s):
            self._timed_out = TransportError(f"a collective did not finish within {limit_s:g} s (Work.wait timeout)")
            raise self._timed_out
        self._future.wait()
        return True

    def get_future(self) -> torch.futures.Future:
        """Return the future of the call's output tensors."""
        return self._future

    def is_completed(self) -> bool:
        """Return whether the call finished (successfully or not)."""
        return self._future.done()

    def is_success(self) -> bool:
        """Return whether the call finished without error."""
        return self.is_completed() and self.exception() is None

    def exception(self) -> BaseException | None:
        """Return the call's error, the timeout of a ``wait`` that gave up, or None."""
        if self._future.done():
            try:
                self._future.wait()
            except RuntimeError as error:
                return error
        return self._timed_out


class StreamWork(dist.Work):
    """The Work of a collective issued on a CUDA stream (the group's internal one), as ProcessGroupNCCL's.

    The host never waits: ``wait`` orders the waiter's current stream after the collective (an
    event recorded on ``stream`` at issue); ``is_completed`` is True once the GPU has run it; the
    future holds the outputs and is CUDA-aware (its waiters' streams wait too). Errors surface when
    the call is issued; a collective stuck on the device is ended by the link's NCCL watchdog,
    whose error the group's next call raises.
    """

    def __init__(self, outputs: Any, stream: Any) -> None:
        super().__init__()
        self._stream = stream
        self._event = stream.record_event()
        self._future = torch.futures.Future(devices=[stream.device])
        with torch.cuda.stream(stream):  # a CUDA-aware future records the current stream at set_result
            self._future.set_result(outputs)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Order the current stream after the collective and return True at once (``timeout``: NCCL's watchdog's)."""
        torch.cuda.current_stream(self._stream.device).wait_event(self._event)
        return True

    def get_future(self) -> torch.futures.Future:
        """Return the CUDA-aware future of the collective's output tensors."""
        return self._future

    def is_completed(self) -> bool:
        """Return whether the GPU has run the collective."""
        return self._event.query()

    def is_success(self) -> bool:
        """Return whether the GPU has run the collective (errors were raised when it was issued)."""
        return self.is_completed()

    def exception(self) -> BaseException | None:
        """Return None: a routed collective on a GPU fails when it is issued, or through NCCL's watchdog."""
        return None


class BackendTransport(Transport):
    """Send and receive on a c10d backend object (gloo or NCCL) that no process group registry knows.

    Parameters
    ----------
    backend : torch._C._distributed_c10d.Backend
        A ``ProcessGroupGloo`` or ``ProcessGroupNCCL`` of the group; peers are group ranks.
    device : torch.device
        Where the tensors live.

    Notes
    -----
    NCCL matches messages by posting order, so a round's messages go out inside one coalesced
    group (``_start_coalescing``/``_end_coalescing``), as ``batch_isend_irecv`` does.
    """

    def __init__(self, backend: Any, device: torch.device) -> None:
        self._backend = backend
        self.rank = int(backend.rank())
        self.world_size = int(backend.size())
        self.device = torch.device(device)
        self.name = f"taccl-{backend.name().lower()}"
        self._coalesce = self.device.type == "cuda"
        # gloo matches and progresses each message on its own, so the executor may post early
        self.independent_messages = not self._coalesce

    def warm_up(self) -> None:
        """Run one collective on the backend: NCCL's first batched p2p call needs every rank, a round may not.

        Every rank of the group must call it; the taccl group does, for its NCCL link, at its first routed GPU call.
        """
        try:
            self._backend.allreduce([torch.zeros(1, device=self.device)]).wait()
        except RuntimeError as error:
            raise TransportError(f"{self.name}: warm-up all-reduce failed: {error}") from error

    def post(self, sends: Sequence[Message], recvs: Sequence[Message]) -> tuple[Sequence[Pending], Sequence[Pending]]:
        """Issue a round's sends and receives without blocking; return their Pending, in order."""
        try:
            if self._coalesce and (sends or recvs):
                # a Backend's coalescing calls take no device (a ProcessGroup's do): torch 2.11 and 2.13 alike
                self._backend._start_coalescing()
                for m in sends:
                    self._backend.send([m.tensor], m.peer, m.tag)
                for m in recvs:
                    self._backend.recv([m.tensor], m.peer, m.tag)
                shared = WorkPending(self._backend._end_coalescing(), stream_ordered=True)  # NCCL: no host wait
                return [shared] * len(sends), [shared] * len(recvs)
            send_works = [self._backend.send([m.tensor], m.peer, m.tag) for m in sends]
            recv_works = [self._backend.recv([m.tensor], m.peer, m.tag) for m in recvs]
        except RuntimeError as error:
            raise TransportError(f"{self.name}: {error}") from error
        return [WorkPending(w) for w in send_works], [WorkPending(w) for w in recv_works]

    def close(self) -> None:
        """Shut the backend down."""
        self._backend.shutdown()


def make_backend(kind: str, store: Any, rank: int, world_size: int, timeout: datetime.timedelta) -> tuple[Any, Any]:
    """Return (BackendType, backend) of a fresh gloo or NCCL backend on ``store``."""
    if kind == "gloo":
        return dist.ProcessGroup.BackendType.GLOO, dist.ProcessGroupGloo(store, rank, world_size, timeout)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroup.BackendType.NCCL, dist.ProcessGroupNCCL(store, rank, world_size, options)
