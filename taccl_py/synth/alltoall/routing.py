"""AlltoAll routing: the N² block demands over direct and NIC-relay paths, chosen by one LP.

A block from GPU s on machine n to GPU d on another machine m may go

* ``direct``: s → d over the network;
* ``sender relay``: s → R_s (a GPU of machine n next to the rail d rides) → d;
* ``both relays``: s → R_s → R_d (a GPU of machine m on the same rail) → d;
* ``receiver relay``: s → R_d → d,

with the relays ``alltoall_relays`` picks (where a relay is s or d itself the path collapses,
and paths that collapse to the same ranks are one), and through a GPU next to any NIC of either
machine, so a machine with a NIC down spreads its traffic over the rest. A block inside a
machine goes directly or, on NVLink meshes (DGX-1, NDv2), through a GPU with links of its own to
both ends: there the direct route of a pair without an NVLink crosses PCIe and the host, several
times slower.

The LP exploits symmetry as TE-CCL does: one variable per path *class*, keyed by the kinds of
the two machines, the local indices of s and d and whether they share a machine, so all machine
pairs of the same kinds route alike and the column count does not grow with the node count.
Each class's fractions sum to 1; every link's load (blocks of the class crossing it, summed over
its instances) over its bandwidth is at most the bottleneck time ``T``; the objective is ``T``
plus the mean latency of the chosen paths (α per hop and, at each relay, the block's
store-and-forward time).
Rows that symmetry makes identical are written once. The LP has no integers, so HiGHS solves it
to optimality and the same input gives the same routing. ``round_routing`` then cuts each block
into pieces and gives each path a whole number of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import pulp

from taccl_py.baselines._orders import node_ranks
from taccl_py.baselines.alltoall import alltoall_relays
from taccl_py.solvers import SolverOptions, SolveStatus, solve_model
from taccl_py.solvers.matrix import linear_sum
from taccl_py.topology.builtins import nic_affinity
from taccl_py.topology.fingerprint import node_signature
from taccl_py.topology.model import Topology, route
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = ["PathKind", "PathClass", "AlltoallRouting", "path_classes", "route_alltoall", "round_routing"]

logger = logging.getLogger(__name__)

# Loads below this many µs are dropped from a row: they are rounding noise, and keeping them
# would spread coefficients over more than the ~6 orders of magnitude STYLE.md allows.
_NEGLIGIBLE_US = 1e-9


class PathKind(str, Enum):
    """How a cross-machine block travels; the value names it in labels and metadata."""

    DIRECT = "direct"
    SENDER_RELAY = "sender-relay"
    BOTH_RELAYS = "both-relays"
    RECEIVER_RELAY = "receiver-relay"
    LOCAL_RELAY = "local-relay"  # inside a machine, through a GPU linked to both ends


@dataclass(frozen=True)
class PathClass:
    """The blocks from local GPU ``src_local`` on machines of kind ``src_kind`` to ``dst_local`` on ``dst_kind``.

    ``paths`` maps each usable kind to, per instance (source rank, destination rank), the ranks
    the block visits in order; ``instances`` lists the (source, destination) rank pairs.
    """

    src_kind: int
    dst_kind: int
    src_local: int
    dst_local: int
    same_machine: bool
    instances: tuple[tuple[int, int], ...]
    paths: tuple[tuple[PathKind, tuple[tuple[int, ...], ...]], ...]

    @property
    def key(self) -> tuple[int, int, int, int, bool]:
        """Return (source kind, destination kind, source local index, destination local index, same machine)."""
        return (self.src_kind, self.dst_kind, self.src_local, self.dst_local, self.same_machine)

    @property
    def kinds(self) -> tuple[PathKind, ...]:
        """Return the path kinds this class may use, in ``PathKind`` order."""
        return tuple(kind for kind, _ in self.paths)


@dataclass(frozen=True)
class AlltoallRouting:
    """Per path class, the share of each block per path kind (fractions summing to 1), with the LP's outcome.

    ``bottleneck_us`` is the LP's busiest-link time at ``size_bytes``; ``status`` the solve's
    ``SolveStatus`` value.
    """

    classes: tuple[PathClass, ...]
    shares: tuple[tuple[float, ...], ...]
    size_bytes: int
    bottleneck_us: float
    status: str


def _collapse(ranks: Sequence[int]) -> tuple[int, ...]:
    """Return ``ranks`` without consecutive repeats (a relay that is the source or destination itself)."""
    out: list[int] = []
    for rank in ranks:
        if not out or out[-1] != rank:
            out.append(rank)
    return tuple(out)


def _paths_of(source: int, destination: int, relays: tuple[int, int]) -> dict[PathKind, tuple[int, ...]]:
    sender, receiver = relays
    return {
        PathKind.DIRECT: (source, destination),
        PathKind.SENDER_RELAY: _collapse((source, sender, destination)),
        PathKind.BOTH_RELAYS: _collapse((source, sender, receiver, destination)),
        PathKind.RECEIVER_RELAY: _collapse((source, receiver, destination)),
    }


def _machine_kinds(topology: Topology) -> list[int]:
    """Return, per machine, the index of its kind (machines of one kind and state share it)."""
    signatures = [node_signature(topology, n) for n in range(topology.nodes)]
    index = {signature: k for k, signature in enumerate(dict.fromkeys(signatures))}
    return [index[signature] for signature in signatures]


def _grouped_instances(topology: Topology) -> dict[tuple[int, int, int, int, bool], list[tuple[int, int]]]:
    """Return the (source, destination) rank pairs of every class key, in rank order."""
    kind_of = _machine_kinds(topology)
    members = [node_ranks(topology, n) for n in range(topology.nodes)]
    grouped: dict[tuple[int, int, int, int, bool], list[tuple[int, int]]] = {}
    for n in range(topology.nodes):
        for m in range(topology.nodes):
            for i, s in enumerate(members[n]):
                for j, d in enumerate(members[m]):
                    if s != d:
                        grouped.setdefault((kind_of[n], kind_of[m], i, j, n == m), []).append((s, d))
    return grouped


def _one_link(topology: Topology, a: int, b: int) -> bool:
    """Return True when GPUs ``a`` and ``b`` are joined by a link of their own (an NVLink, not a switch or host)."""
    return len(route(topology, a, b).links) == 1


def _local_paths(topology: Topology, instances: Sequence[tuple[int, int]]) -> list[tuple[PathKind, tuple]]:
    """Return the direct path and, per GPU k linked directly to both ends in every instance, the path through k."""
    paths: list[tuple[PathKind, tuple]] = [(PathKind.DIRECT, tuple(instances))]
    node_of = [node_ranks(topology, topology.gpu(s).node) for s, _ in instances]
    for k in range(len(node_of[0])):
        through = tuple((s, members[k], d) for (s, d), members in zip(instances, node_of))
        if all(r != s and r != d and _one_link(topology, s, r) and _one_link(topology, r, d) for s, r, d in through):
            paths.append((PathKind.LOCAL_RELAY, through))
    return paths


def _near_nics(topology: Topology) -> list[list[tuple[int, ...]]]:
    """Return, per machine, the GPUs nearest each of its NICs that are up, in the machine's NIC order."""
    affinity = nic_affinity(topology)
    return [[affinity[nic.name] for nic in topology.nics(node)] for node in range(topology.nodes)]


def _rail_paths(
    topology: Topology, s: int, d: int, near: list[list[tuple[int, ...]]]
) -> list[tuple[PathKind, tuple[int, ...]]]:
    """Return the paths from ``s`` through a GPU next to each NIC of its machine, and into ``d`` through each of d's.

    The GPU next to a NIC is taken in turn by the local index of the far end, so the relaying
    spreads over the GPUs a NIC has nearest.
    """
    src, dst = topology.gpu(s), topology.gpu(d)
    i, j = node_ranks(topology, src.node).index(s), node_ranks(topology, dst.node).index(d)
    paths = []
    for gpus in near[src.node]:
        if gpus:
            paths.append((PathKind.SENDER_RELAY, _collapse((s, gpus[j % len(gpus)], d))))
    for gpus in near[dst.node]:
        if gpus:
            paths.append((PathKind.RECEIVER_RELAY, _collapse((s, gpus[i % len(gpus)], d))))
    return paths


def _cross_paths(
    topology: Topology,
    instances: Sequence[tuple[int, int]],
    relays: dict[tuple[int, int], tuple[int, int]],
    near: list[list[tuple[int, ...]]] | None,
) -> list[tuple[PathKind, tuple]]:
    """Return the distinct cross-machine paths of a class: one per kind, then (with ``near``) one per NIC.

    A path is kept when no earlier one takes the same ranks in every instance.
    """
    columns: list[tuple[PathKind, list[tuple[int, ...]]]] = []
    for number, (s, d) in enumerate(instances):
        found = list(_paths_of(s, d, relays[topology.gpu(s).node, d]).items())
        if near is not None:
            found += _rail_paths(topology, s, d, near)
        if number == 0:
            columns = [(kind, []) for kind, _ in found]
        for (_, ranks), (_, path) in zip(columns, found):
            ranks.append(path)
    seen: set[tuple[tuple[int, ...], ...]] = set()
    paths = []
    for kind, ranks in columns:
        if tuple(ranks) not in seen:
            seen.add(tuple(ranks))
            paths.append((kind, tuple(ranks)))
    return paths


def path_classes(topology: Topology, *, direct: bool = True) -> tuple[PathClass, ...]:
    """Return the path classes of ``topology`` in a fixed order.

    Across machines a path is kept for a class when no earlier one takes the same ranks in
    every instance. With ``direct`` the paths through a GPU next to each NIC of the source or
    the destination machine join the four kinds, so the LP can spread a machine's traffic over
    all its NICs when some are down or missing. With ``direct`` False only the relays
    ``alltoall_relays`` picks remain and the direct kind is dropped wherever a relay path
    differs from it (so cross-machine traffic gathers at the NIC GPUs of one rail per
    destination: few peers per GPU, few threadblocks). Inside a machine a block may go directly
    or through any GPU that has a link of its own to both ends (NVLink meshes such as DGX-1;
    none behind a switch).
    """
    relays = alltoall_relays(topology) if topology.nodes > 1 else {}
    near = _near_nics(topology) if direct and topology.nodes > 1 else None
    classes = []
    for key, pairs in sorted(_grouped_instances(topology).items()):
        instances = tuple(pairs)
        if key[4]:
            paths = _local_paths(topology, instances)
        else:
            paths = _cross_paths(topology, instances, relays, near)
            if not direct and len(paths) > 1:
                paths = [entry for entry in paths if entry[0] is not PathKind.DIRECT]
        classes.append(PathClass(*key, instances, tuple(paths)))
    return tuple(classes)


def _hop_loads(topology: Topology, ranks: tuple[int, ...], loads: dict[tuple[str, str], float], times: float) -> None:
    """Add ``times`` block crossings to ``loads`` for every link of every hop of ``ranks``."""
    for a, b in zip(ranks, ranks[1:]):
        for link in route(topology, a, b).links:
            loads[link.key] = loads.get(link.key, 0.0) + times


def _path_latency_us(topology: Topology, ranks: tuple[int, ...], block_bytes: float) -> float:
    """Return the α of every hop of ``ranks`` plus one block's store-and-forward time at each relay.

    A relay forwards a block only once it holds all of it, so each hop but the last delays the
    block by its transfer time over that hop's slowest link.
    """
    hops = [route(topology, a, b) for a, b in zip(ranks, ranks[1:])]
    forward_us = sum(block_bytes / (hop.bandwidth_GBps * BYTES_PER_US_PER_GBPS) for hop in hops[:-1])
    return sum(hop.alpha_us for hop in hops) + forward_us


def _link_us_per_block(topology: Topology, block_bytes: float) -> dict[tuple[str, str], float]:
    """Return, per link key, the µs one block takes over it at the link's bandwidth."""
    return {link.key: block_bytes / (link.bandwidth_GBps * BYTES_PER_US_PER_GBPS) for link in topology.links}


def _build_model(
    topology: Topology, classes: Sequence[PathClass], size_bytes: int
) -> tuple[pulp.LpProblem, dict[tuple[int, int], pulp.LpVariable], pulp.LpVariable]:
    """Return the routing LP, its share variables keyed by (class, kind index) and the bottleneck variable."""
    block_bytes = size_bytes / topology.num_ranks
    per_block_us = _link_us_per_block(topology, block_bytes)
    prob = pulp.LpProblem("alltoall_routing", pulp.LpMinimize)
    keys = [(c, k) for c, path_class in enumerate(classes) for k in range(len(path_class.paths))]
    share = prob.add_variable_dicts("share", keys, lowBound=0, upBound=1)
    # The bottleneck cannot exceed all of the traffic over the slowest link: a finite upper bound.
    horizon = topology.num_ranks**2 * max(per_block_us.values())
    bottleneck = prob.add_variable("bottleneck_us", lowBound=0, upBound=horizon)
    alpha_terms = []
    rows: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
    for c, path_class in enumerate(classes):
        prob += pulp.lpSum(share[c, k] for k in range(len(path_class.paths))) == 1, f"whole_{c}"
        for k, (_, instances) in enumerate(path_class.paths):
            loads: dict[tuple[str, str], float] = {}
            for ranks in instances:
                _hop_loads(topology, ranks, loads, 1.0)
            for link, crossings in loads.items():
                rows.setdefault(link, {})[c, k] = crossings * per_block_us[link]
            latency_us = sum(_path_latency_us(topology, r, block_bytes) for r in instances) / len(instances)
            alpha_terms.append((share[c, k], latency_us / len(classes)))
    prob += bottleneck + linear_sum(alpha_terms)
    written: set[tuple] = set()
    for index, link in enumerate(sorted(rows)):
        terms = tuple(sorted((key, round(us, 9)) for key, us in rows[link].items() if us > _NEGLIGIBLE_US))
        if terms in written:
            continue  # symmetry: another machine's copy of this link carries the same load
        written.add(terms)
        prob += linear_sum([(share[key], us) for key, us in terms]) <= bottleneck, f"link_{index}"
    return prob, share, bottleneck


def route_alltoall(
    topology: Topology,
    size_bytes: int,
    options: SolverOptions | None = None,
    *,
    direct: bool = True,
    progress: Callable[[str], None] | None = None,
) -> AlltoallRouting:
    """Return the LP routing of the AlltoAll blocks for ``size_bytes`` (the nccl-tests size, bytes per rank).

    Parameters
    ----------
    topology : Topology
        One or more machines; across machines relays come from ``alltoall_relays``.
    size_bytes : int
        Each rank's buffer; a block is ``size_bytes / N``. It weighs bandwidth against latency.
    options : SolverOptions, optional
        The solver (default HiGHS); the LP has no integers, so no work budget binds.
    direct : bool
        False: across machines, every block with a relay path takes relays (``path_classes``),
        which keeps each GPU's peers, and so its threadblocks, few.
    progress : callable, optional
        Gets the solver's lines.

    Returns
    -------
    AlltoallRouting
        Without a solution (no HiGHS and no CBC) every class keeps its first path kind and
        ``status`` says why.

    Notes
    -----
    Columns: one per (class, path), at most (4 + 2 NICs) G² per pair of machine kinds across
    machines and G² (G - 1) inside one, for G GPUs per machine, whatever the node count (DGX-2:
    about 4,300 at any node count, solved in about a second); rows: one per link load that
    symmetry does not repeat.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> routing = route_alltoall(load_topology("dgx-a100", 2), 16_000_000)
    >>> routing.status, len(routing.classes)
    ('optimal', 120)
    """
    options = options if options is not None else SolverOptions()
    classes = path_classes(topology, direct=direct)
    if not classes:
        return AlltoallRouting((), (), size_bytes, 0.0, SolveStatus.OPTIMAL.value)
    prob, share, bottleneck = _build_model(topology, classes, size_bytes)
    outcome = solve_model(prob, options, progress=progress)
    if not outcome.has_solution:
        logger.warning("alltoall routing LP: %s; every class takes its first path", outcome.status.value)
        shares = tuple(tuple(1.0 if k == 0 else 0.0 for k in range(len(c.paths))) for c in classes)
        return AlltoallRouting(classes, shares, size_bytes, float("nan"), outcome.status.value)
    shares = tuple(
        tuple(max(0.0, float(share[c, k].value() or 0.0)) for k in range(len(path_class.paths)))
        for c, path_class in enumerate(classes)
    )
    return AlltoallRouting(classes, shares, size_bytes, float(bottleneck.value() or 0.0), outcome.status.value)


def round_routing(routing: AlltoallRouting, pieces: int) -> tuple[tuple[int, ...], ...]:
    """Return, per class, how many of a block's ``pieces`` take each path kind (largest remainders first).

    >>> r = AlltoallRouting((), ((0.5, 0.5), (0.2, 0.8)), 1, 0.0, "optimal")
    >>> round_routing(r, 2)
    ((1, 1), (0, 2))
    """
    out = []
    for shares in routing.shares:
        total = sum(shares) or 1.0
        exact = [pieces * share / total for share in shares]
        counts = [int(value) for value in exact]
        order = sorted(range(len(exact)), key=lambda k: (-(exact[k] - counts[k]), k))
        for k in order[: pieces - sum(counts)]:
            counts[k] += 1
        out.append(tuple(counts))
    return tuple(out)
