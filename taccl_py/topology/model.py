"""The topology model: vertices (GPUs, NICs, switches, CPUs) and directed α-β links.

A ``Topology`` is immutable. ``route(topology, src_rank, dst_rank)`` is the one definition of
which links a GPU-to-GPU transfer holds and what it costs; the simulator, the bounds and the
synthesizer all use it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

import networkx as nx

from taccl_py.errors import ArgumentError, TopologyError
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = [
    "VertexKind",
    "LinkKind",
    "Vertex",
    "Link",
    "Topology",
    "Route",
    "route",
    "routed_links",
    "transfer_time_us",
    "ROUTE_REFERENCE_BYTES",
]

# Routes are chosen as shortest paths under alpha_us + ROUTE_REFERENCE_BYTES / bandwidth: at 1 MB
# both terms matter, so a low-latency PCIe hop does not win over a fast NVLink one.
ROUTE_REFERENCE_BYTES = 1_000_000


class VertexKind(str, Enum):
    """What a vertex is; values are the strings of the topology file."""

    GPU = "gpu"
    NIC = "nic"
    NVSWITCH = "nvswitch"
    PCIE_SWITCH = "pcie_switch"
    NET_SWITCH = "net_switch"
    CPU = "cpu"


class LinkKind(str, Enum):
    """The physical class of a link; values are the strings of the topology file."""

    NVLINK = "nvlink"
    NVSWITCH = "nvswitch"
    PCIE = "pcie"
    HOST = "host"  # CPU-to-CPU interconnect (QPI/UPI/xGMI between sockets)
    IB = "ib"
    ETHERNET = "ethernet"
    XGMI = "xgmi"  # AMD GPU-to-GPU Infinity Fabric


SWITCHING_KINDS = frozenset(
    {VertexKind.NVSWITCH, VertexKind.PCIE_SWITCH, VertexKind.NET_SWITCH, VertexKind.CPU, VertexKind.NIC}
)


@dataclass(frozen=True)
class Vertex:
    """A device of the machine; GPUs carry a node-major global ``rank``.

    NICs carry the rate and latency of their network port (``net_bandwidth_GBps`` per
    direction, ``net_alpha_us``), used when machines are joined through a network switch.
    A switch that reduces in the network (NVLink SHARP on NVSwitch 3) carries the rate of its
    reduction traffic per GPU port (``reduce_bandwidth_GBps``, per direction) and the α of one
    reduction (``reduce_alpha_us``); point-to-point transfers and the cut bounds ignore them.
    """

    name: str
    kind: VertexKind
    node: int = 0
    local_index: int | None = None
    rank: int | None = None
    pci_bus_id: str | None = None
    numa: int | None = None
    net_kind: LinkKind | None = None
    net_bandwidth_GBps: float | None = None
    net_alpha_us: float | None = None
    reduce_bandwidth_GBps: float | None = None
    reduce_alpha_us: float | None = None

    @property
    def reduces_in_network(self) -> bool:
        """Return True for a switch that reduces data passing through it (NVLink SHARP)."""
        return self.reduce_bandwidth_GBps is not None


@dataclass(frozen=True)
class Link:
    """A directed link; sending b bytes over it alone takes ``alpha_us + b / bandwidth``.

    ``count`` is the number of physical lanes folded into ``bandwidth_GBps`` (e.g. NVLinks).
    """

    src: str
    dst: str
    kind: LinkKind
    alpha_us: float
    bandwidth_GBps: float
    count: int = 1

    @property
    def key(self) -> tuple[str, str]:
        """Return the (src, dst) pair that names this link as a resource."""
        return (self.src, self.dst)

    def time_us(self, size_bytes: float) -> float:
        """Return the time (µs) to send ``size_bytes`` over this link alone."""
        return self.alpha_us + size_bytes / (self.bandwidth_GBps * BYTES_PER_US_PER_GBPS)


def transfer_time_us(alpha_us: float, bandwidth_GBps: float, size_bytes: float) -> float:
    """Return α + size / bandwidth in µs for ``size_bytes`` at ``bandwidth_GBps`` (per direction)."""
    return alpha_us + size_bytes / (bandwidth_GBps * BYTES_PER_US_PER_GBPS)


@dataclass(frozen=True)
class Route:
    """The links a transfer from ``src_rank`` to ``dst_rank`` holds, with its α (sum) and bottleneck."""

    src_rank: int
    dst_rank: int
    links: tuple[Link, ...]

    @property
    def alpha_us(self) -> float:
        """Return the route's latency (µs): the sum of its links' α."""
        return sum(link.alpha_us for link in self.links)

    @property
    def bandwidth_GBps(self) -> float:
        """Return the route's bottleneck bandwidth (GB/s per direction)."""
        return min(link.bandwidth_GBps for link in self.links)

    @property
    def resources(self) -> tuple[tuple[str, str], ...]:
        """Return the keys of the links (NIC and switch ports included) this route holds."""
        return tuple(link.key for link in self.links)

    def time_us(self, size_bytes: float) -> float:
        """Return the time (µs) to move ``size_bytes`` along this route with nothing else on it."""
        return transfer_time_us(self.alpha_us, self.bandwidth_GBps, size_bytes)


@dataclass(frozen=True, eq=False)
class Topology:
    """GPUs, NICs and switches of one or more machines joined by directed α-β links.

    ``nodes`` is the number of machines; GPU ranks are node-major
    (rank = node * gpus_per_node + local_index). Build one with ``make_topology`` or the
    loaders in ``taccl_py.topology``; the constructor only stores.
    """

    name: str
    vertices: tuple[Vertex, ...]
    links: tuple[Link, ...]
    nodes: int = 1
    description: str = ""
    sources: tuple[str, ...] = field(default=())

    # -- derived views (computed once; the dataclass is frozen) --------------------------------
    @functools.cached_property
    def _vertex_by_name(self) -> Mapping[str, Vertex]:
        return {v.name: v for v in self.vertices}

    @functools.cached_property
    def gpus(self) -> tuple[Vertex, ...]:
        """Return the GPU vertices ordered by rank."""
        return tuple(sorted((v for v in self.vertices if v.kind is VertexKind.GPU), key=lambda v: v.rank))

    @property
    def num_ranks(self) -> int:
        """Return the number of GPUs (ranks)."""
        return len(self.gpus)

    @property
    def gpus_per_node(self) -> int:
        """Return the number of GPUs in each machine."""
        return self.num_ranks // self.nodes

    @functools.cached_property
    def graph(self) -> nx.DiGraph:
        """Return a networkx view: vertices carry ``vertex``, edges carry ``link``."""
        graph = nx.DiGraph()
        for vertex in self.vertices:
            graph.add_node(vertex.name, vertex=vertex)
        for link in self.links:
            graph.add_edge(link.src, link.dst, link=link)
        return graph

    def vertex(self, name: str) -> Vertex:
        """Return the vertex called ``name``; raise ``ArgumentError`` if there is none."""
        try:
            return self._vertex_by_name[name]
        except KeyError:
            raise ArgumentError(
                self.name, "vertex", f"no vertex {name!r}", "one of the topology's vertex names"
            ) from None

    def gpu(self, rank: int) -> Vertex:
        """Return the GPU vertex of ``rank``."""
        if not 0 <= rank < self.num_ranks:
            raise ArgumentError(self.name, "rank", f"rank {rank} out of range", f"0..{self.num_ranks - 1}")
        return self.gpus[rank]

    def node_of(self, rank: int) -> int:
        """Return the machine index holding ``rank``."""
        return self.gpu(rank).node

    def link(self, src: str, dst: str) -> Link | None:
        """Return the link src -> dst, or None."""
        data = self.graph.get_edge_data(src, dst)
        return data["link"] if data else None

    def nics(self, node: int | None = None) -> tuple[Vertex, ...]:
        """Return the NIC vertices (of machine ``node`` if given), in file order."""
        return tuple(v for v in self.vertices if v.kind is VertexKind.NIC and (node is None or v.node == node))

    @functools.cached_property
    def _routes(self) -> dict[tuple, object]:
        # memo of route() results and per-source shortest paths; filled lazily, never exposed
        return {}

    def __repr__(self) -> str:
        return f"Topology({self.name!r}, nodes={self.nodes}, ranks={self.num_ranks}, links={len(self.links)})"


def make_topology(
    name: str,
    vertices: Iterable[Vertex],
    links: Iterable[Link],
    nodes: int = 1,
    description: str = "",
    sources: Iterable[str] = (),
    source: str | None = None,
) -> Topology:
    """Return a validated ``Topology``; raise ``TopologyError`` naming ``source`` on a fault.

    Checks: unique vertex names, links between known vertices with a known kind, positive
    bandwidth, non-negative α, GPUs numbered 0..N-1 without repeats, equal GPUs per node.
    """
    origin = source or name
    vertices = tuple(vertices)
    links = tuple(links)
    seen: dict[str, Vertex] = {}
    for index, vertex in enumerate(vertices):
        if vertex.name in seen:
            raise TopologyError(
                origin, f"vertices[{index}].name", f"vertex {vertex.name!r} listed twice", "unique names"
            )
        seen[vertex.name] = vertex
    ranks = sorted(v.rank for v in vertices if v.kind is VertexKind.GPU and v.rank is not None)
    gpu_count = sum(1 for v in vertices if v.kind is VertexKind.GPU)
    if ranks != list(range(gpu_count)):
        raise TopologyError(
            origin, "vertices", f"GPU ranks {ranks} are not 0..{gpu_count - 1} each once", "one GPU per rank"
        )
    if gpu_count == 0:
        raise TopologyError(origin, "vertices", "no GPU", "at least one vertex of kind 'gpu'")
    if gpu_count % nodes:
        raise TopologyError(
            origin,
            "nodes",
            f"{gpu_count} GPUs do not split into {nodes} equal nodes",
            "the same GPU count in every node",
        )
    pairs: set[tuple[str, str]] = set()
    for index, link in enumerate(links):
        where = f"links[{index}]"
        for end in (link.src, link.dst):
            if end not in seen:
                raise TopologyError(origin, where, f"unknown vertex {end!r}", "a name listed under vertices")
        if link.src == link.dst:
            raise TopologyError(origin, where, f"link from {link.src!r} to itself", "two different vertices")
        if not isinstance(link.kind, LinkKind):
            raise TopologyError(
                origin,
                f"{where}.kind",
                f"unknown link kind {link.kind!r}",
                "one of " + ", ".join(k.value for k in LinkKind),
            )
        if not link.bandwidth_GBps > 0:
            raise TopologyError(
                origin, f"{where}.bandwidth_GBps", f"bandwidth {link.bandwidth_GBps} is not positive", "GB/s > 0"
            )
        if not link.alpha_us >= 0:
            raise TopologyError(origin, f"{where}.alpha_us", f"alpha {link.alpha_us} is negative", "µs >= 0")
        if link.key in pairs:
            raise TopologyError(
                origin,
                where,
                f"link {link.src}->{link.dst} listed twice",
                "one link per direction (use count for lanes)",
            )
        pairs.add(link.key)
    return Topology(
        name=name, vertices=vertices, links=links, nodes=nodes, description=description, sources=tuple(sources)
    )


def _route_weight(src: str, dst: str, data: Mapping[str, Link]) -> float:
    link = data["link"]
    return link.time_us(ROUTE_REFERENCE_BYTES)


def route(topology: Topology, src_rank: int, dst_rank: int) -> Route:
    """Return the route a transfer from GPU ``src_rank`` to GPU ``dst_rank`` takes.

    The route is the direct link when there is one, else the cheapest path (α plus 1 MB at the
    link's bandwidth, summed) whose inner vertices are switches, CPUs or NICs: GPUs do not
    forward in hardware. Raises ``TopologyError`` when no such path exists.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> r = route(load_topology("ndv2"), 0, 1)
    >>> [link.kind.value for link in r.links], r.alpha_us
    (['nvlink'], 0.3)
    """
    if src_rank == dst_rank:
        raise ArgumentError(topology.name, "route", f"route from rank {src_rank} to itself", "two different ranks")
    cache = topology._routes
    key = (src_rank, dst_rank)
    if key not in cache:
        cache[key] = _find_route(topology, src_rank, dst_rank)
    return cache[key]


def _find_route(topology: Topology, src_rank: int, dst_rank: int) -> Route:
    src, dst = topology.gpu(src_rank).name, topology.gpu(dst_rank).name
    direct = topology.link(src, dst)
    if direct is not None:
        return Route(src_rank, dst_rank, (direct,))
    hop, last = _last_hop(topology, src_rank, dst_rank)
    return Route(src_rank, dst_rank, _path_links(topology, src, hop) + (last,))


def _last_hop(topology: Topology, src_rank: int, dst_rank: int) -> tuple[str, Link]:
    """Return the vertex before ``dst_rank``'s GPU on the cheapest indirect route from ``src_rank``, and its link."""
    src, dst = topology.gpu(src_rank).name, topology.gpu(dst_rank).name
    distances, _ = _paths_from(topology, src)
    best: tuple[float, str, Link] | None = None
    for hop, last in _entries(topology, dst):
        if hop in distances and hop != src:
            cost = distances[hop] + last.time_us(ROUTE_REFERENCE_BYTES)
            if best is None or cost < best[0]:
                best = (cost, hop, last)
    if best is None:
        raise TopologyError(
            topology.name,
            "links",
            f"no path from GPU rank {src_rank} to rank {dst_rank}",
            "every GPU to reach every other",
        )
    return best[1], best[2]


def routed_links(topology: Topology) -> frozenset[tuple[str, str]]:
    """Return the keys of the links some GPU-to-GPU ``route`` holds.

    The same routes as ``route`` over every pair, without building each: per source, the last
    hop into every GPU, then each distinct path to a last hop once (512 GPUs: 261,632 routes).
    """
    used: set[tuple[str, str]] = set()
    for source in topology.gpus:
        hops = set()
        for target in topology.gpus:
            if target is source:
                continue
            direct = topology.link(source.name, target.name)
            if direct is not None:
                used.add(direct.key)
                continue
            hop, last = _last_hop(topology, source.rank, target.rank)
            used.add(last.key)
            hops.add(hop)
        paths = _paths_from(topology, source.name)[1] if hops else {}
        for hop in hops:
            used.update(zip(paths[hop], paths[hop][1:]))
    return frozenset(used)


def _entries(topology: Topology, dst: str) -> tuple[tuple[str, Link], ...]:
    """Return the (previous vertex, link) of every link into ``dst``, in graph order, memoised."""
    memo = topology._routes
    key = ("entries", dst)
    if key not in memo:
        memo[key] = tuple((hop, data["link"]) for hop, _, data in topology.graph.in_edges(dst, data=True))
    return memo[key]


def _path_links(topology: Topology, src: str, hop: str) -> tuple[Link, ...]:
    """Return the links of the shortest path from GPU ``src`` to switching vertex ``hop``, memoised."""
    memo = topology._routes
    key = ("path", src, hop)
    if key not in memo:
        path = _paths_from(topology, src)[1][hop]
        memo[key] = tuple(topology.link(a, b) for a, b in zip(path, path[1:]))
    return memo[key]


def _paths_from(topology: Topology, src: str) -> tuple[dict[str, float], dict[str, list[str]]]:
    """Return shortest distances and paths from GPU ``src`` to every switching vertex, memoised."""
    memo = topology._routes
    key = ("paths", src)
    if key not in memo:
        memo[key] = nx.single_source_dijkstra(_forwarding_graph(topology), src, weight=_route_weight)
    return memo[key]


def _forwarding_graph(topology: Topology) -> nx.DiGraph:
    """Return the topology's links that end at a switch, CPU or NIC, built once per topology.

    GPUs do not forward in hardware, so a route's inner vertices are switching ones: with no link
    into a GPU, a search from one GPU never passes through another. The links keep the topology's
    order, so searches break ties as over the whole graph (a filtered view of it per source took
    most of ``auto_sketch`` at 512 GPUs).
    """
    memo = topology._routes
    if "forwarding" not in memo:
        switching = {v.name for v in topology.vertices if v.kind in SWITCHING_KINDS}
        graph = nx.DiGraph()
        graph.add_nodes_from(topology.graph.nodes)
        graph.add_edges_from((u, v, data) for u, v, data in topology.graph.edges(data=True) if v in switching)
        memo["forwarding"] = graph
    return memo["forwarding"]
