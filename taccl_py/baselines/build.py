"""The baseline families and how each is built: which apply to a collective on a topology, and one built.

Every baseline is built with ``lower_plan`` and returned only after ``check_algorithm`` proved it
implements its collective (unless asked with ``verify=False``, as ``taccl_py.baselines.choice``
does: it simulates them, picks the fastest and verifies what it returns).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from taccl_py.baselines.alltoall import (
    direct_alltoall_algorithm,
    hierarchical_alltoall_algorithm,
    hierarchical_alltoall_pieces_by_size,
)
from taccl_py.baselines.doubling import doubling_algorithm, doubling_pieces_by_size, equal_machines
from taccl_py.baselines.hierarchical import hierarchical_algorithm
from taccl_py.baselines.packing import packed_trees_algorithm, packing_pieces_by_size
from taccl_py.baselines.ring import ring_algorithm
from taccl_py.baselines.tree import default_tree_channels, default_tree_chunks, tree_algorithm
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective, parse_collective
from taccl_py.stages.tree_packing import TreePacking
from taccl_py.topology.model import Topology

__all__ = ["BaselineKind", "applicable_kinds", "build_baseline", "all_baselines", "size_groups"]


# Packing spanning trees over the whole graph takes most of a 128-GPU comparison (50 of 75 s): past
# it, as the synthesizer's routes, only per-machine and per-rail designs are built.
PACKED_TREES_MAX_RANKS = 128


class BaselineKind(str, Enum):
    """The baseline families; values are the CLI's spelling."""

    RING = "ring"
    TREE = "tree"
    HIERARCHICAL = "hierarchical"
    TREES = "trees"
    DIRECT = "direct"
    DOUBLING = "doubling"


def _kind(kind: BaselineKind | str) -> BaselineKind:
    try:
        return BaselineKind(kind)
    except ValueError:
        raise ArgumentError(
            None, "baseline", f"unknown baseline {kind!r}", "ring, tree, hierarchical, trees, direct or doubling"
        ) from None


def applicable_kinds(topology: Topology, collective: Collective | str) -> tuple[BaselineKind, ...]:
    """Return the baselines worth comparing for ``collective`` on ``topology``.

    Double binary trees only reduce (allreduce); hierarchical equals the ring on one machine,
    so it is listed only across machines; packed trees apply up to ``PACKED_TREES_MAX_RANKS`` GPUs
    (the synthesizer's whole-graph routing stops there too); doubling (Bruck per rail)
    across machines of equally many GPUs. AlltoAll has its own two: direct, and hierarchical
    across machines.
    """
    collective = parse_collective(collective)
    if collective is Collective.ALLTOALL:
        return (BaselineKind.DIRECT,) + ((BaselineKind.HIERARCHICAL,) if topology.nodes > 1 else ())
    kinds = [BaselineKind.RING]
    if collective is Collective.ALLREDUCE:
        kinds.append(BaselineKind.TREE)
    if topology.nodes > 1:
        kinds.append(BaselineKind.HIERARCHICAL)
    if topology.num_ranks <= PACKED_TREES_MAX_RANKS:
        kinds.append(BaselineKind.TREES)
    if topology.nodes > 1 and equal_machines(topology):
        kinds.append(BaselineKind.DOUBLING)
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
    verify: bool = True,
) -> Algorithm:
    """Return the verified baseline ``kind`` for ``collective`` on ``topology``.

    Parameters
    ----------
    kind : BaselineKind or str
        ``ring``, ``tree`` (allreduce only), ``hierarchical``, ``trees`` (packed spanning trees) or
        ``doubling`` (two or more machines); for alltoall ``direct`` or ``hierarchical``.
    topology : Topology
        The machine(s) the orders are built for.
    collective : Collective or str
        allgather, reducescatter, allreduce or alltoall.
    chunks : int, optional
        Pieces per channel (pipeline depth). Default: 1 for rings and hierarchical (their links
        are busy on every step, so more pieces only add latency in the α-β model); for trees
        tuned to ``size_bytes`` when given; for doubling the blocks per network send (default:
        one send per earlier step, ``doubling_pieces_by_size``).
    channels : int, optional
        Parallel rings or trees (packed trees: trees per rank); default as the builder finds on the topology.
    size_bytes : int, optional
        The size a tree's pipeline depth is tuned for.
    packings : sequence of TreePacking, optional
        Packed trees only: ``phase_packings(topology, collective)`` when the caller has them.
    max_transfers_per_threadblock : int, optional
        Rings and hierarchical only: spread longer runs of sends over more channels
        (``spread_long_connections``), so that MSCCL loads rings of many GPUs.
    verify : bool, default True
        False skips the symbolic replay, for a caller that verifies only the baselines it keeps
        (``compare_baselines``: most it builds lose at every size and are dropped).

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
    kind, collective = _kind(kind), parse_collective(collective)
    alltoall = collective is Collective.ALLTOALL
    if (alltoall and kind not in _ALLTOALL_KINDS) or (not alltoall and kind is BaselineKind.DIRECT):
        raise ArgumentError(
            topology.name,
            "baseline",
            f"no {kind.value} baseline for {collective.value}",
            "direct or hierarchical for alltoall" if alltoall else "ring, tree, hierarchical, trees or doubling",
        )
    spreads = kind in (BaselineKind.RING, BaselineKind.HIERARCHICAL, BaselineKind.DOUBLING) and not alltoall
    if max_transfers_per_threadblock is not None and not spreads:
        raise ArgumentError(
            topology.name,
            "baseline",
            f"{kind.value} {collective.value} with max_transfers_per_threadblock",
            "a ring, hierarchical or doubling baseline of allgather, reducescatter or allreduce",
        )
    if alltoall:
        if kind is BaselineKind.DIRECT:
            if chunks not in (None, 1) or channels is not None:
                fault = "direct alltoall with chunks or channels"
                raise ArgumentError(topology.name, "baseline", fault, "neither (one message per pair)")
            return direct_alltoall_algorithm(topology, verify=verify)
        return hierarchical_alltoall_algorithm(topology, 1 if chunks is None else chunks, verify=verify)
    if kind is BaselineKind.RING:
        return ring_algorithm(
            topology,
            collective,
            channels=channels,
            chunks=chunks,
            max_transfers_per_threadblock=max_transfers_per_threadblock,
            verify=verify,
        )
    if kind is BaselineKind.TREE:
        return tree_algorithm(
            topology, collective, channels=channels, chunks=chunks, size_bytes=size_bytes, verify=verify
        )
    if kind is BaselineKind.DOUBLING:
        return doubling_algorithm(
            topology,
            collective,
            channels=channels,
            piece_blocks=chunks,
            max_transfers_per_threadblock=max_transfers_per_threadblock,
            verify=verify,
        )
    if kind is BaselineKind.TREES:
        return packed_trees_algorithm(
            topology,
            collective,
            chunkup=channels,
            pieces=chunks,
            size_bytes=size_bytes,
            packings=packings,
            verify=verify,
        )
    return hierarchical_algorithm(
        topology,
        collective,
        channels=channels,
        chunks=chunks,
        max_transfers_per_threadblock=max_transfers_per_threadblock,
        verify=verify,
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
    so does the hierarchical alltoall (its pieces per parcel) and doubling (its blocks per network send).
    """
    kind, collective = _kind(kind), parse_collective(collective)
    if kind is BaselineKind.TREES:
        return packing_pieces_by_size(topology, collective, sizes, packings)
    if kind is BaselineKind.HIERARCHICAL and collective is Collective.ALLTOALL:
        return None, dict(hierarchical_alltoall_pieces_by_size(topology, sizes))
    if kind is BaselineKind.DOUBLING:
        return None, doubling_pieces_by_size(topology, sizes, collective)
    if kind is not BaselineKind.TREE:
        return None, {None: list(sizes)}
    channels = default_tree_channels(topology)
    groups: dict[int | None, list[int]] = {}
    for size in sizes:
        groups.setdefault(default_tree_chunks(topology, size, channels), []).append(size)
    return None, groups
