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
the network); for identical nodes joined by one network switch (``compose_nodes``) the
order of the nodes does not change the cost, so the result is exact over every node order. In a
cluster of different machines, or with NICs down or slower on some, the nodes keep their rank
order (the launcher's) and the result is exact within it; a GPU whose NIC is down reaches the
network only over a longer PCIe/host route, so block boundaries land on GPUs next to working NICs.

Method: ``"exact"`` (the default up to ``EXACT_MAX_GPUS_PER_NODE`` GPUs per node) runs a
Held-Karp dynamic programme over subsets of each node's GPUs, giving the cheapest simple
path for every (first GPU, last GPU, length), then a dynamic programme over the nodes that
chooses each block's length and boundary GPUs. Beyond that size ``"heuristic"`` replaces
the subset DP by greedy nearest-neighbour chains from every first GPU improved by 2-opt
(reversal of inner segments), and the node DP is unchanged; the result is never worse
than the naive order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from taccl_py.errors import ArgumentError
from taccl_py.placement.chains import ChainTable, exact_chains, heuristic_chains, path_cost
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
# A placement within this relative margin of the naive order's time is no gain (float noise).
_TIE_RELATIVE = 1e-9


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
                {
                    "stage": h.stage,
                    "src_rank": h.src_rank,
                    "dst_rank": h.dst_rank,
                    "time_us": h.time_us,
                    "link_kinds": list(h.link_kinds),
                }
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


def pipeline_time_us(
    topology: Topology, stage_ranks: Sequence[int], activation_bytes: int = DEFAULT_ACTIVATION_BYTES
) -> float:
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
    chains (heuristic), then O(n S g^3) for the node DP. When no order beats the naive one
    (e.g. an NVSwitch machine with a NIC next to every GPU) the naive order is returned.

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
    ((1, 2, 0), 42.0, 122.0)
    """
    _check_bytes(activation_bytes)
    if not isinstance(stages, int) or not 1 <= stages <= topology.num_ranks:
        raise ArgumentError(
            topology.name, "stages", f"{stages!r} stages", f"1..{topology.num_ranks} (one GPU per stage)"
        )
    if method not in _METHODS:
        raise ArgumentError(topology.name, "method", f"unknown method {method!r}", "one of " + ", ".join(_METHODS))
    groups = _node_groups(topology)
    largest = max(len(group) for group in groups)
    if method == "exact" and largest > EXACT_MAX_GPUS_PER_NODE:
        raise ArgumentError(
            topology.name,
            "method",
            f"exact placement over {largest} GPUs per node",
            f"at most {EXACT_MAX_GPUS_PER_NODE} GPUs per node, or method 'heuristic'",
        )
    chosen = method if method != "auto" else ("exact" if largest <= EXACT_MAX_GPUS_PER_NODE else "heuristic")
    costs = stage_cost_matrix_us(topology, activation_bytes)
    order, total = _place(costs, groups, stages, chosen, progress)
    naive = tuple(range(stages))
    naive_total = path_cost(costs, naive)
    if naive_total <= total * (1 + _TIE_RELATIVE):  # no gain: keep the order users expect
        order, total = naive, naive_total
    _log.info("placed %d stages on %s: %.1f us (naive %.1f us, %s)", stages, topology.name, total, naive_total, chosen)
    return _result(topology, costs, order, total, naive_total, activation_bytes, chosen)


def _check_bytes(activation_bytes: int) -> None:
    if not activation_bytes > 0:
        raise ArgumentError(None, "activation_bytes", f"{activation_bytes!r} bytes", "a positive size")


def _check_order(topology: Topology, stage_ranks: Sequence[int]) -> None:
    if len(set(stage_ranks)) != len(stage_ranks) or any(not 0 <= r < topology.num_ranks for r in stage_ranks):
        raise ArgumentError(
            topology.name,
            "stage_ranks",
            f"{list(stage_ranks)} is not a list of distinct ranks",
            f"distinct ranks in 0..{topology.num_ranks - 1}",
        )


def _node_groups(topology: Topology) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for rank in range(topology.num_ranks):
        groups.setdefault(topology.node_of(rank), []).append(rank)
    return [groups[node] for node in sorted(groups)]


def _result(
    topology: Topology,
    costs: np.ndarray,
    order: tuple[int, ...],
    total: float,
    naive_total: float,
    activation_bytes: int,
    method: str,
) -> PlacementResult:
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


def _place(
    costs: np.ndarray, groups: list[list[int]], stages: int, method: str, progress: Callable[[str], None] | None
) -> tuple[tuple[int, ...], float]:
    tables: list[ChainTable] = []
    cache: dict[bytes, ChainTable] = {}
    for node, group in enumerate(groups):
        local = costs[np.ix_(group, group)]
        key = local.tobytes()
        if key not in cache:
            cache[key] = exact_chains(local) if method == "exact" else heuristic_chains(local)
        tables.append(cache[key])
        if progress is not None:
            progress(f"node {node}: chain table over {len(group)} GPUs ({method})")
    return _node_dp(costs, groups, tables, stages)


def _node_dp(
    costs: np.ndarray, groups: list[list[int]], tables: list[ChainTable], stages: int
) -> tuple[tuple[int, ...], float]:
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
    return order, path_cost(costs, order)


def _extend_states(
    costs: np.ndarray, group: list[int], table: ChainTable, node: int, states: dict, stages: int
) -> dict:
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
