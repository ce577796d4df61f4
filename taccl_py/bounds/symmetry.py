"""GPUs with identical surroundings: each class of them needs one min-cut, not one per GPU.

Two GPUs g and h belong to one class when some permutation of the flow network's vertices maps g to
h, keeps every machine's vertices on that machine and GPUs GPUs, and maps each edge onto an edge
with the same attributes (capacity, and kind where the network has one): an automorphism. Every
min-cut between one GPU and the others, its value and its smallest sink side (and so the kinds of
the links crossing it) is then carried by the permutation from g's problem to h's, so g's answer
stands for h's. Nothing here is assumed from names or fingerprints: each permutation is built
and then checked edge by edge, and a GPU for which none is found is its own class.

How a permutation is found. Colour refinement (the 1-dimensional Weisfeiler-Leman test; see
Grohe, Kersting, Mladenov, Schweitzer, "Color refinement and its applications", 2021) splits
the vertices into classes no automorphism mixes; a vertex alone in its class (a machine's
NVSwitch, the network switch) is fixed by every one. Removing the fixed vertices leaves small
pieces (on GB200 NVL72 a Grace CPU with its two GPUs, PCIe switches and NICs). Mapping g's piece
onto h's by a short backtracking search, and the rest onto itself, gives the permutation; GPUs of
one piece are swapped inside it the same way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping, Sequence

import networkx as nx

from taccl_py.topology.model import Topology

__all__ = ["GpuClass", "gpu_classes", "is_automorphism"]

# Backtracking steps allowed per attempted map: past this the GPU is its own class (always sound).
_MAX_SEARCH_STEPS = 20_000
# Pieces larger than this are not searched (the GPU is its own class).
_MAX_PIECE_VERTICES = 256

#: A GPU's class: its representative (the first GPU of the class in the order given) and a
#: permutation of vertex names (only the moved ones) that maps the representative onto the GPU.
GpuClass = tuple[str, Mapping[str, str]]


def gpu_classes(topology: Topology, graph: nx.DiGraph, gpus: Sequence[str]) -> dict[str, GpuClass]:
    """Return, for each GPU of ``gpus``, its representative and a checked automorphism of ``graph`` onto it.

    ``graph`` is a flow network over ``topology``'s vertex names (edges carry ``capacity`` and
    maybe ``kind``). The representative of a class is its first GPU in ``gpus`` order and maps
    to itself by the empty permutation. Automorphisms of ``graph`` are automorphisms of its
    reverse too, so one call serves both directions.
    """
    colour = _refined_colours(topology, graph)
    counts: dict[int, int] = {}
    for value in colour.values():
        counts[value] = counts.get(value, 0) + 1
    fixed = frozenset(name for name, value in colour.items() if counts[value] == 1)
    piece = _pieces(graph, fixed)
    classes: dict[str, GpuClass] = {}
    representatives: list[str] = []
    for gpu in gpus:
        for first in representatives:
            if colour[first] != colour[gpu]:
                continue
            mapping = _map_piece(graph, colour, piece, first, gpu)
            if mapping is not None and is_automorphism(topology, graph, mapping):
                classes[gpu] = (first, mapping)
                break
        else:
            representatives.append(gpu)
            classes[gpu] = (gpu, {})
    return classes


def is_automorphism(topology: Topology, graph: nx.DiGraph, mapping: Mapping[str, str]) -> bool:
    """Return True when ``mapping`` (moved vertices only) is an automorphism of ``graph`` that keeps kinds and machines.

    Only edges touching moved vertices can change, so only they are compared; a bijection that
    maps each of them onto an edge with equal attributes maps the edge set onto itself.
    """
    if set(mapping) != set(mapping.values()):
        return False
    for name, image in mapping.items():
        if name not in graph or image not in graph:
            return False
        here, there = topology.vertex(name), topology.vertex(image)
        if (here.kind, here.node) != (there.kind, there.node):
            return False
        for w, data in graph.succ[name].items():
            twin = graph.succ[image].get(mapping.get(w, w))
            if twin is None or twin != data:
                return False
        for u, data in graph.pred[name].items():
            twin = graph.pred[image].get(mapping.get(u, u))
            if twin is None or twin != data:
                return False
    return True


def _edge_label(data: Mapping[str, object]) -> Hashable:
    return tuple(sorted(data.items()))


def _refined_colours(topology: Topology, graph: nx.DiGraph) -> dict[str, int]:
    """Return the stable colour refinement of ``graph``, starting from each vertex's kind and machine."""
    start = {name: (topology.vertex(name).kind.value, topology.vertex(name).node) for name in graph}
    colour = _renumber(start)
    classes = len(set(colour.values()))
    while True:
        signature = {
            name: (
                colour[name],
                tuple(sorted((_edge_label(d), colour[w]) for w, d in graph.succ[name].items())),
                tuple(sorted((_edge_label(d), colour[u]) for u, d in graph.pred[name].items())),
            )
            for name in graph
        }
        colour = _renumber(signature)
        now = len(set(colour.values()))
        if now == classes:
            return colour
        classes = now


def _renumber(keys: Mapping[str, Hashable]) -> dict[str, int]:
    """Return each vertex's key replaced by a small integer, equal keys equal integers."""
    numbers: dict[Hashable, int] = {}
    return {name: numbers.setdefault(key, len(numbers)) for name, key in keys.items()}


def _pieces(graph: nx.DiGraph, fixed: frozenset) -> dict[str, int]:
    """Return each vertex's piece: its connected component (either direction) once the fixed vertices are removed."""
    piece: dict[str, int] = {}
    for start in graph:
        if start in fixed or start in piece:
            continue
        piece[start] = len(piece)
        label = piece[start]
        frontier = [start]
        while frontier:
            node = frontier.pop()
            for other in (*graph.succ[node], *graph.pred[node]):
                if other not in fixed and other not in piece:
                    piece[other] = label
                    frontier.append(other)
    return piece


def _members(piece: Mapping[str, int], label: int) -> list[str]:
    return [name for name, value in piece.items() if value == label]


def _map_piece(
    graph: nx.DiGraph, colour: Mapping[str, int], piece: Mapping[str, int], first: str, gpu: str
) -> dict[str, str] | None:
    """Return a permutation mapping ``first`` to ``gpu`` that moves only their pieces, or None if none is found.

    Two pieces are exchanged (one mapped onto the other and back); one piece is mapped onto itself.
    """
    if first not in piece or gpu not in piece:
        return None
    source = _members(piece, piece[first])
    target = source if piece[first] == piece[gpu] else _members(piece, piece[gpu])
    if len(source) != len(target) or len(source) > _MAX_PIECE_VERTICES:
        return None
    found = _search(graph, colour, _bfs_order(graph, first, frozenset(source)), frozenset(target), first, gpu)
    if found is None:
        return None
    if piece[first] != piece[gpu]:
        found.update({image: name for name, image in found.items()})
    return {name: image for name, image in found.items() if name != image}


def _bfs_order(graph: nx.DiGraph, start: str, members: frozenset) -> list[str]:
    """Return ``members`` in breadth-first order from ``start`` over edges of either direction."""
    seen = {start}
    order = [start]
    frontier = deque([start])
    while frontier:
        node = frontier.popleft()
        for other in (*graph.succ[node], *graph.pred[node]):
            if other in members and other not in seen:
                seen.add(other)
                order.append(other)
                frontier.append(other)
    return order


def _search(
    graph: nx.DiGraph, colour: Mapping[str, int], order: list[str], target: frozenset, first: str, gpu: str
) -> dict[str, str] | None:
    """Return a map of ``order`` into ``target`` with ``first`` -> ``gpu`` that keeps colours and edges, or None."""
    domain = frozenset(order)
    mapping: dict[str, str] = {}
    used: set[str] = set()
    options: list[list[str]] = []
    steps = 0
    index = 0
    while 0 <= index < len(order):
        if index == len(options):
            options.append(_options(graph, colour, order[index], target, mapping, first, gpu))
        if index < len(mapping):  # back here after a dead end: undo this vertex's choice
            used.discard(mapping.pop(order[index]))
        choices = options[index]
        while choices and choices[-1] in used:
            choices.pop()
        steps += 1
        if steps > _MAX_SEARCH_STEPS:
            return None
        if not choices:
            options.pop()
            index -= 1
            continue
        image = choices.pop()
        mapping[order[index]] = image
        used.add(image)
        if _consistent(graph, order[index], image, mapping, domain):
            index += 1
        else:
            used.discard(mapping.pop(order[index]))
    return mapping if index == len(order) else None


def _options(
    graph: nx.DiGraph,
    colour: Mapping[str, int],
    name: str,
    target: frozenset,
    mapping: Mapping[str, str],
    first: str,
    gpu: str,
) -> list[str]:
    """Return the vertices of ``target`` with ``name``'s colour beside a mapped neighbour's image, last tried first."""
    if name == first:
        return [gpu]
    near = [other for other in (*graph.succ[name], *graph.pred[name]) if other in mapping]
    if near:
        image = mapping[near[0]]
        pool = [w for w in dict.fromkeys((*graph.succ[image], *graph.pred[image])) if w in target]
    else:
        pool = sorted(target)  # a fixed order whatever the string hashing
    return [w for w in pool if colour[w] == colour[name]][::-1]  # popped from the end: first in pool order first


def _consistent(graph: nx.DiGraph, name: str, image: str, mapping: Mapping[str, str], domain: frozenset) -> bool:
    """Return True when every edge between ``name`` and a mapped or unmoved vertex has its twin at ``image``."""
    for w, data in graph.succ[name].items():
        if w in domain and w not in mapping:
            continue
        if graph.succ[image].get(mapping.get(w, w)) != data:
            return False
    for u, data in graph.pred[name].items():
        if u in domain and u not in mapping:
            continue
        if graph.pred[image].get(mapping.get(u, u)) != data:
            return False
    return True
