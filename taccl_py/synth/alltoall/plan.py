"""Lower an AlltoAll routing to ordered ``Transfer``/``LocalCopy`` items and a verified Algorithm.

Each block is cut into ``pieces`` chunks; a class's rounded counts (``round_routing``) give each
path kind a run of consecutive pieces, so a block travels as at most one *segment* per path.
Segments are aggregated where TACCL's and NCCL's hierarchical AlltoAlls aggregate them: at the
first relay of a path, all segments of one source machine that continue along the same ranks are
gathered into consecutive scratch chunks (in source order, so they land as runs of the
destination's output) and cross as one message, paying the NIC's α once; later hops forward that
message whole, and the last hop writes it into the output in as few runs as it allows.

The item order keeps every NIC busy from the start: machine pairs are served by offset (machine n
sends to n+1 first, then n+2, ...), each pair's first hops (gathers and direct sends) before its
relays' forwards, and the blocks between GPUs of one machine last, since they share no NIC. With
``split_own`` a relay's own segments go out on their own ahead of the gathered parcel, so the NIC
works while the gather runs; without it they are copied into the parcel (one α fewer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from taccl_py.baselines._orders import node_ranks
from taccl_py.ir.algorithm import Algorithm, Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import LocalCopy, ScratchAllocator, Transfer, lower_plan
from taccl_py.synth.alltoall.routing import AlltoallRouting, PathClass, round_routing
from taccl_py.topology.model import Topology
from taccl_py.verify import check_algorithm

__all__ = ["alltoall_items", "alltoall_algorithm"]

I, O, S = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH

Item = Transfer | LocalCopy


@dataclass(frozen=True)
class _Segment:
    """Pieces ``first .. first + count - 1`` of the block from ``source`` to ``path[-1]``, along ``path``."""

    source: int
    first: int
    count: int
    path: tuple[int, ...]


def _segments_by_pair(
    classes: Sequence[PathClass], counts: Sequence[tuple[int, ...]]
) -> dict[tuple[int, int], list[_Segment]]:
    """Return, per (source, destination) pair of different GPUs, its segments in piece order."""
    out: dict[tuple[int, int], list[_Segment]] = {}
    for path_class, kind_counts in zip(classes, counts):
        for index, (source, destination) in enumerate(path_class.instances):
            first = 0
            segments = []
            for (_, paths), count in zip(path_class.paths, kind_counts):
                if count:
                    segments.append(_Segment(source, first, count, paths[index]))
                    first += count
            out[source, destination] = segments
    return out


def _output_runs(entries: Sequence[tuple[int, int, int]], pieces: int) -> list[tuple[int, int, int]]:
    """Return (scratch offset, first output chunk, count) runs for parcel ``entries`` of (source, first, count)."""
    runs: list[list[int]] = []
    offset = 0
    for source, first, count in entries:
        out = source * pieces + first
        if runs and runs[-1][1] + runs[-1][2] == out:
            runs[-1][2] += count
        else:
            runs.append([offset, out, count])
        offset += count
    return [tuple(run) for run in runs]


def _deliver(
    path: tuple[int, ...],
    at: int,
    slot: int,
    entries: list[tuple[int, int, int]],
    pieces: int,
    scratch: ScratchAllocator,
) -> list[Item]:
    """Return the items that carry a parcel held in scratch chunk ``slot`` of ``path[at]`` to its destination."""
    items: list[Item] = []
    total = sum(count for _, _, count in entries)
    for hop in range(at, len(path) - 2):
        landed = scratch.take(path[hop + 1], total)
        items.append(Transfer(path[hop], path[hop + 1], (S, slot), (S, landed), count=total))
        slot = landed
    for offset, out, count in _output_runs(entries, pieces):
        items.append(Transfer(path[-2], path[-1], (S, slot + offset), (O, out), count=count))
    return items


def _send_own(segment: _Segment, destination: int, pieces: int, scratch: ScratchAllocator) -> list[Item]:
    """Return the items that carry a segment straight from its source's input along its path."""
    source_slot = (I, destination * pieces + segment.first)
    if len(segment.path) == 2:
        return [
            Transfer(
                segment.source,
                destination,
                source_slot,
                (O, segment.source * pieces + segment.first),
                count=segment.count,
            )
        ]
    landed = scratch.take(segment.path[1], segment.count)
    first = Transfer(segment.source, segment.path[1], source_slot, (S, landed), count=segment.count)
    entries = [(segment.source, segment.first, segment.count)]
    return [first] + _deliver(segment.path, 1, landed, entries, pieces, scratch)


def _parcels(
    pair_segments: Sequence[_Segment], split_own: bool
) -> tuple[list[_Segment], dict[tuple[int, ...], list[_Segment]]]:
    """Return the segments sent on their own and the parcels (keyed by the path from their relay) of the rest.

    A segment of three or more ranks is gathered at its first relay; without ``split_own`` a
    segment whose source is itself such a relay joins that parcel.
    """
    relayed = {segment.path[1:] for segment in pair_segments if len(segment.path) > 2}
    alone: list[_Segment] = []
    parcels: dict[tuple[int, ...], list[_Segment]] = {}
    for segment in pair_segments:
        if not split_own and segment.path in relayed:
            parcels.setdefault(segment.path, []).append(segment)
        elif len(segment.path) > 2:
            parcels.setdefault(segment.path[1:], []).append(segment)
        else:
            alone.append(segment)
    for path in list(parcels):
        if all(segment.source == path[0] for segment in parcels[path]):
            alone += parcels.pop(path)  # nothing to gather: the relay's own pieces go as they are
    return alone, parcels


def _gather_items(
    path: tuple[int, ...], members: Sequence[_Segment], destination: int, pieces: int, scratch: ScratchAllocator
) -> tuple[list[Item], list[Item]]:
    """Return the items that gather a parcel at ``path[0]`` and those that carry it on to ``destination``."""
    members = sorted(members, key=lambda segment: (segment.source, segment.first))
    gathered = scratch.take(path[0], sum(segment.count for segment in members))
    gathers: list[Item] = []
    offset = 0
    for segment in members:
        slot = (I, destination * pieces + segment.first)
        if segment.source == path[0]:
            gathers.append(LocalCopy(path[0], slot, (S, gathered + offset), count=segment.count))
        else:
            gathers.append(Transfer(segment.source, path[0], slot, (S, gathered + offset), count=segment.count))
        offset += segment.count
    entries = [(segment.source, segment.first, segment.count) for segment in members]
    return gathers, _deliver(path, 0, gathered, entries, pieces, scratch)


def _local_items(
    members: Sequence[int], segments: dict[tuple[int, int], list[_Segment]], pieces: int, scratch: ScratchAllocator
) -> list[Item]:
    """Return the items of the blocks between the GPUs of one machine.

    Relayed pieces go one by one so the two hops pipeline. The relays' first hops come first
    (piece by piece), then the direct blocks, then the forwards: a forwarding threadblock sends
    its own block while the pieces it forwards arrive, instead of waiting for them at its head.
    """
    first_hops: list[Item] = []
    direct: list[Item] = []
    forwards: list[Item] = []
    relayed = []
    for offset in range(1, len(members)):
        for k, source in enumerate(members):
            destination = members[(k + offset) % len(members)]
            for segment in segments[source, destination]:
                if len(segment.path) == 2:
                    direct += _send_own(segment, destination, pieces, scratch)
                else:
                    relayed += [
                        (piece, segment, destination) for piece in range(segment.first, segment.first + segment.count)
                    ]
    for piece, segment, destination in sorted(relayed, key=lambda entry: entry[0]):
        first, *rest = _send_own(replace(segment, first=piece, count=1), destination, pieces, scratch)
        first_hops.append(first)
        forwards += rest
    return first_hops + direct + forwards


def _machine_pair_items(
    sources: Sequence[int],
    destinations: Sequence[int],
    segments: dict[tuple[int, int], list[_Segment]],
    pieces: int,
    split_own: bool,
    scratch: ScratchAllocator,
) -> list[Item]:
    """Return the items that carry one source machine's blocks to one destination machine's GPUs."""
    first_hops: list[Item] = []
    forwards: list[Item] = []
    for destination in destinations:
        pair_segments = [segment for source in sources for segment in segments[source, destination]]
        alone, parcels = _parcels(pair_segments, split_own)
        for segment in alone:
            first_hops += _send_own(segment, destination, pieces, scratch)
        for path, members in parcels.items():
            gathers, carried = _gather_items(path, members, destination, pieces, scratch)
            first_hops += gathers
            forwards += carried
    return first_hops + forwards


def alltoall_items(
    topology: Topology, routing: AlltoallRouting, counts: Sequence[tuple[int, ...]], pieces: int, *, split_own: bool
) -> list[Item]:
    """Return the ordered items of the AlltoAll that ``routing`` describes, each block cut into ``pieces``.

    ``counts`` gives per class the pieces per path kind (``round_routing``).
    """
    ranks = topology.num_ranks
    segments = _segments_by_pair(routing.classes, counts)
    scratch = ScratchAllocator()
    members = [node_ranks(topology, node) for node in range(topology.nodes)]
    items: list[Item] = [LocalCopy(r, (I, r * pieces), (O, r * pieces), count=pieces) for r in range(ranks)]
    for offset in range(1, topology.nodes):
        for node in range(topology.nodes):
            target = (node + offset) % topology.nodes
            items += _machine_pair_items(members[node], members[target], segments, pieces, split_own, scratch)
    for node_members in members:
        items += _local_items(node_members, segments, pieces, scratch)
    return items


def alltoall_algorithm(
    topology: Topology,
    routing: AlltoallRouting,
    pieces: int,
    *,
    split_own: bool,
    name: str,
    metadata: Sequence[tuple[str, str]] = (),
) -> Algorithm:
    """Return the verified AlltoAll Algorithm of ``routing`` with ``pieces`` chunks per block.

    Parameters
    ----------
    topology : Topology
        The machines ``routing`` was made for.
    routing : AlltoallRouting
        Shares per path class (``route_alltoall``), rounded here to whole pieces.
    pieces : int
        Chunks per block: ``chunks_per_loop`` is ``pieces`` times the rank count.
    split_own : bool
        Send a relay's own pieces on their own ahead of the parcel it gathers (the NIC starts
        at once) instead of copying them into it (one message, one α fewer).
    name : str
        The algorithm's name.
    metadata : sequence of (str, str)
        Recorded with the algorithm.

    Returns
    -------
    Algorithm

    Raises
    ------
    VerificationError
        If the lowered schedule does not implement AlltoAll (a bug, never an input fault).

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> from taccl_py.synth.alltoall.routing import route_alltoall
    >>> pair = load_topology("dgx-a100", 2)
    >>> relayed = route_alltoall(pair, 16_000_000, direct=False)
    >>> algorithm = alltoall_algorithm(pair, relayed, 1, split_own=True, name="a2a")
    >>> algorithm.collective.value, algorithm.chunks_per_loop
    ('alltoall', 16)
    """
    counts = round_routing(routing, pieces)
    items = alltoall_items(topology, routing, counts, pieces, split_own=split_own)
    algorithm = lower_plan(name, Collective.ALLTOALL, topology.num_ranks, topology.num_ranks * pieces, items)
    return check_algorithm(replace(algorithm, metadata=tuple(sorted(metadata))))
