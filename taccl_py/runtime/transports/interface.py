"""The small interface an Executor talks to: post one round's messages together, wait for each.

A transport moves whole tensors between the ranks of one group. ``post`` issues every send and
receive of a round at once, non-blocking (NCCL: inside one group call), and returns one
:class:`Pending` per message; ``Pending.wait(timeout_s)`` returns when that message completed
(for a send: its source may be overwritten) and raises :class:`~taccl_py.errors.TransportError`
when the peer failed or the wait timed out. The executor adds which rank, round and step it was.

Matching: the k-th send from rank a to rank b with tag t meets the k-th receive on b from a with
tag t, in posting order. Transports without tags (NCCL) match in posting order per peer; the
executor posts both ends of every message in the same round and the same order, so both work.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Message", "Pending", "Transport", "DEFAULT_TIMEOUT_S", "TAG_BASE"]

#: Longest wait for one message, seconds; a peer silent for this long is treated as failed.
DEFAULT_TIMEOUT_S = 300.0
#: First point-to-point tag the executor uses (tag = TAG_BASE + channel), away from tag 0 that
#: user code and torch.distributed helpers use by default.
TAG_BASE = 4096


@dataclass(frozen=True)
class Message:
    """One point-to-point message: ``tensor`` (contiguous) to or from ``peer`` (group rank) with ``tag``."""

    peer: int
    tag: int
    tensor: Any


class Pending(ABC):
    """A message in flight."""

    @abstractmethod
    def wait(self, timeout_s: float) -> None:
        """Return when the message completed; raise TransportError on failure or after ``timeout_s``."""


class Transport(ABC):
    """Point-to-point messaging among ``world_size`` ranks; this end is ``rank``.

    Subclasses set ``rank``, ``world_size``, ``device`` (the torch device their tensors live on)
    and ``name`` in ``__init__``. ``independent_messages`` is True when every message is matched
    and progressed on its own (gloo), so a receive may be posted before the round it belongs to;
    False when a round's messages form one group that completes together (NCCL).
    ``graph_capturable`` is True when a whole run's posts and waits can be captured into a CUDA
    graph (no host wait, no host-side polling; see :mod:`taccl_py.runtime.executor.graphs`).
    """

    rank: int
    world_size: int
    device: Any
    name: str
    independent_messages: bool = False
    graph_capturable: bool = False

    @abstractmethod
    def post(self, sends: Sequence[Message], recvs: Sequence[Message]) -> tuple[Sequence[Pending], Sequence[Pending]]:
        """Issue ``sends`` and ``recvs`` together without blocking; return their Pending, in order."""

    def close(self) -> None:
        """Release what the transport holds (communicators, streams); the default holds nothing."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size}, device={self.device})"
