"""torch.distributed point-to-point transport: gloo on CPU, NCCL on GPU.

gloo: every message is one ``isend``/``irecv`` (tag = the executor's tag), waited with a timeout.
NCCL: a round's messages go through one ``batch_isend_irecv`` (a NCCL group), which also keeps
the posting order NCCL matches by; ``wait`` orders the current CUDA stream after the transfer and
returns at once. A timeout there would make every round wait on the host (ProcessGroupNCCL spins
until the work completes); NCCL's own watchdog enforces the group's timeout instead, aborting the
communicator so that the next call raises.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from taccl_py.errors import TransportError
from taccl_py.runtime.transports.interface import Message, Pending, Transport

__all__ = ["SUPPORTED_BACKENDS", "TorchDistTransport", "WorkPending", "first_error_line"]

#: torch.distributed backends whose point-to-point operations this transport drives.
SUPPORTED_BACKENDS = ("gloo", "nccl")


class WorkPending(Pending):
    """A message in flight as a torch.distributed ``Work`` (gloo, NCCL, or a taccl group's inner backend).

    ``stream_ordered``: ``wait`` only orders the current CUDA stream after the work (NCCL) and
    leaves the deadline to the backend's watchdog, instead of waiting on the host up to ``timeout_s``.
    """

    __slots__ = ("work", "stream_ordered")

    def __init__(self, work: Any, stream_ordered: bool = False) -> None:
        self.work = work
        self.stream_ordered = stream_ordered

    def wait(self, timeout_s: float) -> None:
        try:
            if self.stream_ordered:
                self.work.wait()
                return
            completed = self.work.wait(datetime.timedelta(seconds=timeout_s))
        except RuntimeError as error:  # gloo and NCCL report peer failures and timeouts this way
            raise TransportError(first_error_line(error)) from error
        if completed is False:
            raise TransportError(f"not complete after {timeout_s:g} s")


def first_error_line(error: BaseException) -> str:
    """Return the first line of ``error``'s message (torch's are often pages of C++ context)."""
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _backend_for(spec: str, device: Any) -> str:
    """Return the backend serving ``device`` in a group's backend spec ("gloo", or "cpu:gloo,cuda:nccl").

    >>> _backend_for("cpu:gloo,cuda:nccl", None), _backend_for("cpu:gloo,cuda:nccl", "cuda:1")
    ('gloo', 'nccl')
    """
    if ":" in spec:
        by_device = dict(item.split(":", 1) for item in spec.split(","))
        kind = (
            torch.device(device).type
            if device is not None
            else ("cpu" if "cpu" in by_device else next(iter(by_device)))
        )
        backend = by_device.get(kind, "")
    else:
        backend = spec
    if backend not in SUPPORTED_BACKENDS:
        raise TransportError(
            f"process group backend {spec!r} has no point-to-point transport here; expected one of "
            f"{', '.join(SUPPORTED_BACKENDS)}"
        )
    return backend


class TorchDistTransport(Transport):
    """Send and receive with torch.distributed on ``group`` (None: the default group).

    Parameters
    ----------
    group : ProcessGroup, optional
        An initialised group whose backend is gloo (CPU tensors) or nccl (CUDA tensors).
    device : torch.device or str, optional
        Where the tensors live; default CPU for gloo and the current CUDA device for nccl.

    Raises
    ------
    TransportError
        torch.distributed is not initialised, or the group's backend is neither gloo nor nccl.
    """

    def __init__(self, group: Any = None, device: Any = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise TransportError(
                "torch.distributed is not initialised; call init_process_group first (or Communicator.from_env)"
            )
        backend = _backend_for(str(dist.get_backend(group)).lower(), device)
        self.group = group
        self.backend = backend
        self.name = f"torch-{backend}"
        self.independent_messages = backend == "gloo"
        self.graph_capturable = backend == "nccl"  # batch_isend_irecv and stream-ordered waits only
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        # p2p calls take global ranks on every torch version we support (group_dst is newer)
        self._global = [r if group is None else dist.get_global_rank(group, r) for r in range(self.world_size)]
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.device = torch.device(device)
        if backend == "nccl":
            # A batched p2p call as the group's first NCCL operation needs every rank in it, and a rank
            # with nothing to send in a round skips it: one collective first sets the communicator up.
            dist.all_reduce(torch.zeros(1, device=self.device), group=group)

    def post(self, sends: Sequence[Message], recvs: Sequence[Message]) -> tuple[Sequence[Pending], Sequence[Pending]]:
        """Issue a round's messages together; NCCL as one batch, gloo one call per message."""
        try:
            if self.backend == "nccl":
                return self._post_batched(sends, recvs)
            send_works = [dist.isend(m.tensor, self._global[m.peer], self.group, m.tag) for m in sends]
            recv_works = [dist.irecv(m.tensor, self._global[m.peer], self.group, m.tag) for m in recvs]
        except RuntimeError as error:
            raise TransportError(first_error_line(error)) from error
        return [WorkPending(w) for w in send_works], [WorkPending(w) for w in recv_works]

    def _post_batched(self, sends: Sequence[Message], recvs: Sequence[Message]) -> tuple[list[Pending], list[Pending]]:
        ops = [dist.P2POp(dist.isend, m.tensor, self._global[m.peer], self.group, m.tag) for m in sends]
        ops += [dist.P2POp(dist.irecv, m.tensor, self._global[m.peer], self.group, m.tag) for m in recvs]
        works = dist.batch_isend_irecv(ops) if ops else []
        if len(works) != len(ops):  # some torch versions return one work for the whole batch
            shared = WorkPending(works[-1], stream_ordered=True) if works else None
            return [shared] * len(sends), [shared] * len(recvs)
        pendings = [WorkPending(w, stream_ordered=True) for w in works]
        return pendings[: len(sends)], pendings[len(sends) :]
