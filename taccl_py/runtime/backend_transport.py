"""The pieces under the ``taccl`` process group: its Work, its message transport, its backends.

:class:`FutureWork` is what a routed collective returns; :class:`BackendTransport` moves the
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
from taccl_py.runtime.ordered_worker import wait_for_stream
from taccl_py.runtime.transport import Message, Pending, Transport
from taccl_py.runtime.transports.torch_dist import WorkPending

__all__ = ["FutureWork", "BackendTransport", "make_backend"]


class FutureWork(dist.Work):
    """The Work of a routed collective: ``wait`` raises when the collective failed.

    (The Work of ``_create_work_from_future`` returns from ``wait`` even when its future holds an
    error, so a failed collective would pass silently.) The Communicator's per-message timeout,
    the group's, bounds every collective; ``wait(timeout)`` can give up sooner. ``stream`` is the
    CUDA stream the collective was queued on (see :func:`~taccl_py.runtime.ordered_worker.caller_stream`):
    ``wait`` orders the waiter's current stream after it, as NCCL's Work does.
    """

    def __init__(self, future: torch.futures.Future, stream: Any = None) -> None:
        super().__init__()
        self._future = future
        self._stream = stream
        self._done = threading.Event()
        future.add_done_callback(lambda _: self._done.set())

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Return True once the collective finished; raise its error if it failed (a RuntimeError through c10d).

        With ``timeout``, raise TransportError when the collective has not finished by then (it
        keeps running: the group's own timeout ends it).
        """
        limit_s = None if timeout is None or timeout.total_seconds() <= 0 else timeout.total_seconds()
        if not self._done.wait(limit_s):
            raise TransportError(f"a routed collective did not finish within {limit_s:g} s (Work.wait timeout)")
        self._future.wait()
        wait_for_stream(self._stream)
        return True

    def get_future(self) -> torch.futures.Future:
        """Return the future of the collective's output tensors."""
        return self._future

    def is_completed(self) -> bool:
        """Return whether the collective finished (successfully or not)."""
        return self._future.done()


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

        Every rank of the group must call it; the taccl group does, for its NCCL link, as it is made.
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
