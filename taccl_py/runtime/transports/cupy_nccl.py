"""CuPy NCCL transport: ``cupy.cuda.nccl.NcclCommunicator`` send/recv inside groupStart/groupEnd.

The NCCL unique id is made on group rank 0 and handed to the others through a torch.distributed
``Store`` (the one given, else the default group's) or, when no store can be had,
``broadcast_object_list`` on the group. CuPy has returned the id
as a tuple of signed byte values and, in some builds, as ``bytes``; it travels as bytes and is
given back in the form the local CuPy accepts. Messages run on the current torch CUDA stream, so
the executor's reductions on that stream are ordered after them without host waits; a
:class:`~taccl_py.runtime.transports.watchdog.Watchdog` holds each round to the caller's timeout (a CUDA event
queried from its thread) and aborts the communicator when one is late, so the next call raises.

Posting and aborting share one lock: NCCL lets another thread abort a communicator while a call is
inside it only for non-blocking communicators (``ncclCommInitRankConfig`` with ``blocking = 0``,
which CuPy does not expose), so the watchdog waits for the groupStart…groupEnd in flight to
return. A blocking groupEnd normally returns once the round is enqueued, but it can block on a
dead peer (the first message to a peer sets up the connection with it) or on a CUDA launch queue
full behind kernels that wait for that peer, and only an abort frees either. So the watchdog waits
at most ``ABORT_LOCK_WAIT_S`` for the lock, then aborts anyway with an error line: a possible
use-after-free in a process that is already failing, against a certain hang.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any

from taccl_py.errors import CUDA_INSTALL_HINT, TransportError
from taccl_py.runtime.transports.interface import Message, Pending, Transport
from taccl_py.runtime.transports.watchdog import Watchdog

__all__ = [
    "ABORT_LOCK_WAIT_S",
    "CupyNcclTransport",
    "unique_id_to_bytes",
    "unique_id_candidates",
    "NCCL_UNIQUE_ID_BYTES",
]

logger = logging.getLogger(__name__)

#: Longest wait (s) of an abort for the post in flight to leave groupEnd: an enqueue takes
#: microseconds, a first connection with a live peer well under this; longer means a stuck peer.
ABORT_LOCK_WAIT_S = 10.0
#: Size of ncclUniqueId (nccl.h: NCCL_UNIQUE_ID_BYTES).
NCCL_UNIQUE_ID_BYTES = 128
_DTYPE_NAMES = MappingProxyType(
    {
        "torch.float32": "NCCL_FLOAT32",
        "torch.float16": "NCCL_FLOAT16",
        "torch.bfloat16": "NCCL_BFLOAT16",
        "torch.float64": "NCCL_FLOAT64",
        "torch.int32": "NCCL_INT32",
        "torch.int64": "NCCL_INT64",
    }
)


def unique_id_to_bytes(uid: Any) -> bytes:
    """Return a NCCL unique id (CuPy's tuple of signed bytes, or bytes) as bytes.

    >>> unique_id_to_bytes((1, -1, 127))
    b'\\x01\\xff\\x7f'
    >>> unique_id_to_bytes(b"ab")
    b'ab'
    """
    if isinstance(uid, (bytes, bytearray)):
        return bytes(uid)
    return bytes(int(value) & 0xFF for value in uid)


def unique_id_candidates(raw: bytes) -> tuple[Any, ...]:
    """Return the forms to try when handing ``raw`` to ``NcclCommunicator``: signed tuple, then bytes.

    >>> unique_id_candidates(b"\\x01\\xff")[0]
    (1, -1)
    """
    signed = tuple(value - 256 if value > 127 else value for value in raw)
    return signed, bytes(raw)


class _StreamOrdered(Pending):
    """A round queued on the CUDA stream: later work on that stream already waits for it.

    ``wait`` does not block the host: the first call hands the round's deadline to the watchdog,
    every call raises if a round already missed one.
    """

    __slots__ = ("_watch",)

    def __init__(self, watch: Callable[[float], None]) -> None:
        self._watch = watch

    def wait(self, timeout_s: float) -> None:
        self._watch(timeout_s)


def _import_nccl() -> Any:
    try:
        from cupy.cuda import nccl
    except ImportError as error:
        raise TransportError(f"CuPy with NCCL is not available ({error}); {CUDA_INSTALL_HINT}") from error
    return nccl


def _group_store(store: Any) -> Any:
    """Return ``store`` or the default group's store (None when this torch does not expose it)."""
    if store is not None:
        return store
    import torch.distributed as dist

    default_store = getattr(dist.distributed_c10d, "_get_default_store", None)
    try:
        return default_store() if default_store is not None else None
    except (RuntimeError, ValueError):  # no default group, or a store-less init
        return None


def _exchange_id(nccl: Any, rank: int, group: Any, store: Any, key: str) -> bytes:
    """Return the NCCL unique id made on group rank 0, through the store (or a broadcast without one).

    Every rank counts the transports it built for this group in the store, so the n-th transport
    of every rank reads the n-th id: ranks build transports for a group in the same order.
    """
    import torch.distributed as dist

    raw = unique_id_to_bytes(nccl.get_unique_id()) if rank == 0 else None
    store = _group_store(store)
    if store is None:
        box = [raw]
        dist.broadcast_object_list(box, src=0 if group is None else dist.get_global_rank(group, 0), group=group)
        return bytes(box[0])
    members = "-".join(str(r) for r in dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    generation = store.add(f"{key}/{members}/built-by-{rank}", 1)
    slot = f"{key}/{members}/{generation}"
    if rank == 0:
        store.set(slot, raw)
    return bytes(store.get(slot))


class CupyNcclTransport(Transport):
    """Point-to-point over a CuPy ``NcclCommunicator`` spanning ``group``'s ranks.

    Parameters
    ----------
    group : ProcessGroup, optional
        The torch.distributed group whose ranks form the communicator (default: the world).
    device : int, optional
        CUDA device index (default: torch's current device).
    store : torch.distributed.Store, optional
        Where rank 0 publishes the NCCL unique id (default: the default group's store).
    key : str
        Prefix of the store keys used for the exchange.

    Raises
    ------
    TransportError
        CuPy, NCCL or CUDA is missing, or torch.distributed is not initialised.
    """

    def __init__(
        self, group: Any = None, device: int | None = None, store: Any = None, key: str = "taccl_py/cupy_nccl/unique_id"
    ) -> None:
        import torch
        import torch.distributed as dist

        nccl = _import_nccl()
        if not torch.cuda.is_available():
            raise TransportError("CUDA is not available; the CuPy NCCL transport needs a GPU")
        if not dist.is_initialized():
            raise TransportError("torch.distributed is not initialised; it carries the NCCL unique id")
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        index = torch.cuda.current_device() if device is None else int(device)
        self.device = torch.device("cuda", index)
        self.name = "cupy-nccl"
        self._nccl = nccl
        raw = _exchange_id(nccl, self.rank, group, store, key)
        self._comm = self._communicator(nccl, raw, index)
        self._rounds = 0
        self._aborted = False
        self._post_lock = threading.Lock()  # one groupStart…groupEnd, or the abort, at a time
        self._watchdog = Watchdog(self._abort, name=f"taccl-cupy-nccl-{self.rank}")

    def _communicator(self, nccl: Any, raw: bytes, index: int) -> Any:
        import cupy

        last: Exception | None = None
        with cupy.cuda.Device(index):
            for candidate in unique_id_candidates(raw):
                try:
                    return nccl.NcclCommunicator(self.world_size, candidate, self.rank)
                except (TypeError, OverflowError, ValueError) as error:  # the other id form
                    last = error
        raise TransportError(f"NcclCommunicator rejected the unique id: {last}")

    def _dtype(self, tensor: Any) -> int:
        name = _DTYPE_NAMES.get(str(tensor.dtype))
        code = getattr(self._nccl, name, None) if name else None
        if code is None:
            raise TransportError(f"NCCL in this CuPy has no type for {tensor.dtype}")
        return code

    def post(self, sends: Sequence[Message], recvs: Sequence[Message]) -> tuple[Sequence[Pending], Sequence[Pending]]:
        """Queue a round's messages as one NCCL group on the current torch CUDA stream."""
        import cupy
        import torch

        self._watchdog.check()
        stream = torch.cuda.current_stream(self.device).cuda_stream
        nccl = self._nccl
        with self._post_lock:
            self._watchdog.check()  # the watchdog may have aborted while this call waited for the lock
            if self._aborted:
                raise TransportError(f"rank {self.rank}: the NCCL communicator was aborted")
            try:
                nccl.groupStart()
                try:
                    for m in sends:
                        self._comm.send(m.tensor.data_ptr(), m.tensor.numel(), self._dtype(m.tensor), m.peer, stream)
                    for m in recvs:
                        self._comm.recv(m.tensor.data_ptr(), m.tensor.numel(), self._dtype(m.tensor), m.peer, stream)
                finally:
                    nccl.groupEnd()
            except nccl.NcclError as error:
                raise TransportError(f"NCCL: {error}") from error
        finished = cupy.cuda.Event(disable_timing=True)
        finished.record(cupy.cuda.ExternalStream(stream))
        self._rounds += 1
        what = f"rank {self.rank}: NCCL round {self._rounds} ({len(sends)} sends, {len(recvs)} receives)"
        done = _StreamOrdered(self._deadline(finished, what))
        return [done] * len(sends), [done] * len(recvs)

    def _deadline(self, finished: Any, what: str) -> Callable[[float], None]:
        """Return the round's wait: watch ``finished`` (a CUDA event) from the first call on."""
        watched = False

        def wait(timeout_s: float) -> None:
            nonlocal watched
            if not watched:
                watched = True
                self._watchdog.watch(lambda: finished.done, timeout_s, what)
            self._watchdog.check()

        return wait

    def _abort(self) -> None:
        """End the communicator's stuck kernels (the watchdog's thread calls this), between posts.

        Waits up to ``ABORT_LOCK_WAIT_S`` for a post in flight (see the module notes), then aborts anyway.
        """
        locked = self._post_lock.acquire(timeout=ABORT_LOCK_WAIT_S)
        if not locked:
            logger.error(
                "rank %d: a post has been inside NCCL's groupStart/groupEnd for %g s; aborting the "
                "communicator under it, the only way to free a groupEnd stuck on a failed peer",
                self.rank,
                ABORT_LOCK_WAIT_S,
            )
        try:
            comm = self._comm
            if comm is not None and not self._aborted:
                self._aborted = True
                comm.abort()
        finally:
            if locked:
                self._post_lock.release()

    def close(self) -> None:
        """Stop the watchdog and destroy the NCCL communicator."""
        self._watchdog.close()
        comm, self._comm = self._comm, None
        if comm is not None and not self._aborted:  # an aborted communicator is freed already
            comm.destroy()
