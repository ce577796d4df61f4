"""AlltoAll baselines: direct (every pair at once) and two-level hierarchical through the NICs.

Rank r's input holds one block per peer; block j goes to block r of rank j's output
(``taccl_py.ir.collectives.expected_output``). Both baselines move whole blocks, so a block is
one chunk and ``chunks_per_loop`` is the rank count.

* ``direct_alltoall_algorithm``: every rank sends each peer its block at once, one threadblock
  per peer, as NCCL does with grouped send/recv. Across machines each GPU pair crosses the
  network on its own, so a node pair exchanges G² messages, each paying the NIC's α.
* ``hierarchical_alltoall_algorithm``: across machines the G blocks that machine n's GPUs send
  to GPU (m, j) are first gathered on a GPU of machine n next to a NIC (the *sender relay*),
  crossed in one message (or ``pieces`` of them) to a GPU of machine m next to the same rail
  (the *receiver relay*)
  and, where that is not (m, j) itself, handed on inside machine m. Destination j rides the
  rail whose NIC is nearest GPU j, so on DGX A100/H100 (one NIC per GPU) both relays are
  the GPUs of rail j and nothing is scattered; on NDv2 (one NIC near GPUs 0-3) the four
  GPUs next to the NIC share the relaying. Blocks between GPUs of one machine go directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from taccl_py.baselines._orders import node_ranks, rail_nics
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import LocalCopy, ScratchAllocator, Transfer, lower_plan
from taccl_py.simulate import prepare_simulation, simulate_plan
from taccl_py.topology.builtins import nic_affinity
from taccl_py.topology.model import Topology
from taccl_py.verify import check_algorithm

__all__ = [
    "direct_alltoall_algorithm",
    "hierarchical_alltoall_algorithm",
    "hierarchical_alltoall_pieces_by_size",
    "alltoall_relays",
]

I, O, S = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH

Item = Transfer | LocalCopy


def _check_ranks(topology: Topology) -> None:
    if topology.num_ranks < 2:
        raise ArgumentError(topology.name, "num_ranks", f"{topology.num_ranks} GPU", "at least 2 GPUs")


def direct_alltoall_algorithm(topology: Topology, *, verify: bool = True) -> Algorithm:
    """Return the verified direct AlltoAll: rank r sends block j straight to rank j, all at once.

    Sends go out by rank offset (r+1, r+2, ...), so at each moment every rank sends to a
    different peer; each (rank, peer) pair has its own threadblock, so they all run together.

    >>> from taccl_py.topology import load_topology
    >>> direct_alltoall_algorithm(load_topology("dgx2")).name
    'direct-1p'
    """
    _check_ranks(topology)
    ranks = topology.num_ranks
    items: list[Item] = [LocalCopy(r, (I, r), (O, r)) for r in range(ranks)]
    for offset in range(1, ranks):
        items += [Transfer(r, (r + offset) % ranks, (I, (r + offset) % ranks), (O, r)) for r in range(ranks)]
    algorithm = lower_plan("direct-1p", Collective.ALLTOALL, ranks, ranks, items)
    metadata = (("baseline", "direct"), ("topology", topology.name))
    algorithm = replace(algorithm, metadata=metadata)
    return check_algorithm(algorithm) if verify else algorithm


def alltoall_relays(topology: Topology) -> dict[tuple[int, int], tuple[int, int]]:
    """Return, for each (source machine, destination rank) across machines, the (sender, receiver) relay ranks.

    Destination rank (m, j) rides rail i: the rail whose NIC on machine m is nearest GPU j
    (``nic_affinity``), or rail j mod rails when none is. Each relay is the GPU of its machine
    with the same local index as j when that GPU is next to rail i's NIC there, otherwise one
    of the NIC's nearest GPUs, taken in turn by j.
    """
    rails = rail_nics(topology)
    affinity = nic_affinity(topology)
    local = {rank: index for node in range(topology.nodes) for index, rank in enumerate(node_ranks(topology, node))}
    relays = {}
    for target in range(topology.nodes):
        for destination in node_ranks(topology, target):
            j = local[destination]
            rail = _rail_of(rails[target], affinity, destination, j)
            receiver = _relay(node_ranks(topology, target), affinity[rails[target][rail]], j)
            for source in range(topology.nodes):
                if source != target:
                    sender = _relay(node_ranks(topology, source), affinity[rails[source][rail]], j)
                    relays[source, destination] = (sender, receiver)
    return relays


def _rail_of(rails: tuple[str, ...], affinity: dict[str, tuple[int, ...]], rank: int, local_index: int) -> int:
    """Return the index of the rail whose NIC is nearest ``rank``, or ``local_index`` mod rails."""
    for index, nic in enumerate(rails):
        if rank in affinity[nic]:
            return index
    return local_index % len(rails)


def _relay(ranks: tuple[int, ...], near_nic: tuple[int, ...], local_index: int) -> int:
    """Return the rank with ``local_index`` if it is next to the NIC, else a NIC neighbour by turn."""
    if ranks[local_index] in near_nic:
        return ranks[local_index]
    if not near_nic:  # a NIC no GPU is close to: its GPUs all reach it over the host
        return ranks[local_index]
    return near_nic[local_index % len(near_nic)]


def _parcel_items(
    topology: Topology,
    source_node: int,
    destination: int,
    relays: tuple[int, int],
    pieces: int,
    scratch: ScratchAllocator,
) -> list[Item]:
    """Return the items that carry machine ``source_node``'s G blocks for ``destination`` across.

    The blocks are gathered on the sender relay, its own first, and cross in ``pieces`` runs, each
    sent as the contiguous parts of ``destination``'s output that hold those ranks' blocks, so a
    run crosses the network while the next one is still gathered.
    """
    sender, receiver = relays
    sources = node_ranks(topology, source_node)
    gathered = scratch.take(sender, len(sources))
    # the sender's own block first: the network starts before anything is gathered
    first = sources.index(sender)
    order = [(first + k) % len(sources) for k in range(len(sources))]
    items: list[Item] = []
    for start, stop in _runs(len(sources), pieces):
        for position in order[start:stop]:
            slot = (I, destination)
            if sources[position] == sender:
                items.append(LocalCopy(sender, slot, (S, gathered + position)))
            else:
                items.append(Transfer(sources[position], sender, slot, (S, gathered + position)))
        for low, high in _contiguous(sorted(order[start:stop])):
            count, output = high - low, (O, sources[low])
            if receiver == destination:
                items.append(Transfer(sender, receiver, (S, gathered + low), output, count=count))
                continue
            landed = scratch.take(receiver, count)
            items.append(Transfer(sender, receiver, (S, gathered + low), (S, landed), count=count))
            items.append(Transfer(receiver, destination, (S, landed), output, count=count))
    return items


def _contiguous(positions: list[int]) -> list[tuple[int, int]]:
    """Return the (start, stop) runs of consecutive values in sorted ``positions``."""
    runs: list[tuple[int, int]] = []
    for position in positions:
        if runs and runs[-1][1] == position:
            runs[-1] = (runs[-1][0], position + 1)
        else:
            runs.append((position, position + 1))
    return runs


def _runs(length: int, pieces: int) -> list[tuple[int, int]]:
    """Return ``pieces`` consecutive (start, stop) runs covering 0..length, sizes differing by at most one."""
    bounds = [length * k // pieces for k in range(pieces + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def hierarchical_alltoall_algorithm(topology: Topology, pieces: int = 1, *, verify: bool = True) -> Algorithm:
    """Return the verified two-level AlltoAll: gather at a NIC's GPU, cross once per rail, hand on.

    Parameters
    ----------
    topology : Topology
        Two or more machines (composed topologies, clusters); relays come from
        ``alltoall_relays``.
    pieces : int
        Network messages per parcel of G blocks (1..G): more let gathering, crossing and handing
        on overlap, each paying the network's α.

    Raises
    ------
    ArgumentError
        On one machine (the direct baseline is the hierarchical one there), or for ``pieces``
        outside 1..G.

    Notes
    -----
    Machine pairs are served by offset (machine n sends to n+1 first, then n+2, ...), so every
    NIC sends and receives from the start. Each sender relay's parcels for one destination
    machine go in one threadblock, each message paying the network α once (G blocks in one
    message with one piece).
    """
    _check_ranks(topology)
    if topology.nodes < 2:
        raise ArgumentError(
            topology.name, "nodes", "1 machine", "2 or more machines (on one machine use the direct baseline)"
        )
    if not 1 <= pieces <= topology.gpus_per_node:
        raise ArgumentError(
            topology.name, "chunks", f"{pieces} pieces", f"1..{topology.gpus_per_node} messages per parcel of blocks"
        )
    ranks = topology.num_ranks
    relays = alltoall_relays(topology)
    scratch = ScratchAllocator()
    items: list[Item] = [LocalCopy(r, (I, r), (O, r)) for r in range(ranks)]
    for offset in range(1, topology.nodes):
        for source_node in range(topology.nodes):
            target = (source_node + offset) % topology.nodes
            for destination in node_ranks(topology, target):
                relay = relays[source_node, destination]
                items += _parcel_items(topology, source_node, destination, relay, pieces, scratch)
    for node in range(topology.nodes):
        members = node_ranks(topology, node)
        for offset in range(1, len(members)):
            items += [
                Transfer(r, members[(k + offset) % len(members)], (I, members[(k + offset) % len(members)]), (O, r))
                for k, r in enumerate(members)
            ]
    algorithm = lower_plan("hierarchical-a2a", Collective.ALLTOALL, ranks, ranks, items)
    rails = len(rail_nics(topology)[0])
    metadata = (
        ("baseline", "hierarchical"),
        ("topology", topology.name),
        ("rails", str(rails)),
        ("chunks", str(pieces)),
    )
    algorithm = replace(algorithm, name=f"hierarchical-{rails}rail-{pieces}p", metadata=metadata)
    return check_algorithm(algorithm) if verify else algorithm


def hierarchical_alltoall_pieces_by_size(topology: Topology, sizes: Sequence[int]) -> dict[int, list[int]]:
    """Return the sizes grouped by the pieces per parcel (1, 2, 4, ... G) that simulate fastest there.

    Few pieces pay the network's α least; G pieces let gathering overlap the crossing. Ties go
    to fewer pieces.
    """
    counts = sorted({min(2**k, topology.gpus_per_node) for k in range(topology.gpus_per_node.bit_length() + 1)})
    times = {}
    for pieces in counts:
        plan = prepare_simulation(hierarchical_alltoall_algorithm(topology, pieces), topology)
        times[pieces] = [simulate_plan(plan, size, bound_time_us=0.0).time_us for size in sizes]
    groups: dict[int, list[int]] = {}
    for index, size in enumerate(sizes):
        best = min(counts, key=lambda pieces: (times[pieces][index], pieces))
        groups.setdefault(best, []).append(size)
    return groups
