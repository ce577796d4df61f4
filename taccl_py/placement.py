"""Pipeline-stage placement: put stage k and k+1 on GPUs whose transfer is cheapest.

Pipeline parallelism sends one activation per microbatch from stage k to stage k+1, one
after the other, so the modelled per-microbatch point-to-point time is the sum over the
S-1 boundaries of ``route(topology, a, b).time_us(activation_bytes)``. Inside a node the
cheapest order rides NVLink (a Hamiltonian path through the NVLink graph where one exists);
across nodes the boundary stages land on the GPUs nearest their NIC, because the route
through a NIC on the same PCIe switch is the cheapest one the cost model offers.

The family of placements searched: one GPU per stage, each node hosting one contiguous
block of stages (possibly empty), nodes visited in index order. This is how pipeline
launchers lay stages out (consecutive stages per machine, so only block boundaries cross
the network); for identical nodes joined by one network switch the order of the nodes
does not change the cost.

Method: ``"exact"`` (the default up to ``EXACT_MAX_GPUS_PER_NODE`` GPUs per node) runs a
Held-Karp dynamic programme over subsets of each node's GPUs, giving the cheapest simple
path for every (first GPU, last GPU, length), then a dynamic programme over the nodes that
chooses each block's length and boundary GPUs. Beyond that size ``"heuristic"`` replaces
the subset DP by greedy nearest-neighbour chains from every first GPU improved by 2-opt
(reversal of inner segments), and the node DP is unchanged; the result is never worse
than the naive order.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from taccl_py.errors import ArgumentError
from taccl_py.topology.model import Topology, route

__all__ = [
    "DEFAULT_ACTIVATION_BYTES",
    "EXACT_MAX_GPUS_PER_NODE",
    "PlacementHop",
    "PlacementResult",
    "place_pipeline",
    "pipeline_time_us",
    "stage_cost_matrix_us",
]

_log = logging.getLogger(__name__)

# 16 MB: one microbatch of activations of a mid-size transformer (e.g. 4 sequences x 2048
# tokens x 1024 hidden x fp16); large enough that bandwidth, not latency, orders the routes.
DEFAULT_ACTIVATION_BYTES = 16_000_000
# Held-Karp over 2**16 subsets x 16 last GPUs x 16 first GPUs stays around a second in numpy.
EXACT_MAX_GPUS_PER_NODE = 16
_METHODS = ("auto", "exact", "heuristic")


@dataclass(frozen=True)
class PlacementHop:
    """One stage boundary: the transfer from stage ``stage`` to ``stage + 1``."""

    stage: int
    src_rank: int
    dst_rank: int
    time_us: float
    link_kinds: tuple[str, ...]


@dataclass(frozen=True)
class PlacementResult:
    """Stages placed on GPUs: ``stage_ranks[k]`` is the global rank that runs stage k.

    ``time_us`` and ``naive_time_us`` are the modelled per-microbatch point-to-point times
    (µs) of this order and of stage k on rank k; ``gain`` is their ratio (naive / placed,
    1.0 when both are zero).
    """

    topology: str
    stage_ranks: tuple[int, ...]
    rank_nodes: tuple[int, ...]
    rank_local_indices: tuple[int, ...]
    time_us: float
    naive_time_us: float
    gain: float
    activation_bytes: int
    method: str
    hops: tuple[PlacementHop, ...] = ()

    def cuda_visible_devices(self) -> dict[int, str]:
        """Return, per node, the CUDA_VISIBLE_DEVICES list of its stages in stage order.

        Local rank i of a launcher on that node then runs that node's i-th stage. Indices
        are PCI-bus ordered (set ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), as the topology's.

        Examples
        --------
        >>> r = PlacementResult("t", (0, 1, 3, 2), (0, 0, 0, 0), (0, 1, 3, 2), 1.0, 2.0, 2.0, 1, "exact")
        >>> r.cuda_visible_devices()
        {0: '0,1,3,2'}
        """
        lists: dict[int, list[str]] = {}
        for node, local in zip(self.rank_nodes, self.rank_local_indices):
            lists.setdefault(node, []).append(str(local))
        return {node: ",".join(items) for node, items in lists.items()}

    def rank_list(self) -> str:
        """Return the global ranks of stages 0..S-1 as ``"0,1,3,2"`` for pipeline launchers."""
        return ",".join(str(rank) for rank in self.stage_ranks)

    def to_json_dict(self) -> dict[str, object]:
        """Return the result as plain JSON-ready values."""
        return {
            "topology": self.topology,
            "stages": len(self.stage_ranks),
            "stage_ranks": list(self.stage_ranks),
            "cuda_visible_devices": {str(k): v for k, v in self.cuda_visible_devices().items()},
            "time_us": self.time_us,
            "naive_time_us": self.naive_time_us,
            "gain": self.gain,
            "activation_bytes": self.activation_bytes,
            "method": self.method,
            "hops": [
                {"stage": h.stage, "src_rank": h.src_rank, "dst_rank": h.dst_rank, "time_us": h.time_us, "link_kinds": list(h.link_kinds)}
                for h in self.hops
            ],
        }


def stage_cost_matrix_us(topology: Topology, activation_bytes: int = DEFAULT_ACTIVATION_BYTES) -> np.ndarray:
    """Return the N x N matrix (µs) of sending ``activation_bytes`` from rank a to rank b.

    The diagonal is ``inf`` (a stage never follows itself on one GPU).

    >>> from taccl_py.topology.model import Link, LinkKind, Vertex, VertexKind, make_topology
    >>> gpus = [Vertex(f"gpu{i}", VertexKind.GPU, rank=i, local_index=i) for i in range(2)]
    >>> links = [Link("gpu0", "gpu1", LinkKind.NVLINK, 1.0, 10.0), Link("gpu1", "gpu0", LinkKind.NVLINK, 1.0, 10.0)]
    >>> stage_cost_matrix_us(make_topology("two", gpus, links), 10_000)[0, 1]
    np.float64(2.0)
    """
    _check_bytes(activation_bytes)
    n = topology.num_ranks
    costs = np.full((n, n), np.inf)
    for a in range(n):
        for b in range(n):
            if a != b:
                costs[a, b] = route(topology, a, b).time_us(activation_bytes)
    return costs


def pipeline_time_us(topology: Topology, stage_ranks: Sequence[int], activation_bytes: int = DEFAULT_ACTIVATION_BYTES) -> float:
    """Return the modelled per-microbatch p2p time (µs) of running stage k on ``stage_ranks[k]``."""
    _check_bytes(activation_bytes)
    _check_order(topology, stage_ranks)
    return float(sum(route(topology, a, b).time_us(activation_bytes) for a, b in zip(stage_ranks, stage_ranks[1:])))


def place_pipeline(
    topology: Topology,
    stages: int,
    activation_bytes: int = DEFAULT_ACTIVATION_BYTES,
    method: str = "auto",
    progress: Callable[[str], None] | None = None,
) -> PlacementResult:
    """Return the placement of ``stages`` pipeline stages with the least modelled p2p time.

    Parameters
    ----------
    topology : Topology
        The machine(s); compose several nodes first (``load_topology(name, nodes)``).
    stages : int
        Number of pipeline stages S, 1 <= S <= number of GPUs; with S below the GPU count
        the placement also chooses which GPUs to use.
    activation_bytes : int
        Bytes sent from one stage to the next per microbatch (default 16 MB).
    method : {"auto", "exact", "heuristic"}
        ``"auto"`` is exact up to ``EXACT_MAX_GPUS_PER_NODE`` GPUs per node, heuristic beyond.
    progress : callable, optional
        Called with a short message as each node's chain table is built.

    Returns
    -------
    PlacementResult
        Stage order, modelled time (µs) against the naive order (stage k on rank k), gain.

    Raises
    ------
    ArgumentError
        If ``stages`` is out of range, ``activation_bytes`` is not positive, ``method`` is
        unknown, or ``"exact"`` is asked for above ``EXACT_MAX_GPUS_PER_NODE`` GPUs a node.

    Notes
    -----
    Exact within the family of node-ordered contiguous blocks (module docstring). Cost:
    N^2 route look-ups, then per node O(g^2 2^g) for the subset DP (exact) or O(g^4) for the
    chains (heuristic), then O(n S g^3) for the node DP.

    Examples
    --------
    >>> from taccl_py.topology.model import Link, LinkKind, Vertex, VertexKind, make_topology
    >>> gpus = [Vertex(f"gpu{i}", VertexKind.GPU, rank=i, local_index=i) for i in range(3)]
    >>> fast = [("gpu0", "gpu2"), ("gpu2", "gpu1")]
    >>> links = [Link(a, b, LinkKind.NVLINK if (a, b) in fast or (b, a) in fast else LinkKind.PCIE, 1.0,
    ...               50.0 if (a, b) in fast or (b, a) in fast else 10.0)
    ...          for a in ("gpu0", "gpu1", "gpu2") for b in ("gpu0", "gpu1", "gpu2") if a != b]
    >>> result = place_pipeline(make_topology("toy", gpus, links), 3, activation_bytes=1_000_000)
    >>> result.stage_ranks, result.time_us, result.naive_time_us
    ((0, 2, 1), 42.0, 122.0)
    """
    _check_bytes(activation_bytes)
    if not isinstance(stages, int) or not 1 <= stages <= topology.num_ranks:
        raise ArgumentError(topology.name, "stages", f"{stages!r} stages", f"1..{topology.num_ranks} (one GPU per stage)")
    if method not in _METHODS:
        raise ArgumentError(topology.name, "method", f"unknown method {method!r}", "one of " + ", ".join(_METHODS))
    groups = _node_groups(topology)
    largest = max(len(group) for group in groups)
    if method == "exact" and largest > EXACT_MAX_GPUS_PER_NODE:
        raise ArgumentError(topology.name, "method", f"exact placement over {largest} GPUs per node", f"at most {EXACT_MAX_GPUS_PER_NODE} GPUs per node, or method 'heuristic'")
    chosen = method if method != "auto" else ("exact" if largest <= EXACT_MAX_GPUS_PER_NODE else "heuristic")
    costs = stage_cost_matrix_us(topology, activation_bytes)
    order, total = _place(costs, groups, stages, chosen, progress)
    naive = tuple(range(stages))
    naive_total = _path_cost(costs, naive)
    if naive_total < total:  # only the heuristic can lose to the naive order
        order, total = naive, naive_total
    _log.info("placed %d stages on %s: %.1f us (naive %.1f us, %s)", stages, topology.name, total, naive_total, chosen)
    return _result(topology, costs, order, total, naive_total, activation_bytes, chosen)


def _check_bytes(activation_bytes: int) -> None:
    if not activation_bytes > 0:
        raise ArgumentError(None, "activation_bytes", f"{activation_bytes!r} bytes", "a positive size")


def _check_order(topology: Topology, stage_ranks: Sequence[int]) -> None:
    if len(set(stage_ranks)) != len(stage_ranks) or any(not 0 <= r < topology.num_ranks for r in stage_ranks):
        raise ArgumentError(topology.name, "stage_ranks", f"{list(stage_ranks)} is not a list of distinct ranks", f"distinct ranks in 0..{topology.num_ranks - 1}")


def _node_groups(topology: Topology) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for rank in range(topology.num_ranks):
        groups.setdefault(topology.node_of(rank), []).append(rank)
    return [groups[node] for node in sorted(groups)]


def _path_cost(costs: np.ndarray, order: Sequence[int]) -> float:
    return float(sum(costs[a, b] for a, b in zip(order, order[1:])))


def _result(topology: Topology, costs: np.ndarray, order: tuple[int, ...], total: float, naive_total: float, activation_bytes: int, method: str) -> PlacementResult:
    hops = tuple(
        PlacementHop(k, a, b, float(costs[a, b]), tuple(link.kind.value for link in route(topology, a, b).links))
        for k, (a, b) in enumerate(zip(order, order[1:]))
    )
    gain = naive_total / total if total > 0 else 1.0
    return PlacementResult(
        topology=topology.name,
        stage_ranks=tuple(int(r) for r in order),
        rank_nodes=tuple(topology.node_of(r) for r in order),
        rank_local_indices=tuple(_local_index(topology, r) for r in order),
        time_us=float(total),
        naive_time_us=float(naive_total),
        gain=float(gain),
        activation_bytes=int(activation_bytes),
        method=method,
        hops=hops,
    )


def _local_index(topology: Topology, rank: int) -> int:
    vertex = topology.gpu(rank)
    if vertex.local_index is not None:
        return vertex.local_index
    return rank - vertex.node * topology.gpus_per_node


# -- per-node chain tables --------------------------------------------------------------------

@dataclass(frozen=True)
class _ChainTable:
    """Cheapest simple paths inside one node: ``cost[f, l, m]`` over m GPUs from f to l."""

    cost: np.ndarray
    paths: Callable[[int, int, int], tuple[int, ...]]


def _place(costs: np.ndarray, groups: list[list[int]], stages: int, method: str, progress: Callable[[str], None] | None) -> tuple[tuple[int, ...], float]:
    tables: list[_ChainTable] = []
    cache: dict[bytes, _ChainTable] = {}
    for node, group in enumerate(groups):
        local = costs[np.ix_(group, group)]
        key = local.tobytes()
        if key not in cache:
            cache[key] = _exact_chains(local) if method == "exact" else _heuristic_chains(local)
        tables.append(cache[key])
        if progress is not None:
            progress(f"node {node}: chain table over {len(group)} GPUs ({method})")
    return _node_dp(costs, groups, tables, stages)


def _node_dp(costs: np.ndarray, groups: list[list[int]], tables: list[_ChainTable], stages: int) -> tuple[tuple[int, ...], float]:
    """Choose each node's block length and boundary GPUs; return the best order and its cost."""
    # history[k]: states before node k, (stages placed, last global rank or -1) -> (cost, back)
    # with back = (key in history[node], node, first, last, length) of the block that made it.
    history: list[dict[tuple[int, int], tuple[float, tuple | None]]] = [{(0, -1): (0.0, None)}]
    for node, (group, table) in enumerate(zip(groups, tables)):
        history.append(_extend_states(costs, group, table, node, history[-1], stages))
    states = history[-1]
    _, key = min((value, key) for key, (value, _) in states.items() if key[0] == stages)
    blocks: list[tuple[int, ...]] = []
    back = states[key][1]
    while back is not None:
        prev_key, node, f_idx, l_idx, m = back
        blocks.append(tuple(groups[node][i] for i in tables[node].paths(f_idx, l_idx, m)))
        back = history[node][prev_key][1]
    order = tuple(rank for block in reversed(blocks) for rank in block)
    return order, _path_cost(costs, order)


def _extend_states(costs: np.ndarray, group: list[int], table: _ChainTable, node: int, states: dict, stages: int) -> dict:
    """Return the node-DP states after ``node`` takes a block of 0..len(group) stages."""
    nxt = dict(states)  # an empty block leaves every state as it was
    members = np.array(group)
    for (placed, last), (base, _) in states.items():
        entry = np.zeros(len(group)) if last < 0 else costs[last, members]
        for m in range(1, min(len(group), stages - placed) + 1):
            total = base + entry[:, None] + table.cost[:, :, m]
            firsts = np.argmin(total, axis=0)
            for l_idx, f_idx in enumerate(firsts):
                value = float(total[f_idx, l_idx])
                key = (placed + m, group[l_idx])
                if np.isfinite(value) and (key not in nxt or value < nxt[key][0]):
                    nxt[key] = (value, ((placed, last), node, int(f_idx), l_idx, m))
    return nxt


def _subset_layers(size: int) -> list[np.ndarray]:
    """Return, for p = 0..size, the bit masks over ``size`` items with p bits set."""
    masks = np.arange(1 << size, dtype=np.int64)
    popcount = np.zeros(1 << size, dtype=np.int64)
    for bit in range(size):
        popcount += (masks >> bit) & 1
    return [masks[popcount == p] for p in range(size + 1)]


def _held_karp(local: np.ndarray, first: int, layers: list[np.ndarray]) -> np.ndarray:
    """Return dp[mask, last]: the cheapest path from ``first`` through exactly ``mask`` to ``last``."""
    g = len(local)
    dp = np.full((1 << g, g), np.inf)
    dp[1 << first, first] = 0.0
    for p in range(2, g + 1):
        masks = layers[p][(layers[p] >> first) & 1 == 1]
        for j in range(g):
            if j == first:
                continue
            with_j = masks[(masks >> j) & 1 == 1]
            if len(with_j):
                dp[with_j, j] = np.min(dp[with_j ^ (1 << j)] + local[:, j], axis=1)
    return dp


def _exact_chains(local: np.ndarray) -> _ChainTable:
    """Return the cheapest simple path for every (first, last, length) by Held-Karp."""
    g = len(local)
    layers = _subset_layers(g)
    cost = np.full((g, g, g + 1), np.inf)
    best_mask = np.zeros((g, g, g + 1), dtype=np.int64)
    for first in range(g):
        dp = _held_karp(local, first, layers)
        for p in range(1, g + 1):
            masks = layers[p][(layers[p] >> first) & 1 == 1]
            values = dp[masks]
            pick = np.argmin(values, axis=0)
            cost[first, :, p] = values[pick, np.arange(g)]
            best_mask[first, :, p] = masks[pick]

    def paths(first: int, last: int, length: int) -> tuple[int, ...]:
        dp = _held_karp(local, first, layers)
        mask, current, path = int(best_mask[first, last, length]), last, [last]
        while mask != 1 << first:
            previous = mask ^ (1 << current)
            current = int(np.argmin(dp[previous] + local[:, current]))
            path.append(current)
            mask = previous
        return tuple(reversed(path))

    return _ChainTable(cost, paths)


def _heuristic_chains(local: np.ndarray) -> _ChainTable:
    """Return greedy nearest-neighbour chains from every first GPU (full ones improved by 2-opt)."""
    g = len(local)
    cost = np.full((g, g, g + 1), np.inf)
    chains: dict[tuple[int, int, int], tuple[int, ...]] = {}
    for first in range(g):
        chain = _greedy_chain(local, first)
        for length in range(1, g + 1):
            prefix = chain if length < g else _two_opt(local, chain)
            prefix = prefix[:length]
            value = _path_cost(local, prefix)
            key = (first, prefix[-1], length)
            if value < cost[key]:
                cost[key] = value
                chains[key] = prefix
    return _ChainTable(cost, lambda first, last, length: chains[(first, last, length)])


def _greedy_chain(local: np.ndarray, first: int) -> tuple[int, ...]:
    chain, unused = [first], set(range(len(local))) - {first}
    while unused:
        nxt = min(unused, key=lambda j: (local[chain[-1], j], j))
        chain.append(nxt)
        unused.discard(nxt)
    return tuple(chain)


def _two_opt(local: np.ndarray, chain: tuple[int, ...], max_passes: int = 4) -> tuple[int, ...]:
    """Return ``chain`` improved by reversing inner segments (first GPU kept) until no gain."""
    best, best_value = chain, _path_cost(local, chain)
    for _ in range(max_passes):
        improved = False
        for i, j in itertools.combinations(range(1, len(best)), 2):
            candidate = best[:i] + best[i:j + 1][::-1] + best[j + 1:]
            value = _path_cost(local, candidate)
            if value < best_value - 1e-9:
                best, best_value, improved = candidate, value, True
        if not improved:
            break
    return best
