"""The ``taccl`` torch.distributed backend: collectives by taccl_py algorithms, the rest by gloo/NCCL.

After :func:`register_backend`, ``dist.init_process_group("taccl")`` (and ``new_group`` under it)
makes a :class:`TacclProcessGroup`. It routes ``all_reduce``, ``all_gather`` /
``all_gather_single`` and ``reduce_scatter`` / ``reduce_scatter_single`` through a
:class:`~taccl_py.runtime.communicator.Communicator` whenever the library holds an algorithm for
the call's collective, size and world size, and hands every other call (broadcast, barrier,
send/recv, all_to_all, the reductions the Communicator lacks, calls with no fitting algorithm) to an
inner gloo backend (CPU tensors) or NCCL backend (CUDA tensors). DDP and FSDP2 use it unchanged::

    from taccl_py.runtime.backend import register_backend
    register_backend(library="ndv2")
    dist.init_process_group("taccl")

Threads and ordering: a routed collective is queued on the group's
:class:`~taccl_py.runtime.ordered_worker.OrderedWorker` and returns a Work at once, so DDP's
bucket all-reduces overlap backward. Its messages travel on a second backend of the same kind
(its own store prefix and connections), used by that worker thread alone, so they never pair up
with the inner backend's collectives or with user send/recv. ``barrier`` waits for the routed
collectives queued before it. As with gloo, wait on a Work before touching its tensors.
"""

from __future__ import annotations

import datetime
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from taccl_py.collectives import Collective
from taccl_py.errors import ArgumentError, TransportError
from taccl_py.runtime.communicator import Communicator
from taccl_py.runtime.executor import SUPPORTED_DTYPES
from taccl_py.runtime.ordered_worker import OrderedWorker
from taccl_py.runtime.selection import collect_algorithms, collective_size_bytes
from taccl_py.runtime.transport import Message, Pending, Transport

__all__ = ["BACKEND_NAME", "TacclProcessGroup", "BackendTransport", "register_backend"]

logger = logging.getLogger(__name__)

#: The name ``init_process_group`` takes.
BACKEND_NAME = "taccl"
_DEVICES = ["cpu", "cuda"]
_SOURCE = "taccl backend"
# torch ReduceOp -> Communicator op; others (PRODUCT, PREMUL_SUM, bitwise) go to the inner backend
_OPS = (("SUM", "sum"), ("AVG", "avg"), ("MAX", "max"), ("MIN", "min"))


class _WorkPending(Pending):
    __slots__ = ("_work",)

    def __init__(self, work: Any) -> None:
        self._work = work

    def wait(self, timeout_s: float) -> None:
        try:
            done = self._work.wait(datetime.timedelta(seconds=timeout_s))
        except RuntimeError as error:  # gloo and NCCL report dead peers and timeouts this way
            raise TransportError(str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__) from error
        if done is False:
            raise TransportError(f"not complete after {timeout_s:g} s")


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

    def post(self, sends: Sequence[Message], recvs: Sequence[Message]) -> tuple[Sequence[Pending], Sequence[Pending]]:
        """Issue a round's sends and receives without blocking; return their Pending, in order."""
        try:
            if self._coalesce and (sends or recvs):
                self._backend._start_coalescing(self.device)
                for m in sends:
                    self._backend.send([m.tensor], m.peer, m.tag)
                for m in recvs:
                    self._backend.recv([m.tensor], m.peer, m.tag)
                shared = _WorkPending(self._backend._end_coalescing(self.device))
                return [shared] * len(sends), [shared] * len(recvs)
            send_works = [self._backend.send([m.tensor], m.peer, m.tag) for m in sends]
            recv_works = [self._backend.recv([m.tensor], m.peer, m.tag) for m in recvs]
        except RuntimeError as error:
            raise TransportError(f"{self.name}: {error}") from error
        return [_WorkPending(w) for w in send_works], [_WorkPending(w) for w in recv_works]

    def close(self) -> None:
        """Shut the backend down."""
        self._backend.shutdown()


def _make_backend(kind: str, store: Any, rank: int, world_size: int, timeout: datetime.timedelta) -> tuple[Any, Any]:
    """Return (BackendType, backend) of a fresh gloo or NCCL backend on ``store``."""
    if kind == "gloo":
        return dist.ProcessGroup.BackendType.GLOO, dist.ProcessGroupGloo(store, rank, world_size, timeout)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroup.BackendType.NCCL, dist.ProcessGroupNCCL(store, rank, world_size, options)


def _device_kinds() -> dict[str, str]:
    kinds = {"cpu": "gloo"}
    if torch.cuda.is_available() and dist.is_nccl_available():
        kinds["cuda"] = "nccl"
    return kinds


def _op_name(opts: Any) -> str | None:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    for torch_name, name in _OPS:
        if op == getattr(dist.ReduceOp, torch_name):
            return name
    return None


class TacclProcessGroup(dist.ProcessGroup):
    """A process group whose all-reduce, all-gather and reduce-scatter run taccl_py algorithms.

    Made by the backend creator that :func:`register_backend` installs; see the module notes for
    what is routed and how. ``routed`` counts the calls per collective that ran an algorithm and
    ``delegated`` the calls of those collectives that went to the inner backend.

    Parameters
    ----------
    store : torch.distributed.Store
        The group's store (prefixed per group by torch).
    rank, world_size : int
        This process's rank in the group and the group's size.
    timeout : datetime.timedelta
        The group's timeout; also the Communicator's longest wait for one message.
    library, topology, nodes
        Where the algorithms come from, as for :class:`Communicator`.
    """

    def __init__(self, store: Any, rank: int, world_size: int, timeout: datetime.timedelta, *, library: Any = None, topology: str | None = None, nodes: int | None = None) -> None:
        super().__init__(rank, world_size)
        self._spec = (library, topology, nodes)
        self._timeout_s = float(timeout.total_seconds())
        self._has_algorithms = _check_library(library, topology, nodes, world_size)
        self._links: dict[str, BackendTransport] = {}
        self._communicators: dict[str, Communicator] = {}
        self.routed: Counter = Counter()
        self.delegated: Counter = Counter()
        default_type = None
        for device_type, kind in _device_kinds().items():
            inner_type, inner = _make_backend(kind, dist.PrefixStore(f"{device_type}/inner/", store), rank, world_size, timeout)
            self._register_backend(torch.device(device_type), inner_type, inner)
            default_type = default_type or inner_type
            if self._has_algorithms:
                _, link = _make_backend(kind, dist.PrefixStore(f"{device_type}/taccl/", store), rank, world_size, timeout)
                self._links[device_type] = BackendTransport(link, torch.device(device_type))
        self._set_default_backend(default_type)
        self._worker = OrderedWorker(f"taccl-pg-rank{rank}")

    def getBackendName(self) -> str:  # noqa: N802 - the name torch calls
        """Return ``"taccl"``."""
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"TacclProcessGroup(rank={self.rank()}, world_size={self.size()})"

    # -- routing ----------------------------------------------------------------------------------

    def _inner(self, tensor: torch.Tensor) -> Any:
        return self._get_backend(tensor.device)

    def _communicator(self, tensor: torch.Tensor, collective: Collective, output: torch.Tensor, input: torch.Tensor) -> Communicator | None:
        """Return the Communicator that runs this call, or None when the inner backend should."""
        link = self._links.get(tensor.device.type)
        if link is None or self._worker.in_worker_thread() or tensor.numel() == 0:
            return None
        if any(t.layout != torch.strided or t.dtype not in SUPPORTED_DTYPES or not t.is_contiguous() or t.device != link.device for t in (output, input)):
            return None
        communicator = self._communicators.get(tensor.device.type)
        if communicator is None:
            library, topology, nodes = self._spec
            communicator = Communicator(self, library, topology=topology, nodes=nodes, transport=link, timeout_s=self._timeout_s)
            self._communicators[tensor.device.type] = communicator
        size_bytes = collective_size_bytes(collective, input.numel() * input.element_size(), output.numel() * output.element_size())
        return communicator if communicator.algorithm_for(collective, size_bytes) is not None else None

    def _submit(self, collective: Collective, job: Callable[[], list[torch.Tensor]]) -> Any:
        self.routed[collective.value] += 1
        return _create_work_from_future(self._worker.submit(job))

    def _delegate(self, collective: Collective, method: str, tensor: torch.Tensor, *args: Any) -> Any:
        self.delegated[collective.value] += 1
        return getattr(self._inner(tensor), method)(*args)

    # -- routed collectives -----------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """All-reduce ``tensors[0]`` in place; return its Work."""
        opts = dist.AllreduceOptions() if opts is None else opts
        op = _op_name(opts)
        tensor = tensors[0]
        communicator = self._communicator(tensor, Collective.ALLREDUCE, tensor, tensor) if len(tensors) == 1 and op else None
        if communicator is None:
            return self._delegate(Collective.ALLREDUCE, "allreduce", tensor, tensors, opts)
        return self._submit(Collective.ALLREDUCE, partial(_all_reduce, communicator, tensor, op))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        """Gather every rank's ``input`` into ``output`` (rank-major); return the Work."""
        communicator = self._communicator(input, Collective.ALLGATHER, output, input)
        if communicator is None:
            return self._delegate(Collective.ALLGATHER, "_allgather_base", input, output, input, opts or dist.AllgatherOptions())
        return self._submit(Collective.ALLGATHER, partial(_all_gather, communicator, output, input))

    _allgather_base = all_gather_single

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """Gather ``input_tensors[0]`` of every rank into the list ``output_tensors[0]``; return the Work."""
        opts = dist.AllgatherOptions() if opts is None else opts
        input = input_tensors[0]
        outputs = output_tensors[0] if len(output_tensors) == 1 else []
        fits = len(input_tensors) == 1 and len(outputs) == self.size() and all(_same_kind(t, input) for t in outputs)
        flat = torch.empty(input.numel() * self.size(), dtype=input.dtype, device=input.device) if fits else None
        communicator = self._communicator(input, Collective.ALLGATHER, flat, input) if fits else None
        if communicator is None:
            return self._delegate(Collective.ALLGATHER, "allgather", input, output_tensors, input_tensors, opts)
        return self._submit(Collective.ALLGATHER, partial(_all_gather_list, communicator, flat, outputs, input))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        """Reduce ``input`` over ranks and keep this rank's block in ``output``; return the Work."""
        opts = dist.ReduceScatterOptions() if opts is None else opts
        op = _op_name(opts)
        communicator = self._communicator(input, Collective.REDUCESCATTER, output, input) if op else None
        if communicator is None:
            return self._delegate(Collective.REDUCESCATTER, "_reduce_scatter_base", input, output, input, opts)
        return self._submit(Collective.REDUCESCATTER, partial(_reduce_scatter, communicator, output, input, op))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None) -> Any:
        """Reduce the list ``input_tensors[0]`` over ranks into ``output_tensors[0]``; return the Work."""
        opts = dist.ReduceScatterOptions() if opts is None else opts
        op = _op_name(opts)
        output = output_tensors[0]
        inputs = input_tensors[0] if len(input_tensors) == 1 else []
        fits = op is not None and len(output_tensors) == 1 and len(inputs) == self.size() and all(_same_kind(t, output) for t in inputs)
        flat = torch.empty(output.numel() * self.size(), dtype=output.dtype, device=output.device) if fits else None
        communicator = self._communicator(output, Collective.REDUCESCATTER, output, flat) if fits else None
        if communicator is None:
            return self._delegate(Collective.REDUCESCATTER, "reduce_scatter", output, output_tensors, input_tensors, opts)
        return self._submit(Collective.REDUCESCATTER, partial(_reduce_scatter_list, communicator, output, flat, inputs, op))

    # -- ordering and lifetime --------------------------------------------------------------------

    def barrier(self, opts: Any = None) -> Any:
        """Wait for the routed collectives queued so far, then run the inner backend's barrier."""
        self._worker.flush().wait()
        opts = dist.BarrierOptions() if opts is None else opts
        return self._get_backend(torch.device("cpu")).barrier(opts)  # gloo: no device to choose

    def shutdown(self) -> None:
        """Stop the worker, close the routed collectives' links and shut the inner backends down."""
        self._worker.close()
        for link in self._links.values():
            link.close()
        self._links.clear()
        dist.ProcessGroup.shutdown(self)


def _same_kind(tensor: torch.Tensor, like: torch.Tensor) -> bool:
    return tensor.numel() == like.numel() and tensor.dtype == like.dtype and tensor.device == like.device


def _all_reduce(communicator: Communicator, tensor: torch.Tensor, op: str) -> list[torch.Tensor]:
    communicator.all_reduce(tensor, op)
    return [tensor]


def _all_gather(communicator: Communicator, output: torch.Tensor, input: torch.Tensor) -> list[torch.Tensor]:
    communicator.all_gather(output, input)
    return [output]


def _all_gather_list(communicator: Communicator, flat: torch.Tensor, outputs: list[torch.Tensor], input: torch.Tensor) -> list[torch.Tensor]:
    communicator.all_gather(flat, input)
    for block, out in zip(flat.chunk(len(outputs)), outputs):
        out.copy_(block.view_as(out))
    return list(outputs)


def _reduce_scatter(communicator: Communicator, output: torch.Tensor, input: torch.Tensor, op: str) -> list[torch.Tensor]:
    communicator.reduce_scatter(output, input, op)
    return [output]


def _reduce_scatter_list(communicator: Communicator, output: torch.Tensor, flat: torch.Tensor, inputs: list[torch.Tensor], op: str) -> list[torch.Tensor]:
    torch.cat([t.reshape(-1) for t in inputs], out=flat)
    communicator.reduce_scatter(output, flat, op)
    return [output]


def _check_library(library: Any, topology: str | None, nodes: int | None, world_size: int) -> bool:
    """Return whether the spec holds algorithms for ``world_size`` ranks; raise for an unreadable spec.

    A group of another size (a sub-group) runs everything on the inner backend, and says so once.
    """
    try:
        choices = collect_algorithms(library, world_size, topology=topology, nodes=nodes)
    except ArgumentError as error:
        if error.field not in ("num_ranks", "world_size"):
            raise
        logger.info("taccl group of %d ranks: %s; its collectives run on the inner backend", world_size, error)
        return False
    return bool(choices.candidates)


def _create_group(settings: tuple[Any, str | None, int | None], store: Any, rank: int, world_size: int, timeout: datetime.timedelta) -> TacclProcessGroup:
    library, topology, nodes = settings
    return TacclProcessGroup(store, rank, world_size, timeout, library=library, topology=topology, nodes=nodes)


def register_backend(library: Any = None, *, topology: str | None = None, nodes: int | None = None) -> None:
    """Register the ``taccl`` backend with torch.distributed, running algorithms from ``library``.

    Call it in every process before ``init_process_group("taccl")``; calling it again replaces the
    settings for groups created afterwards.

    Parameters
    ----------
    library : optional
        Algorithms, as for :class:`Communicator`: a built-in topology name, a ``*.library.json``,
        an algorithm file, an Algorithm, or a sequence of these. None (and no ``topology``) runs
        every collective on the inner gloo/NCCL backend.
    topology : str, optional
        A built-in topology whose shipped algorithms come after ``library``'s.
    nodes : int, optional
        The node count for a topology name.

    Raises
    ------
    ArgumentError
        (From ``init_process_group``.) ``library`` names nothing readable.

    Examples
    --------
    >>> register_backend()
    >>> "taccl" in torch.distributed.Backend.backend_list
    True
    """
    creator = partial(_create_group, (library, topology, nodes))
    # torch keeps one creator per name: registering again replaces it for groups made afterwards.
    dist.Backend.register_backend(BACKEND_NAME, creator, devices=list(_DEVICES))
