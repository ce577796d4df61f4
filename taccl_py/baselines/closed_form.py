"""NCCL's ring and double binary tree in closed form, for many identical machines, and NCCL's latency constants.

Above ``CLOSED_FORM_ABOVE_RANKS`` GPUs a ring is (N-1) steps times channels of sends (AllReduce
twice that), too many to build, verify and replay in a synthesis' budget (512 GPUs: 2 million
transfers). The replay of those schedules has a closed form under serialized sends
(``MSCCL_LOOP``, ``WHOLE_CHUNKS``; ``taccl_py.simulate.engine``) when every channel moves in
lockstep, each send on a link shared by ``load`` sends of one step:

* a send of s bytes on route r costs w_r(s) = α_r + s · max over r's links of load / capacity;
* ring: a rank's send of step j waits for its own send j-1 and the one it receives at step j-1,
  so the slowest send paces every step (max-plus: the ring's cycle mean is at most its largest
  self-loop)::

      time = Σ over slices s of steps · max_r w_r(s),   steps = N-1 (AllReduce 2(N-1))

* double binary tree: each tree edge is a connection of its own (a threadblock per peer and
  channel), so K = pieces × slices pieces flow through a pipeline whose deepest chain climbs
  (G-1) GPU hops and D machine hops and descends as many::

      time = Σ over the deepest chain of w_alone(s_0) + Σ over the other K-1 pieces of max_e w_e(s)

  (w_alone: the hop with load 1)

with D the deeper tree's depth in machines (``binary_tree_parents``: about log2 of the machines),
G the GPUs per machine. Rings and trees are those ``ring_orders`` and ``tree_parents`` build, on a
representative of a few machines (``representative``): with identical machines every machine's
hops and link loads are the same, so the many-machine schedule needs no routes across all of
them.

Where sends pipeline (``pipelined``; ``msccl-net`` between machines, the default) the ring falls out
of lockstep: a hop's sender is free once its bytes have left, and the steps no longer share one
pace. The ring is then timed as the longest path through its steps (``_pipelined_ring_time``):
position i's step k waits for its own step k-1 to leave, for step k-1's data from position i-1
(α plus bytes), and for position i+1 to have taken its data of ``send_slots`` steps before. Each
hop's channels are charged their own α and bytes, and the shared links' bytes together, whichever
is longer, which undercuts the replay where channels' α overlap less than that
(``RING_PIPELINED_AGREEMENT``). The tree's steady pace charges a pipelined hop its bytes only.
``tests/test_nccl_scale.py`` holds the forms to the replay on
2-8 machines: the ring exactly (``RING_AGREEMENT``), the tree within ``TREE_AGREEMENT``: its
pipeline's fill is charged with each hop alone on its links and its steady pace with every edge
sharing them, which undercuts the replay (channels climbing together share GPU ports during the
fill) by 10% at 1 GiB to 40% at 1 MiB.
An optimistic baseline never flatters a result compared with it.

NCCL's own latency model, cited (NVIDIA/nccl ``src/graph/tuning.cc`` @5067397c, master of
2026-06-11; the figures are those of v2.23.4 @68b54236): ``baseLat`` lines 150-155, ``hwLat``
lines 157-175, the per-algorithm latency lines 384-434, ``ncclPatEnable`` lines 216-223::

    baseLat (LL, LL128, Simple)   Tree 6.8 14.0 8.4   Ring 6.6 14.0 8.4   PAT 8.0 8.0 8.0
    hwLat NVLink                  Tree 0.6 1.25 4.0   Ring 0.6 1.9 3.4    PAT -   -   4.0
    hwLat PCI                     Tree 1.0 1.9  4.0   Ring 1.0 2.5 5.7    PAT -   -   4.0
    hwLat NET                     Tree 5.0 8.5  14    Ring 2.7 4.0 14.0   PAT -   -   14

    Ring  baseLat + (nsteps - nInter) · max(intraLat, netOverhead) + nInter · interLat     (l. 394-412)
          nsteps = N-1 (AllReduce 2(N-1)), nInter = nNodes-1 (AllReduce 2(nNodes-1)),
          netOverhead 1 µs (x3 Simple) above one node (l. 405-410)
    Tree  baseLat + 2 ((N/nNodes - 1) intraLat + log2i(nNodes) interLat)               (l. 414-416)
    PAT   baseLat + log2i(nNodes) interLat / 3.5 + 2.8 N                              (l. 429-433)

interLat is NET's hwLat of the algorithm (of Tree with one GPU per node, l. 387) plus the graph's
``latencyInter`` (twice for Simple, l. 389-391; 0 here). PAT runs only with one GPU per node
(``nNodes == nRanks``, l. 220: still so at @5067397c), AllGather and ReduceScatter, Simple only.
Like ``taccl_py.simulate.protocol``, times here never add ``baseLat``: no simulated schedule pays
a launch, so no modelled one does.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from taccl_py.baselines._plans import binary_tree_parents, complement_tree_parents
from taccl_py.baselines.ring import ring_orders
from taccl_py.baselines.tree import default_tree_channels, tree_chunks_for, tree_depth, tree_parents
from taccl_py.ir.collectives import Collective, parse_collective
from taccl_py.simulate.model import DEFAULT_MODEL, ExecutionModel, slice_sizes
from taccl_py.simulate.protocol import SIMPLE
from taccl_py.topology.compose import NETWORK_SWITCH, compose_machines, local_name
from taccl_py.topology.fingerprint import node_signatures
from taccl_py.topology.model import Topology, make_topology, route
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = [
    "NCCL_PREFIX",
    "closed_form_applies",
    "closed_form_times",
    "RING_AGREEMENT",
    "RING_PIPELINED_AGREEMENT",
    "TREE_AGREEMENT",
    "CLOSED_FORM_ABOVE_RANKS",
    "NCCL_BASE_LATENCY_US",
    "NCCL_HW_LATENCY_US",
    "HopCost",
    "nccl_latency_us",
    "representative",
    "ring_closed_form",
    "tree_closed_form",
]

# A ring or tree in closed form is named as built, after this prefix: nccl-ring-8ch-1p.
NCCL_PREFIX = "nccl-"
#: Above this many GPUs the ring and tree are modelled here instead of built and replayed.
CLOSED_FORM_ABOVE_RANKS = 64
#: The ring's form equals its replay to this relative difference on 2-8 identical machines where
#: its slowest hop has links of its own (DGX-H100/A100/B200, DGX-2, DGX-1, NDv2, MI300X: checked).
#: Where hops share a PCIe switch (pcie-8gpu x2) it is pessimistic by one step's transient, ~6 µs
#: (4% at 1 MiB, 0.1% at 1 GiB).
RING_AGREEMENT = 1e-6
#: The pipelined ring's form over its replay on 2-8 identical machines lies in this range (2026-11-30:
#: 0.91-1.02 on DGX-H100/A100/B200, DGX-2, DGX-1 under msccl-net; down to 0.69 on PCIe and MI300X
#: machines, whose channels share GPU ports and overlap their α less; NDv2 0.80 at 1-16 MiB).
RING_PIPELINED_AGREEMENT = (0.65, 1.02)
#: The tree's form over its replay on 2-8 machines lies in this range: the fill of its pipeline is
#: charged unshared, so the form is optimistic (0.60-0.91 of the replay on DGX-H100/A100 x2-x4).
TREE_AGREEMENT = (0.55, 1.0)
# Machines in the representative of a tree: enough for every NIC to carry what it carries in a
# larger tree (a machine inner in one tree and a leaf in the other).
_TREE_MACHINES = 8

# NVIDIA/nccl src/graph/tuning.cc @5067397c l. 150-175: (LL, LL128, Simple) per algorithm.
NCCL_BASE_LATENCY_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "pat": (8.0, 8.0, 8.0)}
NCCL_HW_LATENCY_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "pat": (0.0, 0.0, 4.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "pat": (0.0, 0.0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "pat": (0.0, 0.0, 14.0)},
}
_PROTOCOL_INDEX = {"LL": 0, "LL128": 1, SIMPLE: 2}
_NET_OVERHEAD_US = 1.0  # getNetOverhead on x86 Intel and others (l. 219-225), x3 for Simple


def nccl_latency_us(
    algorithm: str, collective: Collective, ranks: int, nodes: int, protocol: str = SIMPLE, *, nvlink: bool = True
) -> float:
    """Return NCCL's tuning-model latency (µs, ``baseLat`` excluded) of ``algorithm`` (ring, tree or pat).

    ``nvlink``: the GPUs of a machine talk over NVLink (else PCI). Ring grows with the ranks,
    tree with log2 of the machines, PAT with both (its 2.8 µs per rank, l. 433).

    >>> [round(nccl_latency_us("ring", Collective.ALLGATHER, n, n // 8), 1) for n in (64, 128)]
    [288.4, 590.8]
    """
    p = _PROTOCOL_INDEX[protocol]
    hw_intra = "nvlink" if nvlink else "pci"
    per_node = ranks // nodes
    inter = NCCL_HW_LATENCY_US["net"]["tree" if per_node == 1 else algorithm][p]
    intra = NCCL_HW_LATENCY_US[hw_intra][algorithm][p]
    log_nodes = int(math.log2(nodes)) if nodes > 0 else 0  # NCCL's log2i: floor
    if algorithm == "ring":
        reduce = collective is Collective.ALLREDUCE
        steps = (2 if reduce else 1) * (ranks - 1)
        inter_steps = 0 if nodes == 1 else (2 if reduce else 1) * (nodes - 1)
        if nodes > 1:
            intra = max(intra, _NET_OVERHEAD_US * (3 if protocol == SIMPLE else 1))
        return (steps - inter_steps) * intra + inter_steps * inter
    if algorithm == "tree":
        return 2 * ((per_node - 1) * intra + log_nodes * inter)
    return log_nodes * inter / 3.5 + 2.8 * ranks


@dataclass(frozen=True)
class HopCost:
    """A send's cost in lockstep: ``alpha_us`` plus bytes times ``us_per_byte`` (its busiest link's share).

    ``us_per_byte_alone``: the busiest link's µs per byte with no other send on it.
    """

    alpha_us: float
    us_per_byte: float
    us_per_byte_alone: float = 0.0

    def time_us(self, size_bytes: float) -> float:
        """Return α + size · µs per byte (µs)."""
        return self.alpha_us + size_bytes * self.us_per_byte


def _machine(topology: Topology, node: int) -> Topology:
    """Return machine ``node`` of a composed topology as the one-machine topology it was composed from."""
    names = {v.name for v in topology.vertices if v.node == node and v.name != NETWORK_SWITCH}
    base = node * topology.gpus_per_node
    vertices = []
    for v in topology.vertices:
        if v.name in names:
            rank = None if v.rank is None else v.rank - base
            vertices.append(
                type(v)(**{**v.__dict__, "name": local_name(topology, v.name, node), "node": 0, "rank": rank})
            )
    links = [
        type(link)(
            **{
                **link.__dict__,
                "src": local_name(topology, link.src, node),
                "dst": local_name(topology, link.dst, node),
            }
        )
        for link in topology.links
        if link.src in names and link.dst in names
    ]
    return make_topology(topology.name, vertices, links, nodes=1)


@functools.lru_cache(maxsize=8)
def representative(topology: Topology, machines: int) -> Topology | None:
    """Return ``machines`` copies of ``topology``'s machine joined as ``compose_nodes`` joins them; None if they differ.

    ``topology`` itself when it has no more machines than asked; None when its machines are not
    identical (a NIC down on one), where no closed form stands for it.
    """
    if topology.nodes <= machines:
        return topology
    if len(set(node_signatures(topology))) > 1:
        return None
    first = _machine(topology, 0)
    return compose_machines([first] * machines, f"{first.name}x{machines}", topology.description)


def _hop_costs(
    topology: Topology, edges: Sequence[tuple[int, int]], *, alone: bool = False
) -> dict[tuple[int, int], HopCost]:
    """Return each edge's cost when all of ``edges`` move at once, sharing their links (Simple); ``alone``: unshared."""
    load: dict[tuple[str, str], int] = {}
    for src, dst in edges:
        for link in route(topology, src, dst).links:
            load[link.key] = 1 if alone else load.get(link.key, 0) + 1
    costs = {}
    for src, dst in set(edges):
        path = route(topology, src, dst)
        share = max(load[link.key] / (link.bandwidth_GBps * BYTES_PER_US_PER_GBPS) for link in path.links)
        alone_share = max(1 / (link.bandwidth_GBps * BYTES_PER_US_PER_GBPS) for link in path.links)
        costs[(src, dst)] = HopCost(path.alpha_us, share, alone_share)
    return costs


def _slowest(costs: Sequence[HopCost], size_bytes: float) -> float:
    """Return the slowest of ``costs`` at ``size_bytes`` (µs; 0 with none: one GPU per machine has no GPU hop)."""
    return max((cost.time_us(size_bytes) for cost in costs), default=0.0)


def ring_closed_form(
    topology: Topology, collective: Collective, sizes: Sequence[int], model: ExecutionModel, channels: int | None = None
) -> tuple[str, tuple[float, ...]] | None:
    """Return the ring's name (as ``ring_algorithm`` names it) and its time (µs) per size, in closed form.

    None when ``topology``'s machines are not identical.
    """
    small = representative(topology, 2)
    if small is None:
        return None
    rings = ring_orders(small, channels)
    edges = [(ring[i], ring[(i + 1) % len(ring)]) for ring in rings for i in range(len(ring))]
    hop_costs = _hop_costs(small, edges)
    n = topology.num_ranks
    steps = (2 if collective is Collective.ALLREDUCE else 1) * (n - 1)
    name = f"ring-{len(rings)}ch-1p"
    if model.pipelines(topology.nodes > 1):  # some hop pipelines: out of lockstep
        hops = {_ring_hops(small, ring, hop_costs, topology.nodes) for ring in rings}
        times = []
        for size in sizes:
            pieces = slice_sizes(size / (n * len(rings)), model, SIMPLE)
            times.append(max(_pipelined_ring_time(ring_hops, steps, pieces, model) for ring_hops in hops))
        return name, tuple(times)
    costs = tuple(hop_costs.values())
    times = []
    for size in sizes:
        pieces = slice_sizes(size / (n * len(rings)), model, SIMPLE)
        times.append(sum(steps * _slowest(costs, piece) for piece in pieces))
    return name, tuple(times)


def _ring_hops(
    small: Topology, ring: Sequence[int], costs: dict[tuple[int, int], HopCost], machines: int
) -> tuple[tuple[HopCost, bool], ...]:
    """Return the (cost, between machines) of every hop of ``ring`` stretched to ``machines`` machines.

    The representative's two machines' stretches of the ring (each ending with its hop out) alternate;
    a ring inside one machine (a GB200 NVL72 rack) is its own hops.
    """
    size = len(ring)
    out = [i for i in range(size) if small.node_of(ring[i]) != small.node_of(ring[(i + 1) % size])]
    start = (out[0] + 1) % size if out else 0  # the first rank after a hop between machines
    order = [ring[(start + i) % size] for i in range(size)]
    hops = [(costs[(a, b)], small.node_of(a) != small.node_of(b)) for a, b in zip(order, order[1:] + order[:1])]
    if not out:
        return tuple(hops)
    half = size // 2
    stretches = (hops[:half], hops[half:])
    return tuple(hop for m in range(machines) for hop in stretches[m % 2])


def _pipelined_ring_time(
    hops: Sequence[tuple[HopCost, bool]], steps: int, pieces: Sequence[float], model: ExecutionModel
) -> float:
    """Return the ring's time (µs) when some hops pipeline their sends: the longest path of its steps.

    Position i's step k starts when its own step k-1 has left it (a pipelined send's bytes, a
    serialized send's whole cost), when step k-1's data from position i-1 has arrived (α + bytes),
    and when position i+1 has taken step k-``send_slots``'s data (its step k+1-``send_slots``
    began). Passes follow each other on every position; step 0 of a pass waits for no data.
    """
    slots = model.send_slots or 1
    pipelined = np.array([model.pipelines(between) for _, between in hops])
    alpha = np.array([cost.alpha_us for cost, _ in hops])
    per_byte = np.array([cost.us_per_byte for cost, _ in hops])
    alone = np.array([cost.us_per_byte_alone for cost, _ in hops])
    free = np.zeros(len(hops))  # when each position's previous send has left it
    for piece in pieces:
        # out of lockstep one channel's α overlaps another's bytes: a piece lands α plus its own
        # bytes after it leaves, and a serialized hop's channels together still fill the links
        arrive = np.where(pipelined, alpha + piece * alone, np.maximum(alpha + piece * alone, piece * per_byte))
        busy = np.where(pipelined, piece * per_byte, arrive)
        # the starts of the last slots - 1 steps: the oldest is when each position freed a slot
        recent: deque[np.ndarray] = deque(maxlen=slots - 1)
        landed = None
        for k in range(steps):
            start = free if landed is None else np.maximum(free, np.roll(landed, 1))
            if k >= slots:
                start = np.maximum(start, np.roll(recent[0], -1))
            recent.append(start)
            free, landed = start + busy, start + arrive
    return float(landed.max()) if pieces else 0.0


def _machine_depth(machines: int) -> int:
    """Return the deeper of the two machine trees' depths (hops from the deepest machine to the root)."""
    return max(tree_depth(binary_tree_parents(machines)), tree_depth(complement_tree_parents(machines)))


def tree_closed_form(
    topology: Topology, sizes: Sequence[int], model: ExecutionModel
) -> tuple[tuple[str, float], ...] | None:
    """Return, per size, the AllReduce double binary tree's name (``tree_algorithm``'s) and time (µs), closed form.

    The pipeline depth is the one ``tree_algorithm`` picks for the size. None on one machine or
    when the machines are not identical.
    """
    if topology.nodes < 2:
        return None
    small = representative(topology, _TREE_MACHINES)
    if small is None:
        return None
    channels = default_tree_channels(small)
    trees = [tree_parents(small, channel) for channel in range(channels)]
    up = [(child, parent) for parents in trees for child, parent in parents.items() if parent is not None]
    edges = up + [(parent, child) for child, parent in up]
    shared = _hop_costs(small, edges)
    alone = _hop_costs(small, list(set(edges)), alone=True)
    kinds: dict[tuple[bool, bool], list[HopCost]] = {}
    for src, dst in set(edges):
        upward = any(parents.get(src) == dst for parents in trees)
        kinds.setdefault((small.node_of(src) == small.node_of(dst), upward), []).append(alone[(src, dst)])
    gpus, depth = topology.gpus_per_node, _machine_depth(topology.nodes)
    # tree_algorithm tunes the depth to the deepest rank of tree 0, its hops' largest α and least bandwidth
    hops0 = [route(small, child, parent) for child, parent in trees[0].items() if parent is not None]
    alpha_us = max(max(h.alpha_us for h in hops0), 1e-3)
    bandwidth = min(h.bandwidth_GBps for h in hops0) * BYTES_PER_US_PER_GBPS
    depth0 = gpus - 1 + tree_depth(binary_tree_parents(topology.nodes))
    # past the fill, a hop whose sends pipeline paces the tree by its bytes alone: its α overlaps
    links = [
        HopCost(0.0, cost.us_per_byte) if model.pipelines(small.node_of(src) != small.node_of(dst)) else cost
        for (src, dst), cost in shared.items()
    ]
    out = []
    for size in sizes:
        chunks = tree_chunks_for(depth0, alpha_us, bandwidth, size / channels)
        pieces = [piece for piece in slice_sizes(size / (channels * chunks), model, SIMPLE) for _ in range(chunks)]
        first = pieces[0]
        chain = sum(
            hops
            * (
                _slowest(kinds.get((True, upward), ()), first)
                if inside
                else _slowest(kinds.get((False, upward), ()), first)
            )
            for inside, hops in ((True, gpus - 1), (False, depth))
            for upward in (True, False)
        )
        rest = sum(_slowest(links, p) for p in pieces[1:])
        out.append((f"tree-{channels}ch-{chunks}p", chain + rest))
    return tuple(out)


def closed_form_applies(topology: Topology, collective: Collective | str) -> bool:
    """Return True where NCCL's ring and tree are modelled in closed form instead of built (``closed_form_times``)."""
    return (
        topology.num_ranks > CLOSED_FORM_ABOVE_RANKS
        and parse_collective(collective) is not Collective.ALLTOALL
        and representative(topology, 2) is not None
    )


def closed_form_times(
    topology: Topology, collective: Collective, sizes: Iterable[int], model: ExecutionModel = DEFAULT_MODEL
) -> tuple[tuple[int, str, float], ...] | None:
    """Return (size, name, µs) of the faster of NCCL's ring and tree (AllReduce) per size, in closed form.

    Only above ``CLOSED_FORM_ABOVE_RANKS`` GPUs of identical machines (``baselines.closed_form``);
    None elsewhere (build and replay them), and for AlltoAll. Ties go to the ring.
    """
    if not closed_form_applies(topology, collective):
        return None
    sizes = tuple(sizes)
    ring = ring_closed_form(topology, collective, sizes, model)
    if ring is None:
        return None
    found = {size: (f"{NCCL_PREFIX}{ring[0]}", time_us) for size, time_us in zip(sizes, ring[1])}
    trees = tree_closed_form(topology, sizes, model) if collective is Collective.ALLREDUCE else None
    for size, (name, time_us) in zip(sizes, trees or ()):
        if time_us < found[size][1]:
            found[size] = (f"{NCCL_PREFIX}{name}", time_us)
    return tuple((size, *found[size]) for size in sizes)
