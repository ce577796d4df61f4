"""An in-process transport: one thread per rank, messages copied when the receiver waits.

Useful to run and test algorithms without processes or sockets. Data moves as late as a real
transport may move it: the receiver copies straight from the sender's tensor when it waits, and
the sender's wait returns only after that copy. A plan that overwrites a send's source too early
therefore gets wrong results here, as it could on gloo or NCCL.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any

import torch

from taccl_py.errors import ArgumentError, TransportError
from taccl_py.runtime.transports.interface import Message, Pending, Transport

__all__ = ["LocalHub", "LocalTransport"]


class _LocalSend(Pending):
    __slots__ = ("tensor", "done", "hub", "peer")

    def __init__(self, hub: LocalHub, tensor: Any, peer: int) -> None:
        self.hub, self.tensor, self.peer = hub, tensor, peer
        self.done = threading.Event()

    def wait(self, timeout_s: float) -> None:
        if not self.done.wait(timeout_s):
            raise TransportError(self.hub.failure or f"send to rank {self.peer} not received after {timeout_s:g} s")


class _LocalRecv(Pending):
    __slots__ = ("tensor", "hub", "key")

    def __init__(self, hub: LocalHub, tensor: Any, key: tuple[int, int, int]) -> None:
        self.hub, self.tensor, self.key = hub, tensor, key

    def wait(self, timeout_s: float) -> None:
        self.hub.take(self.key, self, timeout_s)


class LocalHub:
    """The shared mailbox of ``world_size`` in-process ranks; ``transport(rank)`` gives one end.

    Examples
    --------
    >>> hub = LocalHub(2)
    >>> hub.transport(1).rank
    1
    """

    def __init__(self, world_size: int) -> None:
        if world_size < 1:
            raise ArgumentError(None, "world_size", f"{world_size}", "at least 1 rank")
        self.world_size = world_size
        self.failure: str | None = None
        self._cond = threading.Condition()
        self._sends: dict[tuple[int, int, int], deque[_LocalSend]] = defaultdict(deque)
        self._recv_order: dict[tuple[int, int, int], deque[_LocalRecv]] = defaultdict(deque)

    def transport(self, rank: int, device: Any = "cpu") -> LocalTransport:
        """Return the transport of ``rank``."""
        return LocalTransport(self, rank, device)

    def fail(self, reason: str) -> None:
        """Mark the hub failed (a rank died): every wait raises TransportError from now on."""
        with self._cond:
            self.failure = self.failure or reason
            self._cond.notify_all()

    def add(
        self, sends: list[tuple[tuple[int, int, int], _LocalSend]], recvs: list[tuple[tuple[int, int, int], _LocalRecv]]
    ) -> None:
        with self._cond:
            for key, send in sends:
                self._sends[key].append(send)
            for key, recv in recvs:
                self._recv_order[key].append(recv)
            self._cond.notify_all()

    def take(self, key: tuple[int, int, int], recv: _LocalRecv, timeout_s: float) -> None:
        """Copy the send matching ``recv`` (the k-th send for the k-th receive on ``key``) into it.

        The copy happens under the hub's lock, so copies are atomic with respect to each other:
        a rank that already overwrote a source it was still sending from is always caught.
        """
        with self._cond:
            ready = self._cond.wait_for(
                lambda: self.failure is not None or (self._recv_order[key][0] is recv and bool(self._sends[key])),
                timeout_s,
            )
            if self.failure is not None:
                raise TransportError(self.failure)
            if not ready:
                raise TransportError(f"nothing from rank {key[0]} after {timeout_s:g} s")
            self._recv_order[key].popleft()
            send = self._sends[key].popleft()
            if send.tensor.numel() != recv.tensor.numel() or send.tensor.dtype != recv.tensor.dtype:
                self.failure = (
                    f"rank {key[0]} sent {send.tensor.numel()} {send.tensor.dtype} elements, "
                    f"rank {key[1]} expected {recv.tensor.numel()} {recv.tensor.dtype}"
                )
                self._cond.notify_all()
                raise TransportError(self.failure)
            recv.tensor.copy_(send.tensor)
            send.done.set()
            self._cond.notify_all()


class LocalTransport(Transport):
    """One rank's end of a :class:`LocalHub`."""

    def __init__(self, hub: LocalHub, rank: int, device: Any = "cpu") -> None:
        if not 0 <= rank < hub.world_size:
            raise ArgumentError(None, "rank", f"{rank} outside 0..{hub.world_size - 1}", "a rank of the hub")
        self.hub, self.rank, self.world_size = hub, rank, hub.world_size
        self.device = torch.device(device)
        self.name = "local"
        self.independent_messages = True

    def post(self, sends: Sequence[Message], recvs: Sequence[Message]) -> tuple[Sequence[Pending], Sequence[Pending]]:
        """Register a round's messages; data moves when the receivers wait."""
        if self.hub.failure is not None:
            raise TransportError(self.hub.failure)
        send_items = [((self.rank, m.peer, m.tag), _LocalSend(self.hub, m.tensor, m.peer)) for m in sends]
        recv_items = [
            ((m.peer, self.rank, m.tag), _LocalRecv(self.hub, m.tensor, (m.peer, self.rank, m.tag))) for m in recvs
        ]
        self.hub.add(send_items, recv_items)
        return [s for _k, s in send_items], [r for _k, r in recv_items]
