"""TacclProcessGroup: the ``taccl`` backend's process group, and which of its calls a Communicator runs.

The group makes an inner gloo/NCCL backend per device for the calls it does not route, a second
backend of the same kind per device (a :class:`~taccl_py.runtime.backend.work.BackendTransport`)
for the Communicator's messages, and the :class:`~taccl_py.runtime.backend.issue_order.IssueOrder` that
runs its calls in the order they were issued; it resolves the live cluster and decides per call
whether a Communicator runs it, calibrates, and orders ``barrier`` after the calls before it.
Its collective methods, the ones torch calls, are in :mod:`taccl_py.runtime.backend.collectives`;
the backend's registration and its notes on routing, threads, calibration and the cluster are in
:mod:`taccl_py.runtime.backend`.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from taccl_py.errors import ArgumentError, TacclError
from taccl_py.ir.collectives import Collective
from taccl_py.runtime.backend.collectives import CollectiveEntryPoints
from taccl_py.runtime.backend.issue_order import IssueOrder
from taccl_py.runtime.backend.work import BackendTransport, make_backend
from taccl_py.runtime.communicator import Communicator
from taccl_py.runtime.communicator.calibration import Calibration
from taccl_py.runtime.communicator.group_log import group_warning_level
from taccl_py.runtime.communicator.group_match import GroupMatch, group_candidates
from taccl_py.runtime.communicator.live_cluster import (
    DeclaredCluster,
    LiveCluster,
    declare_cluster,
    ports_to_json,
    resolve_live_cluster,
    warn_other_cluster,
)
from taccl_py.runtime.communicator.selection import AlgorithmChoices, Candidate, collect_algorithms, match_cluster
from taccl_py.runtime.executor import SUPPORTED_DTYPES

__all__ = ["BACKEND_NAME", "TacclProcessGroup"]

# The group's log lines keep the backend's logger name, the one users listen to.
logger = logging.getLogger("taccl_py.runtime.backend")

#: The name ``init_process_group`` takes.
BACKEND_NAME = "taccl"


def _device_kinds() -> dict[str, tuple[str, torch.device]]:
    """Return device type -> (inner backend kind, the device routed tensors must be on)."""
    kinds = {"cpu": ("gloo", torch.device("cpu"))}
    if torch.cuda.is_available() and dist.is_nccl_available():
        # the device the process chose (torch.cuda.set_device) before creating the group
        kinds["cuda"] = ("nccl", torch.device("cuda", torch.cuda.current_device()))
    return kinds


class TacclProcessGroup(CollectiveEntryPoints, dist.ProcessGroup):
    """A process group whose all-reduce, all-gather, reduce-scatter and all-to-all run taccl_py algorithms.

    Made by the backend creator that :func:`~taccl_py.runtime.backend.register_backend` installs;
    see the notes of :mod:`taccl_py.runtime.backend` for what is routed and how. ``routed`` counts
    the calls per collective that ran an algorithm and ``delegated`` the calls of those collectives
    that went to the inner backend; ``global_ranks`` are its members and ``library_matches`` say
    which libraries serve them, per collective (see :mod:`taccl_py.runtime.communicator.group_match`).

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
    calibration : bool
        Whether the Communicator calibrates on each collective's first call (see ``register_backend``).
    global_ranks : sequence of int, optional
        The members' ranks in the job, in group-rank order (None: the job itself, 0..world_size-1).
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
        calibration: bool = True,
        global_ranks: Sequence[int] | None = None,
    ) -> None:
        super().__init__(rank, world_size)
        self._timeout_s = float(timeout.total_seconds())
        self._cluster: LiveCluster | None = None
        self._warned: set[tuple] = set()
        self.global_ranks = tuple(range(world_size)) if global_ranks is None else tuple(global_ranks)
        job_size = world_size if global_ranks is None else _job_size(self.global_ranks)
        other_cluster = False
        if cluster is not None:
            try:
                self._cluster = _resolve_cluster(
                    store, rank, self.global_ranks, job_size, (cluster, nic_down, nic_speed, sysfs_root)
                )
            except ArgumentError as error:
                if error.field != "world_size":
                    raise
                logger.info("taccl group of %d ranks: %s; its collectives run on the inner backend", world_size, error)
                other_cluster = True
        if not isinstance(calibration, bool):  # a file is measured on request: group.calibrate(path)
            raise ArgumentError(BACKEND_NAME, "calibration", repr(calibration), "True or False")
        served, self._choices, self.library_matches = (), None, ()
        if not other_cluster:
            served, self._choices, self.library_matches = _group_choices(
                library, topology, nodes, self.global_ranks, job_size, self._cluster, rank
            )
        # The Communicator gets the candidates already matched to the members, nothing else.
        self._spec = (served, None, nodes, self._cluster, calibration)
        self._has_algorithms = self._choices is not None and bool(self._choices.candidates)
        self._links: dict[str, BackendTransport] = {}
        self._communicators: dict[str, Communicator] = {}
        self.routed: Counter = Counter()
        self.delegated: Counter = Counter()
        default_type = None
        kinds = _device_kinds()
        self._has_cuda_backend = "cuda" in kinds
        for device_type, (kind, device) in kinds.items():
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
        self._set_default_backend(default_type)
        self._order = IssueOrder(f"taccl-pg-rank{rank}", self._has_algorithms)

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
        if link is None or size_bytes == 0 or self._order.in_routed_call():
            if link is None and size_bytes:
                self._warn_other_cluster(collective, size_bytes)
            return None
        if link.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            self._log_capture(collective)
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
        algorithm = communicator.algorithm_for(collective, size_bytes)
        if algorithm is None:
            self._warn_other_cluster(collective, size_bytes)
            return None
        # Once the automatic calibration settled the collective, a size it gives to the inner
        # backend goes there directly. Ranks may see it settle at different calls; the call then
        # runs the inner backend's collective either way, in the same place of the worker's order.
        measured = communicator.automatic_calibration
        if measured is not None and measured.native_faster(collective, size_bytes, algorithm.name):
            return None
        return communicator

    def _warn_other_cluster(self, collective: Collective, size_bytes: int) -> None:
        """Warn once per collective when the libraries had an algorithm for this call, but for another cluster."""
        if self._cluster is not None and self._choices is not None:
            warn_other_cluster(logger, self._choices, self._cluster, collective, size_bytes, self._warned, self.rank())

    def _log_split_sizes(self, tensor: torch.Tensor) -> None:
        """Say once, where the group could route all_to_all_single, that calls with split sizes run elsewhere."""
        key = (Collective.ALLTOALL, "split sizes")
        routes = self._choices is not None and Collective.ALLTOALL in self._choices.collectives
        if key in self._warned or not routes or tensor.device.type not in self._links:
            return
        self._warned.add(key)
        logger.log(
            group_warning_level(self.rank()),
            "all_to_all_single with split sizes on %d ranks: taccl algorithms move equal blocks, which only a "
            "call without split sizes promises on every rank; running the inner %s backend's own (logged once)",
            self.size(),
            "NCCL" if tensor.device.type == "cuda" else "gloo",
        )

    def _communicator_on(self, link: BackendTransport) -> Communicator:
        """Return the group's Communicator for ``link``'s device, made on first use."""
        communicator = self._communicators.get(link.device.type)
        if communicator is None:
            if link.device.type == "cuda":
                # NCCL's first batched p2p call needs every rank, and a round may not have them all.
                # Every rank comes here at the same call, the group's first routed one on the GPU;
                # as ProcessGroupNCCL, a group whose tensors stay on the CPU never makes the NCCL link.
                link.warm_up()
            library, topology, nodes, cluster, calibration = self._spec
            communicator = Communicator(
                self,
                library,
                topology=topology,
                nodes=nodes,
                transport=link,
                timeout_s=self._timeout_s,
                cluster=cluster,
                calibration=calibration,
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
        measured = self._order.worker.submit(partial(_calibrate_or_error, communicator, path, options)).wait()
        if isinstance(measured, BaseException):
            raise measured
        return measured

    def _log_capture(self, collective: Collective) -> None:
        """Say once per collective that calls captured into a CUDA graph run on the inner NCCL backend."""
        key = (collective, "capture")
        if key not in self._warned:
            self._warned.add(key)
            logger.info(
                "%s called while a CUDA graph is captured: it runs on the inner NCCL backend, whose calls "
                "can be captured (logged once)",
                collective.value,
            )

    def _submit(
        self, collective: Collective, job: Callable[[], list[torch.Tensor]], tensors: tuple[torch.Tensor, ...]
    ) -> Any:
        """Run ``job``, a routed call on ``tensors`` (its inputs and outputs), in issue order; return its Work."""
        self.routed[collective.value] += 1
        return self._order.routed(job, tensors)

    def _delegate(self, collective: Collective, method: str, tensor: torch.Tensor, *args: Any) -> Any:
        self.delegated[collective.value] += 1
        return self._call_inner(tensor.device, method, args)

    def _call_inner(self, device: torch.device, method: str, args: tuple, kwargs: dict[str, Any] | None = None) -> Any:
        """Run the inner backend's ``method`` after the calls issued before it (see IssueOrder); return its Work."""
        return self._order.inner(getattr(self._get_backend(device), method), method, device, args, kwargs or {})

    # -- ordering and lifetime --------------------------------------------------------------------

    def barrier(self, opts: Any = None) -> Any:
        """Wait for the routed collectives queued so far, then run the inner backend's barrier.

        On a group with GPUs that is NCCL's, on the device (after the routed calls on the stream);
        else gloo's.
        """
        self._order.flush()
        opts = dist.BarrierOptions() if opts is None else opts
        device = torch.device("cuda") if self._has_cuda_backend else torch.device("cpu")
        return self._get_backend(device).barrier(opts)

    def shutdown(self) -> None:
        """Stop the worker, close the routed collectives' links and shut the inner backends down."""
        self._order.close()
        for link in self._links.values():
            link.close()
        self._links.clear()
        dist.ProcessGroup.shutdown(self)


def _calibrate_or_error(
    communicator: Communicator, path: str | os.PathLike | None, options: dict[str, Any]
) -> Calibration | Exception:
    try:
        if path is None:
            return communicator.calibrate(**options)
        return communicator.load_or_calibrate(path, **options)
    except TacclError as error:
        return error


def _group_choices(
    library: Any,
    topology: str | None,
    nodes: int | None,
    ranks: tuple[int, ...],
    job_size: int,
    cluster: LiveCluster | None,
    rank: int,
) -> tuple[tuple[Candidate, ...], AlgorithmChoices, tuple[GroupMatch, ...]]:
    """Return the candidates serving the members ``ranks``, those made for ``cluster`` (None: any), and the matches.

    ``rank`` is this process's rank in the group (rank 0 logs the matches at INFO).

    Raises ``ArgumentError`` for a spec that names nothing readable.
    """
    served, matches = group_candidates(library, ranks, job_size, topology=topology, nodes=nodes)
    level = logging.INFO if rank == 0 else logging.DEBUG  # once per group, not once per member
    what = "; ".join(match.describe() for match in matches) or "no library serves them, all run on the inner backend"
    logger.log(level, "taccl group of ranks %s: %s", list(ranks), what)
    choices = collect_algorithms(served, len(ranks))
    return served, (choices if cluster is None else match_cluster(choices, cluster.fingerprint)), matches


def _job_size(ranks: tuple[int, ...]) -> int:
    """Return the job's rank count for a subgroup of global ``ranks`` (the default group's size once it exists)."""
    return dist.get_world_size() if dist.is_initialized() else max(ranks) + 1


def _resolve_cluster(
    store: Any, rank: int, ranks: tuple[int, ...], job_size: int, declared: tuple[Any, Any, Any, Any]
) -> LiveCluster:
    """Return the job's live cluster, the NIC ports exchanged among this group's members on its store.

    ``declared`` is (cluster, nic_down, nic_speed, sysfs_root) as ``resolve_live_cluster`` takes them.
    """
    cluster, nic_down, nic_speed, sysfs_root = declared
    if not isinstance(cluster, (LiveCluster, DeclaredCluster)):
        cluster = declare_cluster(cluster, nic_down, nic_speed)
    per_node = cluster.topology.gpus_per_node if isinstance(cluster, DeclaredCluster) else 1
    exchange = partial(_exchange_on_store, store, rank, ranks, job_size, per_node)
    return resolve_live_cluster(cluster, nic_down, nic_speed, sysfs_root, job_size, exchange)


def _exchange_on_store(
    store: Any, rank: int, ranks: tuple[int, ...], job_size: int, per_node: int, text: str
) -> list[str]:
    """Return ``text`` per job rank, passed among the members through the group's store (no collective needed).

    Node k takes its first rank's ports (``live_cluster``): a member on node k stands in for it (one
    machine, one sysfs); a node without members shows none and stays as declared.
    """
    store.set(f"taccl/nic-ports/{rank}", text)
    texts = {member: store.get(f"taccl/nic-ports/{index}").decode() for index, member in enumerate(ranks)}
    by_node: dict[int, str] = {}
    for member in ranks:
        by_node.setdefault(member // per_node, texts[member])
    return [texts.get(r, by_node.get(r // per_node, ports_to_json(()))) for r in range(job_size)]
