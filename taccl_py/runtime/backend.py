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

Every collective entry point torch has is a Python method here, delegated ones included: torch's
C++ side of a Python process group runs a method the subclass lacks with the GIL held, and gloo's
worker thread frees finished work (and the Python tensors it holds) under its queue lock, so an
inherited method can deadlock the process against gloo (seen with DTensor's ``full_tensor``). The
inner backend's Python bindings release the GIL.

Threads and ordering: a routed collective is queued on the group's
:class:`~taccl_py.runtime.ordered_worker.OrderedWorker` and returns a Work at once, so DDP's
bucket all-reduces overlap backward. Its messages travel on a second backend of the same kind
(its own store prefix and connections), used by that worker thread alone, so they never pair up
with the inner backend's collectives or with user send/recv. ``barrier`` waits for the routed
collectives queued before it. As with gloo, wait on a Work before touching its tensors.

Calibration: ``group.calibrate(path)`` (every rank, once the group exists) times each routed
collective against the inner backend's own on the live group and from then on routes a size only
where ours measured faster by the calibration's margin; the other sizes go straight to the inner
backend, with no worker thread (see :mod:`taccl_py.runtime.calibration`).

Cluster: given the live cluster (``register_backend(cluster=...)``, or TACCL_CLUSTER, TACCL_NIC_DOWN,
TACCL_NIC_SPEED, TACCL_SYSFS_ROOT and TACCL_NIC_PROBE in each process's environment; see
:mod:`taccl_py.runtime.live_cluster`), the group routes only through algorithms made for it; the
ranks exchange what sysfs shows of their NICs through the group's store while the group is made.
A collective whose libraries were all made for other clusters runs on the inner backend, with one
warning per collective.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from taccl_py.errors import ArgumentError, TacclError
from taccl_py.ir.collectives import Collective
from taccl_py.runtime.backend_transport import BackendTransport, FutureWork, make_backend
from taccl_py.runtime.calibration import Calibration
from taccl_py.runtime.communicator import Communicator
from taccl_py.runtime.executor import SUPPORTED_DTYPES
from taccl_py.runtime.live_cluster import (
    LiveCluster,
    declared_from_env,
    mismatch_warning,
    resolve_live_cluster,
    sysfs_root_from_env,
)
from taccl_py.runtime.ordered_worker import OrderedWorker, caller_stream
from taccl_py.runtime.selection import AlgorithmChoices, collect_algorithms, match_cluster

__all__ = ["BACKEND_NAME", "TacclProcessGroup", "register_backend"]

logger = logging.getLogger(__name__)

#: The name ``init_process_group`` takes.
BACKEND_NAME = "taccl"
_DEVICES = ["cpu", "cuda"]
# torch ReduceOp -> Communicator op; others (PRODUCT, PREMUL_SUM, bitwise) go to the inner backend
_OPS = (("SUM", "sum"), ("AVG", "avg"), ("MAX", "max"), ("MIN", "min"))


def _device_kinds() -> dict[str, tuple[str, torch.device]]:
    """Return device type -> (inner backend kind, the device routed tensors must be on)."""
    kinds = {"cpu": ("gloo", torch.device("cpu"))}
    if torch.cuda.is_available() and dist.is_nccl_available():
        # the device the process chose (torch.cuda.set_device) before creating the group
        kinds["cuda"] = ("nccl", torch.device("cuda", torch.cuda.current_device()))
    return kinds


def _op_name(opts: Any) -> str | None:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    for torch_name, name in _OPS:
        if op == getattr(dist.ReduceOp, torch_name):
            return name
    return None


def _first_tensor(value: Any) -> torch.Tensor | None:
    """Return the first tensor in ``value`` (a tensor, or nested lists/tuples of them), or None."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _on_inner_backend(name: str) -> Callable[..., Any]:
    """Return a method that runs the inner backend's ``name`` on the device of the call's first tensor."""

    def delegated(self: TacclProcessGroup, *args: Any, **kwargs: Any) -> Any:
        tensor = _first_tensor(args)
        device = tensor.device if tensor is not None else torch.device("cpu")
        return getattr(self._get_backend(device), name)(*args, **kwargs)

    delegated.__name__ = delegated.__qualname__ = name
    delegated.__doc__ = f"Run the inner gloo/NCCL backend's ``{name}`` with these arguments; return its Work."
    return delegated


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
    cluster, nic_down, nic_speed, sysfs_root
        The live cluster, as for :class:`Communicator` (None: no cluster check).
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        timeout: datetime.timedelta,
        *,
        library: Any = None,
        topology: str | None = None,
        nodes: int | None = None,
        cluster: Any = None,
        nic_down: Any = (),
        nic_speed: Any = (),
        sysfs_root: str | os.PathLike | None = "/",
    ) -> None:
        super().__init__(rank, world_size)
        self._timeout_s = float(timeout.total_seconds())
        self._cluster: LiveCluster | None = None
        self._warned: set[Collective] = set()
        subgroup = False
        if cluster is not None:
            exchange = partial(_exchange_on_store, store, rank, world_size)
            try:
                self._cluster = resolve_live_cluster(cluster, nic_down, nic_speed, sysfs_root, world_size, exchange)
            except ArgumentError as error:
                if error.field != "world_size":
                    raise
                logger.info("taccl group of %d ranks: %s; its collectives run on the inner backend", world_size, error)
                subgroup = True
        self._spec = (library, topology, nodes, self._cluster)
        self._choices = None if subgroup else _group_choices(library, topology, nodes, world_size, self._cluster)
        self._has_algorithms = self._choices is not None and bool(self._choices.candidates)
        self._links: dict[str, BackendTransport] = {}
        self._communicators: dict[str, Communicator] = {}
        self.routed: Counter = Counter()
        self.delegated: Counter = Counter()
        default_type = None
        for device_type, (kind, device) in _device_kinds().items():
            inner_type, inner = make_backend(
                kind, dist.PrefixStore(f"{device_type}/inner/", store), rank, world_size, timeout
            )
            self._register_backend(torch.device(device_type), inner_type, inner)
            default_type = default_type or inner_type
            if self._has_algorithms:
                _, link = make_backend(
                    kind, dist.PrefixStore(f"{device_type}/taccl/", store), rank, world_size, timeout
                )
                self._links[device_type] = BackendTransport(link, device)
                if kind == "nccl":  # every rank makes the group together: the one moment all take part
                    self._links[device_type].warm_up()
        self._set_default_backend(default_type)
        self._worker = OrderedWorker(f"taccl-pg-rank{rank}")

    def getBackendName(self) -> str:  # noqa: N802 - the name torch calls
        """Return ``"taccl"``."""
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"TacclProcessGroup(rank={self.rank()}, world_size={self.size()})"

    # -- routing ----------------------------------------------------------------------------------

    def _communicator(
        self, collective: Collective, tensors: tuple[torch.Tensor, ...], size_bytes: int
    ) -> Communicator | None:
        """Return the Communicator that runs this call, or None when the inner backend should.

        ``size_bytes`` is the call's nccl-tests size (all-gather: output, reduce-scatter: input).
        """
        link = self._links.get(tensors[0].device.type)
        if link is None or size_bytes == 0 or self._worker.in_worker_thread():
            if link is None and size_bytes:
                self._warn_other_cluster(collective, size_bytes)
            return None
        if any(
            t.layout != torch.strided
            or t.dtype not in SUPPORTED_DTYPES
            or not t.is_contiguous()
            or t.device != link.device
            for t in tensors
        ):
            return None
        communicator = self._communicator_on(link)
        if communicator.algorithm_for(collective, size_bytes) is None:
            self._warn_other_cluster(collective, size_bytes)
            return None
        return communicator

    def _warn_other_cluster(self, collective: Collective, size_bytes: int) -> None:
        """Warn once per collective when the libraries had an algorithm for this call, but for another cluster."""
        if self._cluster is None or self._choices is None or collective in self._warned:
            return
        rejected = self._choices.rejected_for(collective, size_bytes)
        if rejected:
            self._warned.add(collective)
            made_for = [candidate.made_for.describe() for candidate in rejected]
            logger.warning("%s", mismatch_warning(collective.value, size_bytes, self._cluster, made_for))

    def _communicator_on(self, link: BackendTransport) -> Communicator:
        """Return the group's Communicator for ``link``'s device, made on first use."""
        communicator = self._communicators.get(link.device.type)
        if communicator is None:
            library, topology, nodes, cluster = self._spec
            communicator = Communicator(
                self,
                library,
                topology=topology,
                nodes=nodes,
                transport=link,
                timeout_s=self._timeout_s,
                cluster=cluster,
            )
            self._communicators[link.device.type] = communicator
        return communicator

    def calibrate(
        self, path: str | os.PathLike | None = None, *, device: str | None = None, **options: Any
    ) -> Calibration | None:
        """Time the routed collectives against the inner backend's on this group; route only where ours won.

        Every rank calls it alike once the group exists (``dist.group.WORLD.calibrate(...)``), with
        no collective of the group in flight. ``path`` caches the result as
        :meth:`Communicator.load_or_calibrate` does; ``options`` (sizes, collectives, iters, warmup,
        margin) go to :meth:`Communicator.calibrate`. ``device`` ("cpu" or "cuda") picks the link
        to calibrate: by default the GPU's where the group has one. Returns None, measuring
        nothing, when the group routes nothing (no algorithms for its world size).
        """
        kind = device or ("cuda" if "cuda" in self._links else "cpu")
        link = self._links.get(kind)
        if link is None:
            if self._has_algorithms:
                raise ArgumentError(BACKEND_NAME, "device", repr(kind), " | ".join(self._links))
            return None
        communicator = self._communicator_on(link)
        # On the worker thread the native side's dist.* calls on this group reach the inner backend
        # (see _communicator); errors come back as values so a bad file does not stop the worker.
        measured = self._worker.submit(partial(_calibrate_or_error, communicator, path, options)).wait()
        if isinstance(measured, BaseException):
            raise measured
        return measured

    def _submit(self, collective: Collective, job: Callable[[], list[torch.Tensor]], tensor: torch.Tensor) -> Any:
        """Queue ``job`` on the worker, on the caller's CUDA stream where ``tensor`` is on a GPU; return its Work."""
        self.routed[collective.value] += 1
        stream = caller_stream(tensor)
        return FutureWork(self._worker.submit_on(job, stream), stream)

    def _delegate(self, collective: Collective, method: str, tensor: torch.Tensor, *args: Any) -> Any:
        self.delegated[collective.value] += 1
        return getattr(self._get_backend(tensor.device), method)(*args)

    # -- routed collectives -----------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """All-reduce ``tensors[0]`` in place; return its Work."""
        opts = dist.AllreduceOptions() if opts is None else opts
        op, tensor = _op_name(opts), tensors[0]
        routable = len(tensors) == 1 and op is not None
        communicator = self._communicator(Collective.ALLREDUCE, (tensor,), _nbytes(tensor)) if routable else None
        if communicator is None:
            return self._delegate(Collective.ALLREDUCE, "allreduce", tensor, tensors, opts)
        return self._submit(Collective.ALLREDUCE, partial(_all_reduce, communicator, tensor, op), tensor)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        """Gather every rank's ``input`` into ``output`` (rank-major); return the Work."""
        communicator = self._communicator(Collective.ALLGATHER, (output, input), _nbytes(output))
        if communicator is None:
            return self._delegate(
                Collective.ALLGATHER, "_allgather_base", input, output, input, opts or dist.AllgatherOptions()
            )
        return self._submit(Collective.ALLGATHER, partial(_all_gather, communicator, output, input), output)

    _allgather_base = all_gather_single

    def allgather(
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> Any:
        """Gather ``input_tensors[0]`` of every rank into the list ``output_tensors[0]``; return the Work."""
        opts = dist.AllgatherOptions() if opts is None else opts
        input = input_tensors[0]
        outputs = output_tensors[0] if len(output_tensors) == 1 else []
        routable = (
            len(input_tensors) == 1 and len(outputs) == self.size() and all(_same_kind(t, input) for t in outputs)
        )
        communicator = (
            self._communicator(Collective.ALLGATHER, (input, *outputs), _nbytes(input) * self.size())
            if routable
            else None
        )
        if communicator is None:
            return self._delegate(Collective.ALLGATHER, "allgather", input, output_tensors, input_tensors, opts)
        return self._submit(Collective.ALLGATHER, partial(_all_gather_list, communicator, outputs, input), input)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        """Reduce ``input`` over ranks and keep this rank's block in ``output``; return the Work."""
        opts = dist.ReduceScatterOptions() if opts is None else opts
        op = _op_name(opts)
        communicator = self._communicator(Collective.REDUCESCATTER, (output, input), _nbytes(input)) if op else None
        if communicator is None:
            return self._delegate(Collective.REDUCESCATTER, "_reduce_scatter_base", input, output, input, opts)
        return self._submit(Collective.REDUCESCATTER, partial(_reduce_scatter, communicator, output, input, op), output)

    _reduce_scatter_base = reduce_scatter_single

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        """All-gather each (output, input) pair as ``all_gather_single`` does; return one Work for all.

        What functional collectives (``all_gather_tensor``, DTensor) call.
        """
        opts = dist.AllgatherOptions() if opts is None else opts
        return _all_of([self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)], outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        """Reduce-scatter each (output, input) pair as ``reduce_scatter_single`` does; return one Work for all."""
        opts = dist.ReduceScatterOptions() if opts is None else opts
        return _all_of([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)], outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- delegated collectives: the inner backend's own, through its GIL-releasing bindings ------

    broadcast = _on_inner_backend("broadcast")
    reduce = _on_inner_backend("reduce")
    gather = _on_inner_backend("gather")
    scatter = _on_inner_backend("scatter")
    send = _on_inner_backend("send")
    recv = _on_inner_backend("recv")
    recv_anysource = _on_inner_backend("recv_anysource")
    alltoall = _on_inner_backend("alltoall")
    alltoall_base = _on_inner_backend("alltoall_base")
    all_to_all_single = _on_inner_backend("alltoall_base")
    allreduce_coalesced = _on_inner_backend("allreduce_coalesced")
    allgather_coalesced = _on_inner_backend("allgather_coalesced")

    def reduce_scatter(
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None
    ) -> Any:
        """Reduce the list ``input_tensors[0]`` over ranks into ``output_tensors[0]``; return the Work."""
        opts = dist.ReduceScatterOptions() if opts is None else opts
        op, output = _op_name(opts), output_tensors[0]
        inputs = input_tensors[0] if len(input_tensors) == 1 else []
        routable = (
            op is not None
            and len(output_tensors) == 1
            and len(inputs) == self.size()
            and all(_same_kind(t, output) for t in inputs)
        )
        communicator = (
            self._communicator(Collective.REDUCESCATTER, (output, *inputs), _nbytes(output) * self.size())
            if routable
            else None
        )
        if communicator is None:
            return self._delegate(
                Collective.REDUCESCATTER, "reduce_scatter", output, output_tensors, input_tensors, opts
            )
        return self._submit(
            Collective.REDUCESCATTER, partial(_reduce_scatter_list, communicator, output, inputs, op), output
        )

    # -- ordering and lifetime --------------------------------------------------------------------

    def barrier(self, opts: Any = None) -> Any:
        """Wait for the routed collectives queued so far, then run the inner backend's barrier."""
        if not self._worker.in_worker_thread():  # on it (calibrating), everything before has run
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


def _all_of(works: list[Any], outputs: list[torch.Tensor]) -> Any:
    """Return one Work that completes when all ``works`` have; ``wait`` raises the first failure."""
    if len(works) == 1:
        return works[0]
    done = torch.futures.collect_all([work.get_future() for work in works])
    # the parts were queued from this thread, on its current stream: order the waiter after it too
    return FutureWork(done.then(partial(_outputs_after, outputs)), caller_stream(outputs[0]))


def _outputs_after(outputs: list[torch.Tensor], done: torch.futures.Future) -> list[torch.Tensor]:
    for future in done.wait():
        future.wait()  # raises a failed collective's error
    return list(outputs)


def _calibrate_or_error(
    communicator: Communicator, path: str | os.PathLike | None, options: dict[str, Any]
) -> Calibration | Exception:
    try:
        if path is None:
            return communicator.calibrate(**options)
        return communicator.load_or_calibrate(path, **options)
    except TacclError as error:
        return error


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _same_kind(tensor: torch.Tensor, like: torch.Tensor) -> bool:
    return tensor.numel() == like.numel() and tensor.dtype == like.dtype and tensor.device == like.device


def _all_reduce(communicator: Communicator, tensor: torch.Tensor, op: str) -> list[torch.Tensor]:
    communicator.all_reduce(tensor, op)
    return [tensor]


def _all_gather(communicator: Communicator, output: torch.Tensor, input: torch.Tensor) -> list[torch.Tensor]:
    communicator.all_gather(output, input)
    return [output]


def _all_gather_list(
    communicator: Communicator, outputs: list[torch.Tensor], input: torch.Tensor
) -> list[torch.Tensor]:
    flat = torch.empty(input.numel() * len(outputs), dtype=input.dtype, device=input.device)
    communicator.all_gather(flat, input.contiguous())
    for block, out in zip(flat.chunk(len(outputs)), outputs):
        out.copy_(block.view_as(out))
    return list(outputs)


def _reduce_scatter(
    communicator: Communicator, output: torch.Tensor, input: torch.Tensor, op: str
) -> list[torch.Tensor]:
    communicator.reduce_scatter(output, input, op)
    return [output]


def _reduce_scatter_list(
    communicator: Communicator, output: torch.Tensor, inputs: list[torch.Tensor], op: str
) -> list[torch.Tensor]:
    flat = torch.cat([t.reshape(-1) for t in inputs])
    communicator.reduce_scatter(output, flat, op)
    return [output]


def _group_choices(
    library: Any, topology: str | None, nodes: int | None, world_size: int, cluster: LiveCluster | None
) -> AlgorithmChoices | None:
    """Return the algorithms for ``world_size`` ranks made for ``cluster`` (None: any); raise for an unreadable spec.

    None for a group of another size (a sub-group): it runs everything on the inner backend, and says so once.
    """
    try:
        choices = collect_algorithms(library, world_size, topology=topology, nodes=nodes)
    except ArgumentError as error:
        if error.field not in ("num_ranks", "world_size"):
            raise
        logger.info("taccl group of %d ranks: %s; its collectives run on the inner backend", world_size, error)
        return None
    return choices if cluster is None else match_cluster(choices, cluster.fingerprint)


def _exchange_on_store(store: Any, rank: int, world_size: int, text: str) -> list[str]:
    """Return every rank's ``text`` in rank order, passed through the group's store (no collective needed)."""
    store.set(f"taccl/nic-ports/{rank}", text)
    return [store.get(f"taccl/nic-ports/{other}").decode() for other in range(world_size)]


def _create_group(
    settings: dict[str, Any], store: Any, rank: int, world_size: int, timeout: datetime.timedelta
) -> TacclProcessGroup:
    options = dict(settings)
    if options["cluster"] is None:  # read in the rank's own process, at group creation
        options["cluster"] = declared_from_env(os.environ)
        if options["sysfs_root"] == "/":
            options["sysfs_root"] = sysfs_root_from_env(os.environ)
    return TacclProcessGroup(store, rank, world_size, timeout, **options)


def register_backend(
    library: Any = None,
    *,
    topology: str | None = None,
    nodes: int | None = None,
    cluster: Any = None,
    nic_down: Any = (),
    nic_speed: Any = (),
    sysfs_root: str | os.PathLike | None = "/",
) -> None:
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
    cluster, nic_down, nic_speed, sysfs_root : optional
        The live cluster, as for :class:`Communicator`; ``cluster`` None takes TACCL_CLUSTER (and
        TACCL_NIC_DOWN, TACCL_NIC_SPEED, TACCL_SYSFS_ROOT, TACCL_NIC_PROBE) from each process's
        environment when the group is made, and without it checks no cluster.

    Raises
    ------
    ArgumentError
        (From ``init_process_group``.) ``library`` names nothing readable, or the cluster is malformed.

    Examples
    --------
    >>> register_backend()
    >>> "taccl" in torch.distributed.Backend.backend_list
    True
    """
    settings = {
        "library": library,
        "topology": topology,
        "nodes": nodes,
        "cluster": cluster,
        "nic_down": nic_down,
        "nic_speed": nic_speed,
        "sysfs_root": sysfs_root,
    }
    creator = partial(_create_group, settings)
    # torch keeps one creator per name: registering again replaces it for groups made afterwards.
    dist.Backend.register_backend(BACKEND_NAME, creator, devices=list(_DEVICES))
