"""Process groups on a topology: the machine set as one group sees it while every group of its kind runs.

A job of W ranks sits on the topology's GPUs, rank r on GPU ``placement[r]`` (torchrun's node-major
order unless a placement file says otherwise, :mod:`taccl_py.placement.parallel`). A process group
is a list of those ranks in group-rank order (torch sorts them). ``group_topology`` returns the
topology a group's schedule is synthesized, simulated and bounded on: the group's GPUs renumbered
0..k-1, the rest of their machines (switches, NICs, CPUs) kept, the other GPUs left out, and every
link that the groups of the kind running at once share divided between them.

Why the other GPUs are left out and not offered as relays: a group's collective is entered by its
members only, so a schedule that stores and forwards through another GPU has no one to run that
step (NCCL's PXN, too, only relays through a GPU of the same communicator). Hardware paths through
switches, CPUs and other NICs stay, as ``route`` takes them.

Why sharing divides a link: the groups of one kind run the same schedule at the same time
(Megatron's data-parallel all-reduces, FSDP's all-gathers), so a link that n of their routes cross
gives each about 1/n of its rate (max-min fair sharing of n equal flows). A link only one group
crosses keeps its rate: a rail's own NIC on DGX-H100 stays whole, NDv2's one NIC goes to 8 rails.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from taccl_py.errors import ArgumentError
from taccl_py.ir.library import AlgorithmLibrary, GroupRecord
from taccl_py.topology.model import Link, Topology, VertexKind, make_topology, route

__all__ = [
    "link_sharing",
    "group_label",
    "group_topology",
    "group_signature",
    "library_topology",
    "placement_classes",
    "record_topology",
]

LinkKey = tuple[str, str]


def _links_held(topology: Topology, gpus: Sequence[int]) -> set[LinkKey]:
    """Return the keys of every link some route between two of ``gpus`` holds."""
    held: set[LinkKey] = set()
    for src in gpus:
        for dst in gpus:
            if src != dst:
                held.update(route(topology, src, dst).resources)
    return held


def link_sharing(topology: Topology, gpu_groups: Iterable[Sequence[int]]) -> dict[LinkKey, int]:
    """Return, per link, how many of ``gpu_groups`` (topology GPU ranks) route over it; links none use are absent."""
    counts: Counter[LinkKey] = Counter()
    for gpus in gpu_groups:
        counts.update(_links_held(topology, gpus))
    return dict(counts)


def _check_members(topology: Topology, gpus: Sequence[int]) -> None:
    where = f"group {list(gpus)}"
    if len(gpus) < 2:
        raise ArgumentError(where, "ranks", f"{len(gpus)} rank(s)", "at least two ranks in a group")
    if len(set(gpus)) != len(gpus):
        raise ArgumentError(where, "ranks", "a GPU appears twice", "each rank once")
    for gpu in gpus:
        if not 0 <= gpu < topology.num_ranks:
            raise ArgumentError(where, "ranks", f"GPU {gpu} not in {topology.name}", f"0..{topology.num_ranks - 1}")
    nodes = [topology.node_of(gpu) for gpu in gpus]
    if nodes != sorted(nodes):
        raise ArgumentError(
            where, "ranks", f"machines {nodes} in group-rank order", "group ranks ordered machine by machine"
        )
    per_machine = Counter(nodes)
    if len(set(per_machine.values())) != 1:
        raise ArgumentError(
            where,
            "ranks",
            f"GPUs per machine {dict(sorted(per_machine.items()))}",
            "the same number of the group's GPUs in each of its machines",
        )


def group_label(topology: Topology, kind: str, members: Sequence[int]) -> str:
    """Return the name of a group's topology: ``ndv2x4[dp 0,8,16,24]``."""
    return f"{topology.name}[{kind} {','.join(map(str, members))}]"


def group_topology(
    topology: Topology,
    gpus: Sequence[int],
    sharing: Mapping[LinkKey, int] | None = None,
    *,
    name: str | None = None,
) -> Topology:
    """Return the topology of the group on GPUs ``gpus`` (group-rank order), links divided by ``sharing``.

    ``sharing`` maps a link to the number of concurrent groups crossing it (``link_sharing``);
    None: the group runs alone. Raises ``ArgumentError`` for a group of fewer than two GPUs, a GPU
    twice or out of range, ranks not machine by machine, or unequal GPUs per machine.
    """
    gpus = tuple(gpus)
    _check_members(topology, gpus)
    machines = sorted({topology.node_of(gpu) for gpu in gpus})
    new_node = {old: new for new, old in enumerate(machines)}
    per_machine = len(gpus) // len(machines)
    renumbered = {
        topology.gpu(gpu).name: replace(
            topology.gpu(gpu), node=new_node[topology.node_of(gpu)], rank=index, local_index=index % per_machine
        )
        for index, gpu in enumerate(gpus)
    }
    vertices = []
    for vertex in topology.vertices:
        if vertex.kind is VertexKind.GPU:
            if vertex.name in renumbered:
                vertices.append(renumbered[vertex.name])
        elif vertex.kind is VertexKind.NET_SWITCH:
            if len(machines) > 1:
                vertices.append(replace(vertex, node=0))
        elif vertex.node in new_node:
            vertices.append(replace(vertex, node=new_node[vertex.node]))
    kept = {vertex.name for vertex in vertices}
    shares = sharing or {}
    links = [_shared(link, shares.get(link.key, 1)) for link in topology.links if link.src in kept and link.dst in kept]
    label = name or group_label(topology, "ranks", gpus)
    return make_topology(
        label,
        vertices,
        links,
        nodes=len(machines),
        description=f"{len(gpus)} GPUs of {topology.name} as one process group"
        + (f", links shared with {max(shares.values())} groups at most" if shares and max(shares.values()) > 1 else ""),
        sources=topology.sources,
    )


def _shared(link: Link, groups: int) -> Link:
    return link if groups <= 1 else replace(link, bandwidth_GBps=link.bandwidth_GBps / groups)


def group_signature(group: Topology) -> tuple[tuple[float, float], ...]:
    """Return each ordered GPU pair's route (α µs, bandwidth GB/s), rounded, then (machine count, 0).

    Equal for groups that time alike.
    """
    return tuple(
        (round(r.alpha_us, 9), round(r.bandwidth_GBps, 9))
        for r in (
            route(group, src, dst) for src in range(group.num_ranks) for dst in range(group.num_ranks) if src != dst
        )
    ) + ((group.nodes, 0.0),)


def placement_classes(
    topology: Topology, gpu_groups: Sequence[Sequence[int]], sharing: Mapping[LinkKey, int] | None = None
) -> list[list[tuple[int, ...]]]:
    """Return ``gpu_groups`` split into classes whose group topologies have equal signatures, in first-seen order."""
    classes: dict[tuple, list[tuple[int, ...]]] = {}
    for gpus in gpu_groups:
        key = group_signature(group_topology(topology, gpus, sharing))
        classes.setdefault(key, []).append(tuple(gpus))
    return list(classes.values())


def record_topology(topology: Topology, record: GroupRecord) -> Topology:
    """Return the topology a group library's schedules were made on: its members, links shared by ``concurrent``.

    ``topology`` is the whole machine set the library names; job ranks are its GPU ranks (node-major).
    """
    if record.world_size != topology.num_ranks:
        raise ArgumentError(
            topology.name, "group.world_size", f"{record.world_size} ranks", f"the topology's {topology.num_ranks} GPUs"
        )
    sharing = link_sharing(topology, record.concurrent)
    return group_topology(topology, record.members, sharing, name=group_label(topology, record.kind, record.members))


def library_topology(topology: Topology, library: AlgorithmLibrary) -> Topology:
    """Return the part of ``topology`` (the machine set ``library`` names) its schedules run on: its group's, or all."""
    return topology if library.group is None else record_topology(topology, library.group)
