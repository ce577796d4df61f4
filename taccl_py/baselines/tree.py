"""NCCL-like double binary tree AllReduce.

Two complementary binary trees (``binary_tree_parents`` and its mirror or shift) each carry
half of the data: every piece is summed up its tree and broadcast back down, and pieces follow
each other so the climb of one overlaps the descent of the previous one (a pipeline).

* Several machines: the trees span the machines; inside each machine the GPUs form a chain
  (a Hamiltonian path over the fastest pairs) headed by the GPU next to the channel's NIC,
  and the head talks to the heads of the parent and child machines. Channel k runs tree
  ``k mod 2`` through rail ``(k // 2) mod rails`` (``rail_nics``: one working NIC per
  machine), so the default ``2 * rails`` channels use every rail and no head sits behind a
  NIC that is down.
* One machine: when every GPU pair is equally fast (a switch, a uniform mesh) the trees span
  the GPUs directly, in the order of the fastest ring; otherwise (NVLink meshes, PCIe trees),
  as NCCL does inside a machine, each tree is a chain along the fastest Hamiltonian cycle, the
  second one running the other way round.

The default pipeline depth balances latency against bandwidth for a size: the climb takes
about (depth + chunks - 1) hops of (α + share / (chunks * bandwidth)), smallest at
chunks = sqrt((depth - 1) * share / (α * bandwidth)).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from taccl_py.baselines._orders import best_path, disjoint_cycles, nic_rank_orders, node_ranks, rail_nics
from taccl_py.baselines._plans import binary_tree_parents, complement_tree_parents, tree_allreduce_items
from taccl_py.baselines.ring import MAX_CHANNELS
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
from taccl_py.topology.model import Topology, route
from taccl_py.units import BYTES_PER_US_PER_GBPS
from taccl_py.verify import check_algorithm

__all__ = [
    "tree_parents",
    "tree_algorithm",
    "default_tree_chunks",
    "default_tree_channels",
    "tree_chunks_for",
    "tree_depth",
    "DEFAULT_TREE_CHUNKS",
    "MAX_TREE_CHUNKS",
]

DEFAULT_TREE_CHUNKS = 4  # pipeline depth when no size is given
MAX_TREE_CHUNKS = 32  # MSCCL allows 64 steps per threadblock; a head's upward one holds `chunks`

# Pairs within 1% of each other count as equal: one machine is then treated as a switch.
_UNIFORM_TOLERANCE = 1.01

I, O = Buffer.INPUT, Buffer.OUTPUT


def _positions_to_parents(order: list[int], positions: list[int | None]) -> dict[int, int | None]:
    return {order[p]: (None if parent is None else order[parent]) for p, parent in enumerate(positions)}


def tree_parents(topology: Topology, channel: int) -> dict[int, int | None]:
    """Return the rank tree (rank -> parent rank, None at the root) of ``channel``.

    Even channels use the first binary tree, odd ones its complement; across machines channel
    k's chains are headed by the GPUs nearest rail ``(k // 2) mod rails``'s NIC.

    >>> from taccl_py.topology import load_topology
    >>> tree_parents(load_topology("ndv2", nodes=2), 0)[8]
    0
    """
    shape = binary_tree_parents if channel % 2 == 0 else complement_tree_parents
    if topology.nodes == 1:
        ranks = node_ranks(topology, 0)
        cycles = disjoint_cycles(topology, ranks)
        order = list(cycles[(channel // 2) % len(cycles)][0])
        if _uniform(topology, ranks):
            return _positions_to_parents(order, shape(len(order)))
        if channel % 2:  # the second chain runs the cycle the other way: the other link directions
            order = order[::-1]
        return {rank: previous for previous, rank in zip([None] + order, order)}
    parents: dict[int, int | None] = {}
    heads = []
    rails = rail_nics(topology)
    for node in range(topology.nodes):
        head = nic_rank_orders(topology, node)[rails[node][(channel // 2) % len(rails[node])]][0]
        chain = best_path(topology, node_ranks(topology, node), head)[0]
        parents.update({rank: previous for previous, rank in zip(chain, chain[1:])})
        heads.append(head)
    parents.update(_positions_to_parents(heads, shape(topology.nodes)))
    return parents


def _uniform(topology: Topology, ranks: tuple[int, ...]) -> bool:
    """Return True when every pair of ``ranks`` has the same route bandwidth and α (a switch)."""
    routes = [route(topology, a, b) for a in ranks for b in ranks if a != b]
    bandwidths = [r.bandwidth_GBps for r in routes]
    alphas = [r.alpha_us for r in routes]
    return (
        max(bandwidths) <= min(bandwidths) * _UNIFORM_TOLERANCE
        and max(alphas) <= min(alphas) * _UNIFORM_TOLERANCE + 1e-12
    )


def tree_depth(parents: Mapping[int, int | None] | Sequence[int | None]) -> int:
    """Return the most hops from a rank up to its tree's root (``parents``: rank -> parent, None at the root)."""
    deepest = 0
    for rank in parents.keys() if isinstance(parents, Mapping) else range(len(parents)):
        hops = 0
        while parents[rank] is not None:
            rank = parents[rank]
            hops += 1
        deepest = max(deepest, hops)
    return deepest


def default_tree_chunks(topology: Topology, size_bytes: int, channels: int) -> int:
    """Return the pipeline depth (chunks per channel) that minimises the climb time estimate.

    Uses the deepest tree, the largest α and the smallest bandwidth of the tree's hops.
    """
    parents = tree_parents(topology, 0)
    hops = [route(topology, child, parent) for child, parent in parents.items() if parent is not None]
    alpha_us = max(max(h.alpha_us for h in hops), 1e-3)
    bandwidth_bytes_per_us = min(h.bandwidth_GBps for h in hops) * BYTES_PER_US_PER_GBPS
    return tree_chunks_for(tree_depth(parents), alpha_us, bandwidth_bytes_per_us, size_bytes / channels)


def tree_chunks_for(depth: int, alpha_us: float, bandwidth_bytes_per_us: float, share_bytes: float) -> int:
    """Return the pipeline depth sqrt((depth - 1) · share / (α · bandwidth)), rounded, in 1..``MAX_TREE_CHUNKS``.

    ``depth``: hops from the deepest rank to the root; ``share_bytes``: one channel's bytes.
    """
    best = math.sqrt(max(depth - 1, 1) * share_bytes / (alpha_us * bandwidth_bytes_per_us))
    return int(min(MAX_TREE_CHUNKS, max(1, round(best))))


def default_tree_channels(topology: Topology) -> int:
    """Return the default number of trees: 2 on one machine, 2 per rail (``rail_nics``) across machines (<= 32)."""
    return 2 if topology.nodes == 1 else min(MAX_CHANNELS, 2 * max(1, len(rail_nics(topology)[0])))


def tree_algorithm(
    topology: Topology,
    collective: Collective = Collective.ALLREDUCE,
    *,
    channels: int | None = None,
    chunks: int | None = None,
    size_bytes: int | None = None,
    verify: bool = True,
) -> Algorithm:
    """Return a verified NCCL-like double binary tree AllReduce on ``topology``.

    Parameters
    ----------
    topology : Topology
        The machine(s); trees come from ``tree_parents``.
    collective : Collective
        Must be allreduce (trees reduce to a root and broadcast back).
    channels : int, optional
        Trees run in parallel, alternating the two shapes (default 2, or 2 per NIC across
        machines).
    chunks : int, optional
        Pieces per channel (pipeline depth); default ``default_tree_chunks`` for
        ``size_bytes`` when given, else ``DEFAULT_TREE_CHUNKS``.
    size_bytes : int, optional
        The size the pipeline depth is tuned for.

    Raises
    ------
    ArgumentError
        For a collective other than allreduce, fewer than 2 GPUs, or counts out of range.
    """
    collective = Collective(collective)
    if collective is not Collective.ALLREDUCE:
        raise ArgumentError(
            topology.name,
            "collective",
            f"no tree baseline for {collective.value}",
            "allreduce (trees reduce and broadcast)",
        )
    if topology.num_ranks < 2:
        raise ArgumentError(topology.name, "num_ranks", f"{topology.num_ranks} GPU", "at least 2 GPUs for a tree")
    count = default_tree_channels(topology) if channels is None else channels
    if not 1 <= count <= MAX_CHANNELS:
        raise ArgumentError(topology.name, "channels", f"{count} channels", f"1..{MAX_CHANNELS}")
    if chunks is None:
        chunks = DEFAULT_TREE_CHUNKS if size_bytes is None else default_tree_chunks(topology, size_bytes, count)
    if not 1 <= chunks <= MAX_TREE_CHUNKS:
        raise ArgumentError(topology.name, "chunks", f"{chunks} chunks", f"1..{MAX_TREE_CHUNKS} per channel")
    n = topology.num_ranks
    items: list[Transfer | LocalCopy] = [LocalCopy(r, (I, 0), (O, 0), count * chunks) for r in range(n)]
    for channel in range(count):
        pieces = [(channel * chunks + piece, 1) for piece in range(chunks)]
        items += tree_allreduce_items(tree_parents(topology, channel), pieces, O, channel)
    metadata = (("baseline", "tree"), ("topology", topology.name), ("channels", str(count)), ("chunks", str(chunks)))
    algorithm = lower_plan(f"tree-{count}ch-{chunks}p", collective, n, count * chunks, items, metadata=metadata)
    return check_algorithm(algorithm) if verify else algorithm
