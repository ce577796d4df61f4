"""Lower bounds on collective time: the cut bound with the α of its cheapest crossing, and the latency floor.

For AllGather of M bytes over N GPUs, the binding cut S (``cut``: the vertex set with the
most GPUs per GB/s leaving it, found by max-flow) must pass D = (M / N) |GPUs in S| bytes over
the links leaving it, whose capacity is C. ReduceScatter is the same on the reversed graph. So

    T >= max(α_S + D / C, latency floor)

with α_S the least α of a route from a GPU in S to a GPU outside it (ReduceScatter: into S) and
the latency floor the largest, over GPU pairs, of the least total α between them.

Why α_S may be added. Each of the D bytes is carried off S's GPUs by some transfer from
a GPU in S to a GPU outside (relays aside, the first hop that leaves is such a transfer), and a
transfer always takes its pair's ``route`` and spends that route's whole α, >= α_S. With
serialized sends (``taccl_py.simulate.engine``) the α comes before the bytes move, so the
boundary carries none of the D bytes before α_S and at most C bytes/µs after: the last crosses
no sooner than α_S + D / C. With pipelined sends the bytes move first and arrive α later: the
last crosses no sooner than D / C and arrives no sooner than α_S after that. The bound holds for
the topology's own α and bandwidths (the Simple protocol); LL and LL128 scale both
(``taccl_py.simulate.protocol``), so they can undercut it at small sizes, as they can the floor.

AllReduce's bound is the ReduceScatter + AllGather **class** bound: the two cuts' bandwidth terms
added, plus one α (the smaller cut's: a pipelined RS + AG may overlap the second α with the first
phase). It bounds algorithms that reduce-scatter and then all-gather point to point, every
schedule here; an in-network reduction (NVLink SHARP: ``bounds_reduction``) moves each byte about
once and can beat it. AlltoAll has its own cut (``bounds.alltoall``) and adds the α of the cheapest
route between its GPU set and the rest.

The cut-only bound, max(D / C, latency floor), a weaker bound without α_S, stays available as
``LowerBound.cut_only_time_us`` (JSON ``cut_only_*`` fields); no table prints it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import networkx as nx

from taccl_py.bounds.alltoall import alltoall_cut
from taccl_py.bounds.cut import CutBound, binding_cut, crossing_alpha_us, cut_bound, route_links
from taccl_py.bounds.symmetry import gpu_classes
from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective, parse_collective
from taccl_py.topology.model import Link, Topology

__all__ = [
    "ALLREDUCE_BOUND_NOTE",
    "IN_NETWORK_BOUND_NOTE",
    "checked_sizes",
    "make_lower_bound",
    "route_latency_floor_us",
    "CutBound",
    "LowerBound",
    "binding_cut",
    "bound_label",
    "latency_floor_us",
    "lower_bound",
    "lower_bounds",
    "lower_bounds_by_collective",
]

# The collectives bounded by the ReduceScatter cut (data into a set) and by the AllGather cut (out of it).
_USES_RS_CUT = frozenset({Collective.REDUCESCATTER, Collective.ALLREDUCE})
_USES_AG_CUT = frozenset({Collective.ALLGATHER, Collective.ALLREDUCE})
#: What a table says under AllReduce's bound: it holds for a class of algorithms only.
ALLREDUCE_BOUND_NOTE = (
    "allreduce: the ReduceScatter+AllGather class bound (point-to-point algorithms); "
    "in-network reduction such as NCCL's NVLS can beat it"
)
IN_NETWORK_BOUND_NOTE = (
    "allreduce: the in-network reduction bound, which holds for switch schedules and NCCL's NVLS too"
)


def bound_label(collective: Collective | str) -> str:
    """Return the short name of ``collective``'s bound for table headers: ``RS+AG bound`` for AllReduce, else ``bound``.

    >>> bound_label("allreduce"), bound_label("allgather")
    ('RS+AG bound', 'bound')
    """
    return "RS+AG bound" if parse_collective(collective) is Collective.ALLREDUCE else "bound"


@dataclass(frozen=True)
class LowerBound:
    """A lower bound on one collective's time at one size (µs), with the cut that binds it.

    ``time_us = max(bandwidth_time_us + cut_alpha_us, latency_floor_us)``; ``cut_only_time_us``
    is the weaker cut-only bound, ``max(bandwidth_time_us, latency_floor_us)``. For AllReduce (the
    ReduceScatter+AllGather class bound) the bandwidth term is the ReduceScatter one plus the
    AllGather one and ``cut`` is the AllGather cut.
    """

    collective: Collective
    size_bytes: int
    time_us: float
    bandwidth_time_us: float
    latency_floor_us: float
    cut: tuple[str, ...]
    cut_gpus: int
    cut_capacity_GBps: float
    description: str
    cut_alpha_us: float
    cut_only_time_us: float


def make_lower_bound(
    collective: Collective,
    size_bytes: int,
    bandwidth_time_us: float,
    cut_alpha_us: float,
    floor_us: float,
    cut: CutBound,
    description: str,
) -> LowerBound:
    """Return the ``LowerBound`` of a bandwidth term (µs), the α of its cut (µs) and the latency floor (µs).

    α is added only where bytes must move (a bandwidth term above 0): one GPU needs no time.
    """
    alpha_us = cut_alpha_us if bandwidth_time_us > 0 else 0.0
    return LowerBound(
        collective=collective,
        size_bytes=size_bytes,
        time_us=float(max(bandwidth_time_us + alpha_us, floor_us)),
        bandwidth_time_us=float(bandwidth_time_us),
        latency_floor_us=float(floor_us),
        cut=cut.cut,
        cut_gpus=cut.cut_gpus,
        cut_capacity_GBps=float(cut.capacity_GBps),
        description=description,
        cut_alpha_us=float(alpha_us),
        cut_only_time_us=float(max(bandwidth_time_us, floor_us)),
    )


def latency_floor_us(topology: Topology) -> float:
    """Return the largest, over ordered GPU pairs, of the least total α of a path between them (µs).

    Paths run over links some route holds and may relay through GPUs; every collective here
    moves data between every pair, so some chunk pays at least this much.
    """
    return route_latency_floor_us(topology, route_links(topology))


def route_latency_floor_us(topology: Topology, links: tuple[Link, ...]) -> float:
    """Return ``latency_floor_us`` over ``links`` (``route_links(topology)``, computed once by the caller).

    One search per class of GPUs (``gpu_classes`` of the α graph): an automorphism that keeps
    every α maps each path from one GPU of a class onto a path from another with the same α in
    the same order, so both see the same distances to the GPUs (a set it maps onto itself).
    """
    graph = nx.DiGraph()
    graph.add_weighted_edges_from(((link.src, link.dst, link.alpha_us) for link in links), weight="alpha_us")
    names = [v.name for v in topology.gpus]
    in_graph = [name for name in names if name in graph]
    firsts = dict.fromkeys(first for first, _ in gpu_classes(topology, graph, in_graph).values())
    floor = 0.0
    for src in names:
        if src in graph and src not in firsts:
            continue  # its class's first GPU has the same distances
        lengths = nx.single_source_dijkstra_path_length(graph, src, weight="alpha_us") if src in graph else {}
        floor = max([floor] + [lengths[dst] for dst in names if dst != src and dst in lengths])
    return float(floor)


def lower_bounds(
    topology: Topology, collective: Collective | str, sizes_bytes: Iterable[int]
) -> tuple[LowerBound, ...]:
    """Return ``lower_bound`` at each size, computing the cuts and the floor once.

    Raises ``ArgumentError`` for an unknown collective or a size below 1 byte.
    """
    collective = parse_collective(collective)
    return lower_bounds_by_collective(topology, (collective,), sizes_bytes)[collective]


def lower_bounds_by_collective(
    topology: Topology,
    collectives: Iterable[Collective | str],
    sizes_bytes: Iterable[int],
    *,
    links: tuple[Link, ...] | None = None,
) -> dict[Collective, tuple[LowerBound, ...]]:
    """Return ``lower_bounds`` of each collective (in the order given), sharing the work between them.

    The routes and the latency floor serve every collective, and AllReduce takes the AllGather and
    ReduceScatter cuts, so each is computed once here where one ``lower_bounds`` call per
    collective computes the routes four times and each cut twice (``taccl topo show``). ``links``,
    when given, is ``route_links(topology)`` computed by the caller, who needs it elsewhere too.

    Raises ``ArgumentError`` for an unknown collective or a size below 1 byte.
    """
    chosen = tuple(dict.fromkeys(parse_collective(collective) for collective in collectives))
    sizes = checked_sizes(topology, sizes_bytes)
    links = route_links(topology) if links is None else links
    floor = route_latency_floor_us(topology, links)
    cuts: dict[bool, CutBound] = {}  # by direction: reverse True for ReduceScatter, False for AllGather
    bounds = {}
    for collective in chosen:
        if collective is Collective.ALLTOALL:
            bounds[collective] = _alltoall_bounds(topology, links, sizes, floor)
            continue
        directions = [reverse for reverse, uses in ((True, _USES_RS_CUT), (False, _USES_AG_CUT)) if collective in uses]
        for reverse in directions:
            if reverse not in cuts:
                cuts[reverse] = cut_bound(topology, links, reverse)
        bounds[collective] = _cut_bounds(collective, sizes, [cuts[r] for r in directions], floor, topology.num_ranks)
    return bounds


def checked_sizes(topology: Topology, sizes_bytes: Iterable[int]) -> tuple[int, ...]:
    """Return the sizes as a tuple; raise ``ArgumentError`` for one that is not an integer >= 1 byte."""
    sizes = tuple(sizes_bytes)
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ArgumentError(topology.name, "size_bytes", f"size {size!r}", "an integer number of bytes >= 1")
    return sizes


def _cut_bounds(
    collective: Collective, sizes: tuple[int, ...], cuts: Sequence[CutBound], floor: float, num_ranks: int
) -> tuple[LowerBound, ...]:
    """Return the bound at each size from ``cuts`` (ReduceScatter's first, AllGather's last) and the floor."""
    main = cuts[-1]
    if len(cuts) == 2 and cuts[0].cut == cuts[1].cut:
        description = f"reducescatter + allgather class bound, {main.description}"
    elif len(cuts) == 2:
        description = (
            f"reducescatter + allgather class bound: reducescatter {cuts[0].description}; allgather {main.description}"
        )
    else:
        description = main.description
    # One α for AllReduce: a pipelined RS + AG can overlap the second cut's α with the first phase.
    alpha_us = min(cut.alpha_us for cut in cuts)
    return tuple(
        make_lower_bound(
            collective, size, sum(cut.time_us(size, num_ranks) for cut in cuts), alpha_us, floor, main, description
        )
        for size in sizes
    )


def _alltoall_bounds(
    topology: Topology, links: tuple[Link, ...], sizes: tuple[int, ...], floor: float
) -> tuple[LowerBound, ...]:
    """Return the AlltoAll bound at each size (``bounds.alltoall``): its cut plus its α, or the latency floor.

    The cut's capacity is one direction's; its α is the cheaper of both, which bounds either.
    """
    cut = alltoall_cut(topology, links)
    inside = tuple(v for v in topology.gpus if v.name in cut.cut)
    outside = tuple(v for v in topology.gpus if v.name not in cut.cut)
    alpha_us = min(crossing_alpha_us(topology, inside, outside), crossing_alpha_us(topology, outside, inside))
    as_cut = CutBound(False, cut.cut, cut.cut_gpus, cut.capacity_GBps, cut.description, alpha_us)
    return tuple(
        make_lower_bound(
            Collective.ALLTOALL,
            size,
            cut.time_us(size, topology.num_ranks),
            alpha_us,
            floor,
            as_cut,
            cut.description,
        )
        for size in sizes
    )


def lower_bound(topology: Topology, collective: Collective | str, size_bytes: int) -> LowerBound:
    """Return a lower bound on the time (µs) of ``collective`` over ``size_bytes`` on ``topology``.

    Parameters
    ----------
    topology : Topology
        The machine(s); links no GPU-to-GPU route holds carry nothing.
    collective : Collective or str
        allgather, reducescatter, allreduce or alltoall.
    size_bytes : int
        The nccl-tests size M: AllGather's total output, ReduceScatter's total input,
        AllReduce's buffer; AlltoAll's buffer on one rank.

    Returns
    -------
    LowerBound
        ``time_us = max(cut α + bandwidth term, latency floor)``; the bandwidth term is the cut
        bound (M/N) * |GPUs in S| / capacity(S) (AllReduce: ReduceScatter's plus AllGather's,
        the class bound of point-to-point algorithms). ``cut_only_time_us`` is the cut-only bound, without the cut α.

    Raises
    ------
    ArgumentError
        For an unknown collective or a size below 1 byte.
    TopologyError
        When some GPU cannot reach another.

    Notes
    -----
    Each call recomputes the cut (one max-flow per GPU per round); for several sizes use
    ``lower_bounds``.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> bound = lower_bound(load_topology("dgx2"), "allgather", 10**9)
    >>> round(bound.time_us, 1), round(bound.cut_only_time_us, 1), bound.cut_alpha_us, bound.cut_gpus
    (7500.3, 7500.0, 0.3, 15)
    """
    return lower_bounds(topology, collective, (size_bytes,))[0]
