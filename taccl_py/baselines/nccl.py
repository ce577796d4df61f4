"""NCCL's own algorithms as baselines: those our IR cannot write as schedules, modelled, and NCCL's best per size.

NCCL runs some algorithms no point-to-point schedule expresses. They are modelled here from
NCCL's tuning and the topology's rates, as a time per size with the lower bound that holds for
it, and compete in ``compare_baselines`` for the fastest baseline (what every printed ratio is
against) but never for the one a library may write in a band's place:

* ``nccl-nvls`` (AllReduce on one machine whose NVSwitch reduces) and ``nccl-nvls-tree`` (across
  machines): ``baselines.nvls``; bound: the in-network reduction bound (``bounds.reduction``).
* ``nccl-nvls`` (AllGather and ReduceScatter on one such machine, NCCL 2.19+): AllGather stores each
  GPU's slice to the multicast address (``multimem.st``: the switch delivers it to every member,
  the writer included), ReduceScatter asks the switch for the sum of its slice
  (``multimem.ld_reduce``: the switch reads it from every member, the caller included). A GPU's
  switch port takes in (AllGather) or sends out (ReduceScatter) the whole buffer M, every slice
  its own included, and M/G the other way::

      time = α_switch + M / B_switch

  with B_switch and α_switch as for NVLS AllReduce (``nvls_switch_rate``). NCCL's own tuning charges
  the same M (its NVLS AllGather/ReduceScatter bandwidth is not scaled by N/(N-1) as a ring's is),
  so a ring, which moves (N-1)/N M over faster point-to-point links, ties or beats it in bandwidth:
  NVLS does not cut AllGather/ReduceScatter time, as NCCL's maintainers say. Across machines NCCL
  runs NVLS AllGather/ReduceScatter only with CollNet (IB SHARP), which no built-in machine has.
  Bound: the cut bound (``bounds.lower_bounds``): the switch rate is at most the GPU's link rate,
  so M / B_switch >= (N-1)/N M / B_link.
* ``nccl-pat`` (AllGather and ReduceScatter with one GPU per machine, NCCL 2.23+, Parallel
  Aggregated Trees): a Bruck-like exchange of ceil(log2 N) steps whose bytes add up to a ring's::

      time = ceil(log2 N) α_net + (N-1)/N M / B_net

  with B_net and α_net the narrowest bandwidth and largest α of a GPU's route to another machine.
  Bound: the cut bound (each machine takes in (N-1)/N M through its NIC).

Sources: NVIDIA/nccl ``src/graph/tuning.cc`` @b6475625 (v2.20.3): NVLS among ReduceScatter's and
AllGather's algorithms, Simple protocol only, NVLS disabled above one node without CollNet, its
AllGather/ReduceScatter bandwidth not converted by the ring's nRanks/nsteps; @68b54236 (v2.23.4):
PAT among AllGather's and ReduceScatter's algorithms, ``ncclPatEnable`` only when
``nNodes == nRanks`` (one GPU per node; still so at @5067397c, ``tuning.cc`` l. 220), latency
``log2i(nNodes) * interLat / 3.5 + 2.8 * nRanks`` plus ``baseLat`` (``baselines.closed_form`` holds
NCCL's latency table and ``nccl_latency_us``; the PAT model here keeps the route's α per step).
Release notes: NVLS AllGather/ReduceScatter in NCCL 2.19 (docs.nvidia.com/deeplearning/nccl/
release-notes/rel_2-19-3.html), PAT in 2.23 (rel_2-23-4.html).

``nccl_best_times`` gives, per size, the fastest of NCCL's own algorithms there: its ring and
double binary tree (built and simulated as the ``ring`` and ``tree`` baselines, whose channel
counts follow NCCL's; above ``CLOSED_FORM_ABOVE_RANKS`` GPUs of identical machines modelled in
closed form instead, ``baselines.closed_form``, named ``nccl-ring-...``/``nccl-tree-...``), the
direct exchange for AlltoAll, and the modelled ones above.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from taccl_py.baselines.build import BaselineKind, build_baseline, size_groups
from taccl_py.baselines.closed_form import closed_form_applies, closed_form_times
from taccl_py.baselines.nvls import NVLS, has_nvls, nvls_allreduce_times, nvls_switch_rate
from taccl_py.bounds import checked_sizes, lower_bounds
from taccl_py.ir.collectives import Collective, bus_factor, parse_collective
from taccl_py.simulate import (
    DEFAULT_MODEL,
    ExecutionModel,
    SimulationResult,
    prepare_simulation,
    simulate_plan,
)
from taccl_py.topology.model import Topology, route
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = [
    "NCCL_NVLS",
    "NCCL_NVLS_TREE",
    "NCCL_PAT",
    "MODELLED_RESULT_MODEL",
    "ModelledBaseline",
    "ModelledTime",
    "NcclChoice",
    "closed_form_applies",
    "closed_form_times",
    "is_schedule",
    "modelled_results",
    "nccl_best_times",
    "nccl_modelled_times",
    "nvls_gather_scatter_times",
    "pat_times",
]

NCCL_NVLS, NCCL_NVLS_TREE, NCCL_PAT = "nccl-nvls", "nccl-nvls-tree", "nccl-pat"
# ``SimulationResult.model`` of a modelled time: no execution model of ours timed it.
MODELLED_RESULT_MODEL = "nccl-model"


@dataclass(frozen=True)
class ModelledBaseline:
    """A baseline NCCL runs that no schedule of ours can write: a name and a collective, never loaded or exported.

    It stands where an ``Algorithm`` stands in ``ComparedBaseline.fastest``; ``is_schedule`` is False
    (``Algorithm`` has none: ``is_schedule`` below tells the two apart).
    """

    name: str
    collective: Collective
    num_ranks: int
    is_schedule: bool = False


def is_schedule(baseline: object) -> bool:
    """Return False for a ``ModelledBaseline`` (it cannot be written), True for an ``Algorithm``."""
    return getattr(baseline, "is_schedule", True)


@dataclass(frozen=True)
class ModelledTime:
    """One modelled NCCL algorithm at one size (µs), with the lower bound that holds for it."""

    algorithm: str
    collective: Collective
    size_bytes: int
    num_ranks: int
    time_us: float
    alpha_us: float
    bound_time_us: float

    @property
    def algbw_GBps(self) -> float:
        """Return size / time in GB/s, as nccl-tests reports it."""
        return self.size_bytes / (self.time_us * BYTES_PER_US_PER_GBPS)

    @property
    def busbw_GBps(self) -> float:
        """Return algbw times nccl-tests' bus factor of the collective (GB/s)."""
        return self.algbw_GBps * bus_factor(self.collective, self.num_ranks)

    @property
    def fraction_of_bound(self) -> float:
        """Return the bound over the modelled time (1.0: optimal)."""
        return self.bound_time_us / self.time_us


@dataclass(frozen=True)
class NcclChoice:
    """NCCL's fastest algorithm at one size among its own (``nccl_best_times``): its name and time (µs)."""

    size_bytes: int
    name: str
    time_us: float


def nvls_gather_scatter_times(
    topology: Topology, collective: Collective | str, sizes_bytes: Iterable[int]
) -> tuple[ModelledTime, ...]:
    """Return NCCL's NVLS AllGather or ReduceScatter on one machine, modelled: α_switch + M / B_switch (µs).

    Empty where NCCL would not run it: another collective, several machines, or no reducing switch.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> (one,) = nvls_gather_scatter_times(load_topology("dgx-h100"), "allgather", [2**30])
    >>> one.algorithm, round(one.algbw_GBps, 1), round(one.fraction_of_bound, 3)
    ('nccl-nvls', 308.2, 0.728)
    """
    collective = parse_collective(collective)
    sizes = checked_sizes(topology, sizes_bytes)
    if collective not in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        return ()
    if topology.nodes != 1 or not has_nvls(topology):
        return ()
    rate_GBps, alpha_us = nvls_switch_rate(topology)
    bounds = lower_bounds(topology, collective, sizes)
    return tuple(
        ModelledTime(
            NCCL_NVLS,
            collective,
            size,
            topology.num_ranks,
            float(alpha_us + size / (rate_GBps * BYTES_PER_US_PER_GBPS)),
            float(alpha_us),
            bound.time_us,
        )
        for size, bound in zip(sizes, bounds)
    )


def pat_times(topology: Topology, collective: Collective | str, sizes_bytes: Iterable[int]) -> tuple[ModelledTime, ...]:
    """Return NCCL's PAT AllGather or ReduceScatter, modelled: ceil(log2 N) α_net + (N-1)/N M / B_net (µs).

    Empty where NCCL would not run it: another collective, or not one GPU on each of several machines.
    """
    collective = parse_collective(collective)
    sizes = checked_sizes(topology, sizes_bytes)
    if collective not in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        return ()
    if topology.gpus_per_node != 1 or topology.nodes < 2:
        return ()
    n = topology.num_ranks
    # PAT's peers sit at every distance 2^k; the slowest route of any pair bounds every step.
    routes = [route(topology, src, dst) for src in range(n) for dst in range(n) if src != dst]
    net_GBps = min(r.bandwidth_GBps for r in routes)
    steps = math.ceil(math.log2(n))
    alpha_us = steps * max(r.alpha_us for r in routes)
    bounds = lower_bounds(topology, collective, sizes)
    return tuple(
        ModelledTime(
            NCCL_PAT,
            collective,
            size,
            n,
            float(alpha_us + (n - 1) / n * size / (net_GBps * BYTES_PER_US_PER_GBPS)),
            float(alpha_us),
            bound.time_us,
        )
        for size, bound in zip(sizes, bounds)
    )


def nccl_modelled_times(
    topology: Topology, collective: Collective | str, sizes_bytes: Iterable[int]
) -> dict[str, tuple[ModelledTime, ...]]:
    """Return, by name, every modelled NCCL algorithm that applies to ``collective`` on ``topology``, per size.

    Empty where none applies (no reducing switch, several GPUs per machine for PAT, AlltoAll).

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> list(nccl_modelled_times(load_topology("dgx-h100", nodes=2), "allreduce", [2**20]))
    ['nccl-nvls-tree']
    >>> nccl_modelled_times(load_topology("dgx-a100"), "allreduce", [2**20])
    {}
    """
    collective = parse_collective(collective)
    sizes = checked_sizes(topology, sizes_bytes)
    found: dict[str, tuple[ModelledTime, ...]] = {}
    if not sizes:
        return found
    if collective is Collective.ALLREDUCE and has_nvls(topology):
        times = nvls_allreduce_times(topology, sizes)
        name = NCCL_NVLS if times[0].algorithm == NVLS else NCCL_NVLS_TREE
        found[name] = tuple(
            ModelledTime(name, collective, t.size_bytes, t.num_ranks, t.time_us, t.alpha_us, t.bound_time_us)
            for t in times
        )
    for times in (nvls_gather_scatter_times(topology, collective, sizes), pat_times(topology, collective, sizes)):
        if times:
            found[times[0].algorithm] = times
    return found


def modelled_results(
    topology: Topology,
    collective: Collective | str,
    sizes_bytes: Iterable[int],
    model: ExecutionModel = DEFAULT_MODEL,
    bounds_us: Mapping[int, float] | None = None,
) -> tuple[tuple[ModelledBaseline, tuple[SimulationResult, ...]], ...]:
    """Return each modelled NCCL algorithm as a ``ModelledBaseline`` with a ``SimulationResult`` per size.

    The results carry the modelled time and the bound that holds for it, no link usage and no
    transfers, and ``model`` ``nccl-model``: what ``compare_baselines`` sets beside simulated baselines.
    Above ``CLOSED_FORM_ABOVE_RANKS`` GPUs of identical machines NCCL's ring and tree join them in
    closed form (``closed_form_times``; the faster per size, at the sizes where it is faster),
    under ``model``, against ``bounds_us`` (µs by size; computed when None). A baseline absent at
    some sizes carries results for the others only.
    """
    collective = parse_collective(collective)
    sizes = checked_sizes(topology, sizes_bytes)
    out = []
    for name, times in nccl_modelled_times(topology, collective, sizes).items():
        baseline = ModelledBaseline(name, collective, topology.num_ranks)
        out.append((baseline, tuple(_as_result(topology, t) for t in times)))
    closed = closed_form_times(topology, collective, sizes, model)
    if closed is not None:
        if bounds_us is None:
            bounds_us = {size: bound.time_us for size, bound in zip(sizes, lower_bounds(topology, collective, sizes))}
        by_name: dict[str, list[tuple[int, ModelledTime]]] = {}
        for size, name, time_us in closed:
            entry = ModelledTime(name, collective, size, topology.num_ranks, time_us, 0.0, bounds_us[size])
            by_name.setdefault(name, []).append((size, entry))
        for name, entries in by_name.items():
            out.append(
                (
                    ModelledBaseline(name, collective, topology.num_ranks),
                    tuple(_as_result(topology, t) for _, t in entries),
                )
            )
    return tuple(out)


def _as_result(topology: Topology, time: ModelledTime) -> SimulationResult:
    return SimulationResult(
        algorithm=time.algorithm,
        topology=topology.name,
        collective=time.collective,
        num_ranks=time.num_ranks,
        size_bytes=time.size_bytes,
        time_us=time.time_us,
        algbw_GBps=time.algbw_GBps,
        busbw_GBps=time.busbw_GBps,
        bound_time_us=time.bound_time_us,
        fraction_of_bound=time.fraction_of_bound,
        num_transfers=0,
        link_usage=(),
        model=MODELLED_RESULT_MODEL,
    )


def nccl_best_times(
    topology: Topology,
    collective: Collective | str,
    sizes_bytes: Iterable[int],
    *,
    model: ExecutionModel = DEFAULT_MODEL,
) -> tuple[NcclChoice, ...]:
    """Return, per size, NCCL's fastest algorithm among its own and its time (µs).

    NCCL's own algorithms only: its ring (the ``ring`` baseline, NCCL's channel counts, simulated
    under ``model``), its double binary tree (AllReduce: the ``tree`` baseline), the direct exchange
    (AlltoAll), and the modelled ones (``nccl_modelled_times``: NVLS, NVLS-Tree, PAT). Not our
    hierarchical or packed-tree baselines. Ties go to the earlier of ring, tree, modelled.

    Parameters
    ----------
    topology : Topology
        The machine(s).
    collective : Collective or str
        allgather, reducescatter, allreduce or alltoall.
    sizes_bytes : iterable of int
        Buffer sizes (bytes, nccl-tests' convention).
    model : ExecutionModel, optional
        How the ring and tree are simulated (default MSCCL's loop).

    Returns
    -------
    tuple of NcclChoice
        One per size, in the order given.

    Notes
    -----
    Each ring and tree is built and prepared once (a tree once per pipeline depth) and replayed at
    its sizes. Where the lower bound every point-to-point schedule is held to (``lower_bounds``)
    exceeds a modelled time, no ring or tree is simulated at that size: none could be the fastest
    (large AllReduce on a reducing switch, where a 72-GPU ring takes seconds per size). The bounds
    are computed once for all sizes and handed to the simulator.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> [(c.name, round(c.time_us, 1)) for c in nccl_best_times(load_topology("dgx-h100"), "allreduce", [2**26])]
    [('nccl-nvls', 248.7)]
    """
    collective = parse_collective(collective)
    sizes = checked_sizes(topology, sizes_bytes)
    if not sizes:
        return ()
    kinds = (
        (BaselineKind.DIRECT,)
        if collective is Collective.ALLTOALL
        else (BaselineKind.RING,) + ((BaselineKind.TREE,) if collective is Collective.ALLREDUCE else ())
    )
    modelled = nccl_modelled_times(topology, collective, sizes)
    best: dict[int, tuple[str, float]] = {}
    for name, times in modelled.items():
        for time in times:
            _faster(best, time.size_bytes, name, time.time_us)
    found: dict[int, tuple[str, float]] = {}
    closed = closed_form_times(topology, collective, sizes, model)
    if closed is not None:  # many identical machines: the ring and tree in closed form, no bound needed
        kinds, found, simulated = (), {size: (name, time_us) for size, name, time_us in closed}, []
    else:
        bounds = dict(zip(sizes, (bound.time_us for bound in lower_bounds(topology, collective, sizes))))
        # Every ring and tree is held to the bound: where it exceeds a modelled time, none of them can win.
        simulated = [size for size in sizes if size not in best or bounds[size] <= best[size][1]]
    for kind in kinds:
        _, groups = size_groups(kind, topology, collective, simulated)
        for chunks, group in groups.items():
            if not group:
                continue
            algorithm = build_baseline(kind, topology, collective, chunks, size_bytes=group[-1])
            plan = prepare_simulation(algorithm, topology, model=model)
            for size in group:
                _faster(found, size, algorithm.name, simulate_plan(plan, size, bound_time_us=bounds[size]).time_us)
    # ties go to the ring or tree, as when they were compared first
    for size, (name, time_us) in found.items():
        if size not in best or time_us <= best[size][1]:
            best[size] = (name, time_us)
    return tuple(NcclChoice(size, *best[size]) for size in sizes)


def _faster(best: dict[int, tuple[str, float]], size: int, name: str, time_us: float) -> None:
    if size not in best or time_us < best[size][1]:
        best[size] = (name, float(time_us))
