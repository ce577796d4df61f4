"""Baseline algorithms to compare against: NCCL-like rings, double binary trees, hierarchical rings and
spanning-tree packing (the bandwidth-optimal published method); for AlltoAll, direct and two-level
hierarchical exchanges.

Every baseline is built with ``lower_plan`` and returned only after ``check_algorithm`` proved
it implements its collective. ``best_baseline`` simulates the applicable ones at a size and
returns the fastest, which is what a synthesized algorithm's time is compared with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from enum import Enum

from taccl_py.baselines.alltoall import (
    direct_alltoall_algorithm,
    hierarchical_alltoall_algorithm,
    hierarchical_alltoall_pieces_by_size,
)
from taccl_py.baselines.hierarchical import hierarchical_algorithm, local_rings
from taccl_py.baselines.packing import packed_trees_algorithm, packing_pieces_by_size, phase_packings
from taccl_py.baselines.ring import ring_algorithm, ring_orders
from taccl_py.baselines.tree import default_tree_channels, default_tree_chunks, tree_algorithm, tree_parents
from taccl_py.bounds import lower_bounds
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary
from taccl_py.ir.lowering import MAX_TRANSFERS_PER_THREADBLOCK
from taccl_py.msccl.limits import runtime_limits
from taccl_py.msccl.selection import selectable_for_powers_of_two
from taccl_py.simulate import MSCCL_LOOP, ExecutionModel, SimulationResult, prepare_simulation, simulate_plan
from taccl_py.simulate.protocol import band_sample_sizes
from taccl_py.stages.tree_packing import TreePacking
from taccl_py.topology.model import Topology

__all__ = [
    "BaselineKind",
    "applicable_kinds",
    "build_baseline",
    "all_baselines",
    "best_baseline",
    "best_baselines",
    "best_baselines_by_band",
    "size_groups",
    "ring_algorithm",
    "ring_orders",
    "tree_algorithm",
    "tree_parents",
    "hierarchical_algorithm",
    "local_rings",
    "packed_trees_algorithm",
    "direct_alltoall_algorithm",
    "hierarchical_alltoall_algorithm",
]


class BaselineKind(str, Enum):
    """The baseline families; values are the CLI's spelling."""

    RING = "ring"
    TREE = "tree"
    HIERARCHICAL = "hierarchical"
    TREES = "trees"
    DIRECT = "direct"


def _kind(kind: BaselineKind | str) -> BaselineKind:
    try:
        return BaselineKind(kind)
    except ValueError:
        raise ArgumentError(
            None, "baseline", f"unknown baseline {kind!r}", "ring, tree, hierarchical, trees or direct"
        ) from None


def _collective(collective: Collective | str) -> Collective:
    try:
        return Collective(collective)
    except ValueError:
        raise ArgumentError(
            None, "collective", f"unknown collective {collective!r}", "allgather, reducescatter, allreduce or alltoall"
        ) from None


def applicable_kinds(topology: Topology, collective: Collective | str) -> tuple[BaselineKind, ...]:
    """Return the baselines worth comparing for ``collective`` on ``topology``.

    Double binary trees only reduce (allreduce); hierarchical equals the ring on one machine,
    so it is listed only across machines; packed trees apply everywhere. AlltoAll has its
    own two: direct, and hierarchical across machines.
    """
    collective = _collective(collective)
    if collective is Collective.ALLTOALL:
        return (BaselineKind.DIRECT,) + ((BaselineKind.HIERARCHICAL,) if topology.nodes > 1 else ())
    kinds = [BaselineKind.RING]
    if collective is Collective.ALLREDUCE:
        kinds.append(BaselineKind.TREE)
    if topology.nodes > 1:
        kinds.append(BaselineKind.HIERARCHICAL)
    kinds.append(BaselineKind.TREES)
    return tuple(kinds)


# The kinds that build alltoall; every kind but direct builds the other collectives.
_ALLTOALL_KINDS = frozenset({BaselineKind.DIRECT, BaselineKind.HIERARCHICAL})


def build_baseline(
    kind: BaselineKind | str,
    topology: Topology,
    collective: Collective | str,
    chunks: int | None = None,
    *,
    channels: int | None = None,
    size_bytes: int | None = None,
    packings: Sequence[TreePacking] | None = None,
    max_transfers_per_threadblock: int | None = None,
) -> Algorithm:
    """Return the verified baseline ``kind`` for ``collective`` on ``topology``.

    Parameters
    ----------
    kind : BaselineKind or str
        ``ring``, ``tree`` (allreduce only), ``hierarchical`` or ``trees`` (packed spanning trees);
        for alltoall ``direct`` or ``hierarchical`` (two or more machines).
    topology : Topology
        The machine(s) the orders are built for.
    collective : Collective or str
        allgather, reducescatter, allreduce or alltoall.
    chunks : int, optional
        Pieces per channel (pipeline depth). Default: 1 for rings and hierarchical (their links
        are busy on every step, so more pieces only add latency in the α-β model); for trees
        tuned to ``size_bytes`` when given.
    channels : int, optional
        Parallel rings or trees (packed trees: trees per rank); default as the builder finds on the topology.
    size_bytes : int, optional
        The size a tree's pipeline depth is tuned for.
    packings : sequence of TreePacking, optional
        Packed trees only: ``phase_packings(topology, collective)`` when the caller has them.
    max_transfers_per_threadblock : int, optional
        Rings and hierarchical only: spread longer runs of sends over more channels
        (``spread_long_connections``), so that MSCCL loads rings of many GPUs.

    Raises
    ------
    ArgumentError
        For an unknown kind or collective, a tree for anything but allreduce, a kind that does
        not apply to alltoall (or direct to anything else), counts out of range, or
        ``max_transfers_per_threadblock`` for another kind.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> build_baseline("ring", load_topology("dgx2"), "allgather").name
    'ring-2ch-1p'
    """
    kind, collective = _kind(kind), _collective(collective)
    alltoall = collective is Collective.ALLTOALL
    if (alltoall and kind not in _ALLTOALL_KINDS) or (not alltoall and kind is BaselineKind.DIRECT):
        raise ArgumentError(
            topology.name,
            "baseline",
            f"no {kind.value} baseline for {collective.value}",
            "direct or hierarchical for alltoall" if alltoall else "ring, tree, hierarchical or trees",
        )
    spreads = kind in (BaselineKind.RING, BaselineKind.HIERARCHICAL) and not alltoall
    if max_transfers_per_threadblock is not None and not spreads:
        raise ArgumentError(
            topology.name,
            "baseline",
            f"{kind.value} {collective.value} with max_transfers_per_threadblock",
            "a ring or hierarchical baseline of allgather, reducescatter or allreduce",
        )
    if alltoall:
        if kind is BaselineKind.DIRECT:
            if chunks not in (None, 1) or channels is not None:
                fault = "direct alltoall with chunks or channels"
                raise ArgumentError(topology.name, "baseline", fault, "neither (one message per pair)")
            return direct_alltoall_algorithm(topology)
        return hierarchical_alltoall_algorithm(topology, 1 if chunks is None else chunks)
    if kind is BaselineKind.RING:
        return ring_algorithm(
            topology,
            collective,
            channels=channels,
            chunks=chunks,
            max_transfers_per_threadblock=max_transfers_per_threadblock,
        )
    if kind is BaselineKind.TREE:
        return tree_algorithm(topology, collective, channels=channels, chunks=chunks, size_bytes=size_bytes)
    if kind is BaselineKind.TREES:
        return packed_trees_algorithm(
            topology, collective, chunkup=channels, pieces=chunks, size_bytes=size_bytes, packings=packings
        )
    return hierarchical_algorithm(
        topology,
        collective,
        channels=channels,
        chunks=chunks,
        max_transfers_per_threadblock=max_transfers_per_threadblock,
    )


def all_baselines(
    topology: Topology, collective: Collective | str, size_bytes: int | None = None
) -> tuple[Algorithm, ...]:
    """Return every applicable baseline (``applicable_kinds``) with default settings.

    ``size_bytes`` tunes the tree's pipeline depth when given.
    """
    return tuple(
        build_baseline(kind, topology, collective, size_bytes=size_bytes)
        for kind in applicable_kinds(topology, collective)
    )


def size_groups(
    kind: BaselineKind | str,
    topology: Topology,
    collective: Collective | str,
    sizes: Sequence[int],
    packings: Sequence[TreePacking] | None = None,
) -> tuple[int | None, dict[int | None, list[int]]]:
    """Return the channels (None: the default) and the sizes grouped by the pipeline depth ``kind`` uses for them.

    Rings and hierarchical algorithms use one depth for every size; trees and packed trees tune it
    (packed trees from ``packings``, ``phase_packings`` of the topology, packed here when None), and
    so does the hierarchical alltoall (its pieces per parcel).
    """
    kind, collective = _kind(kind), _collective(collective)
    if kind is BaselineKind.TREES:
        return packing_pieces_by_size(topology, collective, sizes, packings)
    if kind is BaselineKind.HIERARCHICAL and collective is Collective.ALLTOALL:
        return None, dict(hierarchical_alltoall_pieces_by_size(topology, sizes))
    if kind is not BaselineKind.TREE:
        return None, {None: list(sizes)}
    channels = default_tree_channels(topology)
    groups: dict[int | None, list[int]] = {}
    for size in sizes:
        groups.setdefault(default_tree_chunks(topology, size, channels), []).append(size)
    return None, groups


def _simulate_all(
    algorithm: Algorithm, topology: Topology, sizes: Sequence[int], bounds: dict[int, float], model: ExecutionModel
) -> list[SimulationResult]:
    plan = prepare_simulation(algorithm, topology, model=model)
    return [simulate_plan(plan, size, bound_time_us=bounds[size]) for size in sizes]


def best_baselines(
    topology: Topology,
    collective: Collective | str,
    sizes_bytes: Iterable[int],
    progress: Callable[[str], None] | None = None,
    keep: Callable[[Algorithm], bool] | None = None,
    model: ExecutionModel = MSCCL_LOOP,
) -> tuple[tuple[Algorithm, SimulationResult] | None, ...]:
    """Return, per size, the baseline with the smallest simulated time under ``model`` and its result.

    With ``keep``, only baselines it accepts compete (e.g. those within the MSCCL limits); a ring,
    tree or hierarchical baseline it refuses competes reshaped where that is accepted (sends spread
    over more channels, or fewer channels: ``_loadable_variant``), and a size where it accepts
    none gets None.

    Rings and hierarchical algorithms are built once; trees and packed trees once per pipeline
    depth the sizes call for. Ties go to the earlier of ring, tree, hierarchical, trees (alltoall:
    direct, hierarchical). ``progress`` receives one
    line per baseline built.
    """
    collective = _collective(collective)
    sizes = tuple(sizes_bytes)
    if not sizes:
        return ()
    bounds = dict(zip(sizes, (bound.time_us for bound in lower_bounds(topology, collective, sizes))))
    best: dict[int, tuple[Algorithm, SimulationResult]] = {}
    for kind in applicable_kinds(topology, collective):
        # Packed trees of every pipeline depth share one packing (seconds on 64 GPUs).
        packings = phase_packings(topology, collective) if kind is BaselineKind.TREES else None
        channels, groups = size_groups(kind, topology, collective, sizes, packings)
        for chunks, group in groups.items():
            algorithm = build_baseline(
                kind, topology, collective, chunks, channels=channels, size_bytes=group[-1], packings=packings
            )
            if keep is not None and not keep(algorithm):
                algorithm = _loadable_variant(algorithm, keep, kind, topology, collective, chunks, group[-1])
                if algorithm is None:
                    continue
            if progress is not None:
                progress(f"baseline {algorithm.name}: simulating {len(group)} size{'s' if len(group) != 1 else ''}")
            for size, result in zip(group, _simulate_all(algorithm, topology, group, bounds, model)):
                if size not in best or result.time_us < best[size][1].time_us:
                    best[size] = (algorithm, result)
    return tuple(best.get(size) for size in sizes)


def _loadable_variant(
    algorithm: Algorithm,
    keep: Callable[[Algorithm], bool],
    kind: BaselineKind,
    topology: Topology,
    collective: Collective,
    chunks: int | None,
    size_bytes: int,
) -> Algorithm | None:
    """Return ``kind`` reshaped within the portable MSCCL limits, as ``keep`` accepts it, or None.

    Three refusals have a cure. Steps per threadblock: rings and hierarchical algorithms spread
    their longer runs of sends over more channels (an AllReduce ring of 64 GPUs sends 126 times on
    one). Threadblocks per GPU: rings, trees and hierarchical algorithms take the most channels
    under the original's that fit (16 trees on 64 GPUs need 69 threadblocks, over the 64 MSCCL
    loads). A chunk loop MSCCL never selects (6 rings on NDv2: 48 chunks, which divide no
    power-of-two count) also takes the most channels under the original's that ``keep`` accepts.
    None when neither applies or no variant is accepted.
    """
    if kind not in (BaselineKind.RING, BaselineKind.TREE, BaselineKind.HIERARCHICAL):
        return None
    if collective is Collective.ALLTOALL:
        return None
    limits = runtime_limits()
    spread = None
    longest = max(len(tb.steps) for program in algorithm.ranks for tb in program.threadblocks)
    # Dependency nops count against MSCCL's steps too, so spread whatever spreading would change.
    if kind is not BaselineKind.TREE and longest > MAX_TRANSFERS_PER_THREADBLOCK:
        spread = MAX_TRANSFERS_PER_THREADBLOCK
        algorithm = build_baseline(kind, topology, collective, chunks, max_transfers_per_threadblock=spread)
        if keep(algorithm):
            return algorithm
    most = _most_threadblocks(algorithm)
    if most <= limits.max_threadblocks_per_gpu and selectable_for_powers_of_two(algorithm):
        return None
    channels = int(algorithm.meta("channels", str(algorithm.num_channels)))
    # A hierarchical name counts the cross-machine ring's channel; its builder takes the local rings.
    built_with = channels - 1 if kind is BaselineKind.HIERARCHICAL and topology.nodes > 1 else channels
    # Threadblocks grow about in proportion to the channels: start where the count should fit.
    start = min(built_with - 1, max(1, channels * limits.max_threadblocks_per_gpu // most))
    for fewer_channels in range(start, 0, -1):
        fewer = build_baseline(
            kind,
            topology,
            collective,
            chunks,
            channels=fewer_channels,
            size_bytes=size_bytes,
            max_transfers_per_threadblock=spread,
        )
        if keep(fewer):
            return fewer
        if _most_threadblocks(fewer) <= limits.max_threadblocks_per_gpu and selectable_for_powers_of_two(fewer):
            return None
    return None


def _most_threadblocks(algorithm: Algorithm) -> int:
    """Return the most threadblocks any rank of ``algorithm`` runs."""
    return max(len(program.threadblocks) for program in algorithm.ranks)


def best_baseline(
    topology: Topology, collective: Collective | str, size_bytes: int
) -> tuple[Algorithm, SimulationResult]:
    """Return the baseline with the smallest simulated time at ``size_bytes``, with its result.

    See ``best_baselines`` to compare at several sizes at once (cheaper).
    """
    (best,) = best_baselines(topology, collective, (size_bytes,))
    return best  # type: ignore[return-value]  # without ``keep`` every size has a ring or a direct baseline


def best_baselines_by_band(
    library: AlgorithmLibrary,
    topology: Topology,
    model: ExecutionModel = MSCCL_LOOP,
    keep: Callable[[Algorithm], bool] | None = None,
) -> dict[int, tuple[Algorithm, ...]]:
    """Return, per band index of ``library`` with an algorithm, the baselines fastest at some of its sample sizes.

    Each band is sampled at ``band_sample_sizes``; all bands share one ``best_baselines`` call, so
    each baseline is built once. ``keep`` as ``best_baselines``: only baselines it accepts compete.
    """
    samples = {
        index: band_sample_sizes(band.min_bytes, band.max_bytes)
        for index, band in enumerate(library.bands)
        if band.algorithm is not None
    }
    sizes = sorted({size for band_sizes in samples.values() for size in band_sizes})
    best = dict(zip(sizes, best_baselines(topology, library.collective, sizes, keep=keep, model=model)))
    return {
        index: tuple({best[size][0].name: best[size][0] for size in band_sizes if best[size]}.values())
        for index, band_sizes in samples.items()
    }
