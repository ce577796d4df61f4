"""taccl_py.Communicator: all_gather, reduce_scatter, all_reduce and all_to_all with synthesized algorithms.

Built on an initialised torch.distributed process group. For each call it picks an algorithm by
collective, world size and message size from its library, compiles an :class:`Executor` once per
(algorithm, dtype, element count) and replays it over the transport; when no algorithm fits it
runs torch.distributed's own collective on the same group and says so in one log line. It also
runs the own collective ("native") wherever that measured faster on this group: by default it
times both on each collective's first call, or reads that from its cache (see
:mod:`taccl_py.runtime.communicator.calibration_cache`); ``calibration=`` and :meth:`Communicator.calibrate`
give or measure a calibration instead. Given the live cluster (``cluster=``, or
TACCL_CLUSTER for ``from_env``; see :mod:`taccl_py.runtime.communicator.live_cluster`) it runs only algorithms
made for that cluster, and the own collective, with one warning per collective, where none was.

This module builds the Communicator (group, transport, CUDA graphs), compiles and caches its
executors and runs its collectives; how it chooses what each call runs (band, cluster check,
calibration) is its base :class:`~taccl_py.runtime.communicator.choice.AlgorithmChoice`.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from taccl_py.errors import ArgumentError, TransportError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.dataflow import Dataflow, build_dataflow
from taccl_py.runtime.communicator.checks import check_split_sizes, check_tensors, op_name, splits_given
from taccl_py.runtime.communicator.choice import _SOURCE, AlgorithmChoice
from taccl_py.runtime.communicator.live_cluster import declared_from_env, sysfs_root_from_env
from taccl_py.runtime.communicator.selection import collective_size_bytes
from taccl_py.runtime.executor import Executor
from taccl_py.runtime.executor.binding import DEFAULT_SEGMENT_BYTES
from taccl_py.runtime.executor.graphs import graph_support
from taccl_py.runtime.executor.inplace_calls import describe_form, is_inplace_call
from taccl_py.runtime.executor.native import native_collective
from taccl_py.runtime.transports.interface import DEFAULT_TIMEOUT_S, Transport

__all__ = ["Communicator", "MAX_CACHED_EXECUTORS", "DEFAULT_TIMEOUT_S", "default_backend"]

logger = logging.getLogger(__name__)

#: Compiled executors kept per Communicator (least recently used dropped first): enough for
#: every gradient bucket size of a large DDP model.
MAX_CACHED_EXECUTORS = 64
_ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def default_backend(environ: Mapping[str, str], cuda_devices: int) -> str:
    """Return "nccl" when every local rank (torchrun's LOCAL_WORLD_SIZE, default 1) has a GPU of its own, else "gloo".

    NCCL refuses two ranks of one host on one GPU, so 4 local ranks on a 1-GPU machine take gloo.

    >>> default_backend({"LOCAL_WORLD_SIZE": "4"}, 8), default_backend({"LOCAL_WORLD_SIZE": "4"}, 1)
    ('nccl', 'gloo')
    >>> default_backend({}, 0)
    'gloo'
    """
    return "nccl" if 0 < int(environ.get("LOCAL_WORLD_SIZE", "1")) <= cuda_devices else "gloo"


def _destroy_default_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _make_transport(transport: Any, group: Any) -> Transport:
    if isinstance(transport, Transport):
        return transport
    if transport in (None, "torch"):
        from taccl_py.runtime.transports.torch_dist import TorchDistTransport

        return TorchDistTransport(group)
    if transport == "cupy":
        from taccl_py.runtime.transports.cupy_nccl import CupyNcclTransport

        return CupyNcclTransport(group)
    if transport == "mscclpp":
        from taccl_py.runtime.communicator.mscclpp_runner import MscclppTransport

        return MscclppTransport(group)
    raise ArgumentError(_SOURCE, "transport", f"{transport!r}", "None, 'torch', 'cupy', 'mscclpp' or a Transport")


class Communicator(AlgorithmChoice):
    """Collectives on a torch.distributed group, run with taccl_py algorithms where one fits.

    Parameters
    ----------
    process_group : ProcessGroup, optional
        An initialised group (None: the default group). Its ranks are the algorithms' ranks.
    library : Algorithm, AlgorithmLibrary, str, PathLike or a sequence of these, optional
        A built-in topology name (its shipped algorithms), a ``*.library.json`` written by
        ``taccl synthesize --sizes``, or one algorithm file (``.json`` or MSCCL ``.xml``).
    topology : str, optional
        A built-in topology name whose shipped algorithms to use (after ``library``'s).
    nodes : int, optional
        The node count for a topology name (None: whichever fits the world size).
    transport : None, "torch", "cupy", "mscclpp" or Transport
        How messages move; None picks torch.distributed point-to-point on the group's backend.
        "mscclpp" runs each call a plan serves as one MSCCL++ kernel, the rest as "torch" does
        (see :mod:`taccl_py.runtime.communicator.mscclpp_runner`).
    timeout_s : float
        Longest wait for one message; a peer silent for longer fails the call.
    verify : bool
        Prove every algorithm correct (``taccl_py.verify.check_algorithm``) before it may run.
        An algorithm's in-place variant is verified either way, once, on its first in-place call.
    calibration : bool, None, str, PathLike or Calibration
        Run the group's own collective wherever the library's algorithm did not measure more than
        5% faster than it. True (default) or None: measured on each collective's first call (see Notes)
        unless TACCL_CALIBRATION=off. False: never. A path is a cache: read when it holds a
        calibration of this group's key (world size, transport, device, library), otherwise
        measured now for every collective and written there by rank 0. See :meth:`calibrate`.
    cuda_graphs : bool
        Capture each call into a CUDA graph on its second run with the same tensors and replay it
        after (see :mod:`taccl_py.runtime.executor.graphs`); every rank must pass the same value. Where
        graphs cannot be used (CPU, the CuPy transport, an NCCL before 2.9.6) the Communicator
        says why in one warning and runs every call eagerly.
    cluster : Topology, Cluster, str or PathLike, optional
        The live cluster: a cluster shorthand (``"dgx-a100:2,dgx-h100:2"``), a ``taccl-cluster/1``
        file, a ``taccl_py.topology.cluster.Cluster`` or a Topology (taken as it is). Only
        algorithms made for it run (a library's ``cluster`` record, or the built-in topology it
        names; an algorithm's ``cluster_fingerprint`` metadata); where none was, the group's own
        collective runs, with one warning per collective. None: no check, every algorithm may run.
    nic_down, nic_speed : str or sequence of str
        NICs down (``"1:nic3"``) and NIC speeds (``"1:nic0:4.76"``, GB/s) on top of ``cluster``.
    sysfs_root : str, PathLike or None
        Where each rank reads its node's NIC ports to refine ``cluster`` (a port not ACTIVE: its
        NIC is down; its rate: the NIC's speed); ranks exchange what they read, so construction is
        collective then. None reads nothing.

    Raises
    ------
    ArgumentError
        An explicitly given algorithm or library is for another world size, ``library`` names
        nothing readable, or ``transport="mscclpp"`` lacks MSCCL++'s Python bindings or CUDA.
    VerificationError
        With ``verify``, an algorithm does not implement its collective.
    TransportError
        torch.distributed is not initialised or its backend has no transport.

    Notes
    -----
    All collectives are synchronous and take contiguous tensors of one dtype (float32, float16,
    bfloat16, float64, int32, int64) on the transport's device; ``op`` is "sum", "avg", "max" or
    "min" (or a ``torch.distributed.ReduceOp``); all_to_all runs an algorithm on equal blocks and
    the group's own ``all_to_all_single`` when split sizes are given. avg divides the sum by the world size
    (integers: truncating, as NCCL does). Shapes, dtypes and ops are checked before any message is sent.
    A call whose tensors alias as MSCCL's in-place calls do (all_reduce always; all_gather with
    ``input`` block ``rank`` of ``output``) runs the algorithm's in-place form where one verifies
    (see :mod:`taccl_py.runtime.executor.inplace_calls`) without copying the rank's block; an aliased
    reduce_scatter runs on a copy, leaving the input's other blocks as torch's backends do. Every
    rank must alias alike: the two forms may differ in rounds.
    The Communicator must be the only user of its group while a call runs.

    What the first call costs: with the automatic calibration, the first call of each collective
    the library has algorithms for times ours against the group's own (5 pairs of calls at each
    size of 64 KB-64 MB, steps of 4x, that an algorithm runs; 3-5 s on 4 gloo CPU ranks), or reads
    rank 0's cache (see :mod:`~taccl_py.runtime.communicator.calibration_cache`). Every rank must make that
    first call alike. :meth:`algorithm_for` ignores this calibration (``automatic_calibration``).
    """

    __slots__ = (
        "group",
        "rank",
        "world_size",
        "transport",
        "timeout_s",
        "cuda_graphs",
        "_executors",
        "_dataflows",
    )

    def __init__(
        self,
        process_group: Any = None,
        library: Any = None,
        *,
        topology: str | None = None,
        nodes: int | None = None,
        transport: Any = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        verify: bool = True,
        calibration: Any = True,
        cuda_graphs: bool = False,
        cluster: Any = None,
        nic_down: Any = (),
        nic_speed: Any = (),
        sysfs_root: str | os.PathLike | None = "/",
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise TransportError(
                "torch.distributed is not initialised; call init_process_group first or use Communicator.from_env()"
            )
        if not timeout_s > 0:
            raise ArgumentError(_SOURCE, "timeout_s", f"{timeout_s!r}", "a positive number of seconds")
        self.group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        self._collect_choices(library, topology, nodes, cluster, nic_down, nic_speed, sysfs_root)
        if verify:
            from taccl_py.verify import check_algorithm

            for algorithm in {id(c.algorithm): c.algorithm for c in self.choices.candidates if c.algorithm}.values():
                check_algorithm(algorithm)
        self.transport = _make_transport(transport, process_group)
        if (self.transport.rank, self.transport.world_size) != (self.rank, self.world_size):
            raise ArgumentError(
                _SOURCE,
                "transport",
                f"rank {self.transport.rank} of {self.transport.world_size}",
                f"rank {self.rank} of {self.world_size} as in the group",
            )
        self.timeout_s = float(timeout_s)
        self.cuda_graphs = False
        if cuda_graphs:
            unsupported = graph_support(self.transport.device, self.transport)
            if unsupported is not None:
                logger.warning("CUDA graphs are off: %s; every call runs eagerly", unsupported)
            self.cuda_graphs = unsupported is None
        self._executors: OrderedDict[tuple, Executor] = OrderedDict()
        self._dataflows: dict[int, Dataflow] = {}
        self._use_calibration(calibration)

    def __getstate__(self) -> None:
        raise TypeError("a Communicator holds a process group and cannot be pickled; build one in each process")

    @classmethod
    def from_env(
        cls, library: Any = None, *, backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs: Any
    ) -> Communicator:
        """Return a Communicator on the default group, initialising it from torchrun's env vars if needed.

        Reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (and LOCAL_RANK for the CUDA device);
        ``backend`` defaults to :func:`default_backend`'s choice. Other keywords go to the constructor.
        A group initialised here is destroyed at interpreter exit: a gloo group left to the exit
        aborts the process now and then (torch 2.13: SIGABRT in about half of 4-rank torchrun runs).
        Without a ``cluster`` keyword the live cluster comes from TACCL_CLUSTER, TACCL_NIC_DOWN,
        TACCL_NIC_SPEED, TACCL_SYSFS_ROOT and TACCL_NIC_PROBE (see :mod:`taccl_py.runtime.communicator.live_cluster`).
        """
        if not dist.is_initialized():
            missing = [name for name in _ENV_VARS if name not in os.environ]
            if missing:
                raise ArgumentError(
                    "environment",
                    ", ".join(missing),
                    "not set",
                    "the variables torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)",
                )
            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
            backend = backend or default_backend(os.environ, gpus)
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s))
            atexit.register(_destroy_default_group)
        if "cluster" not in kwargs:
            kwargs["cluster"] = declared_from_env(os.environ)
        kwargs.setdefault("sysfs_root", sysfs_root_from_env(os.environ))
        return cls(None, library, timeout_s=timeout_s, **kwargs)

    def _executor(self, algorithm: Algorithm, dtype: Any, numel: int, device: Any) -> Executor:
        key = (id(algorithm), dtype, numel, str(device))
        executor = self._executors.get(key)
        if executor is None:
            flow = self._dataflows.get(id(algorithm))
            if flow is None:
                flow = self._dataflows[id(algorithm)] = build_dataflow(algorithm)
            independent = self.transport.independent_messages
            executor = Executor(
                algorithm,
                self.rank,
                dtype,
                numel,
                device,
                flow,
                prepost_receives=independent,
                segment_bytes=DEFAULT_SEGMENT_BYTES if independent else None,
            )
            self._executors[key] = executor
            while len(self._executors) > MAX_CACHED_EXECUTORS:
                self._executors.popitem(last=False)
        else:
            self._executors.move_to_end(key)
        return executor

    # -- checks -----------------------------------------------------------------------------------

    def _check(self, what: str, output: Any, input: Any, ratio: tuple[int, int]) -> None:
        """Raise ArgumentError unless the tensors fit: numel(output) * ratio[0] == numel(input) * ratio[1]."""
        check_tensors(what, output, input, self.transport.device, self.transport.name)
        if output.numel() * ratio[0] != input.numel() * ratio[1]:
            want = input.numel() * ratio[1] // ratio[0]
            raise ArgumentError(
                _SOURCE,
                f"{what}.output",
                f"{output.numel()} elements for an input of {input.numel()} on {self.world_size} ranks",
                f"{want} elements",
            )

    # -- collectives ------------------------------------------------------------------------------

    def all_gather(self, output: Any, input: Any) -> None:
        """Gather every rank's ``input`` into ``output`` (rank-major); ``output`` has world_size times its elements."""
        self._check("all_gather", output, input, (1, self.world_size))
        self._run(Collective.ALLGATHER, output, input, "sum", input.numel())

    def reduce_scatter(self, output: Any, input: Any, op: Any = "sum") -> None:
        """Reduce ``input`` over ranks and keep block ``rank`` in ``output`` (world_size times fewer elements)."""
        name = op_name(op)
        self._check("reduce_scatter", output, input, (self.world_size, 1))
        self._run(Collective.REDUCESCATTER, output, input, name, output.numel())

    def all_reduce(self, tensor: Any, op: Any = "sum") -> None:
        """Reduce ``tensor`` over ranks in place."""
        name = op_name(op)
        self._check("all_reduce", tensor, tensor, (1, 1))
        self._run(Collective.ALLREDUCE, tensor, tensor, name, tensor.numel())

    def all_to_all(
        self,
        output: Any,
        input: Any,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
    ) -> None:
        """Send block j of ``input`` to rank j, where it lands in block ``rank`` of ``output``.

        Parameters
        ----------
        output, input : torch.Tensor
            Contiguous tensors of one dtype, cut along their first dimension into one block per rank.
        output_split_sizes, input_split_sizes : sequence of int, optional
            Rows of the first dimension per rank, as for ``torch.distributed.all_to_all_single``
            (None: equal blocks). Given split sizes, even equal ones, run the group's own
            ``all_to_all_single``, with one log line: the algorithms move equal blocks, and only a
            call without splits promises them on every rank.

        Raises
        ------
        ArgumentError
            A tensor is not a contiguous tensor of a supported dtype on the transport's device, the
            dtypes differ, the split sizes are not one per rank or do not add up to the first
            dimension, or (equal blocks) the tensors differ in size or their first dimension does
            not split into world_size blocks.

        Notes
        -----
        Every rank must pass split sizes, or none: the two take different paths.
        """
        given = splits_given(output_split_sizes) or splits_given(input_split_sizes)
        if given:
            check_tensors("all_to_all", output, input, self.transport.device, self.transport.name)
        else:  # equal blocks: the tensors must be the same size too
            self._check("all_to_all", output, input, (1, 1))
        check_split_sizes("all_to_all", "input", input_split_sizes, input, self.world_size)
        check_split_sizes("all_to_all", "output", output_split_sizes, output, self.world_size)
        if given:
            self._log_split_sizes(output_split_sizes, input_split_sizes)
            dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group=self.group)
            return
        self._run(Collective.ALLTOALL, output, input, "sum", input.numel() // self.world_size)

    def _run(self, collective: Collective, output: Any, input: Any, op: str, numel: int) -> None:
        if numel == 0:
            return
        size_bytes = collective_size_bytes(
            collective, input.numel() * input.element_size(), output.numel() * output.element_size()
        )
        candidate, algorithm = self._choose_for_call(collective, size_bytes)
        if algorithm is None:
            if candidate is None:  # a band or calibration that chose "native" needs no word
                self._log_fallback(collective, size_bytes)
            self._torch_collective(collective, output, input, op)
            return
        inplace_call = is_inplace_call(collective, output, input, self.rank)
        algorithm = self._form_for_call(collective, algorithm, inplace_call)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s of %d bytes runs %s", collective.value, size_bytes, describe_form(algorithm, inplace_call))
        plans = getattr(self.transport, "plan_runner", None)  # the mscclpp transport's whole-call plans
        if plans is not None and plans.run(collective, output, input, op, algorithm, candidate):
            return
        executor = self._executor(algorithm, input.dtype, numel, input.device)
        executor.run(output, input, self.transport, op, self.timeout_s, cuda_graph=self.cuda_graphs)

    def _torch_collective(self, collective: Collective, output: Any, input: Any, op: str) -> None:
        """Run torch.distributed's own collective on the group (avg as sum then divide, like the executor)."""
        native_collective(collective, output, input, op, self.group)
