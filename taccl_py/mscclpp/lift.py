"""Lift an MSCCL++ execution plan into our IR: the plan's data movement as an Algorithm.

``lift_mscclpp_plan`` is the inverse of ``taccl_py.mscclpp.export`` up to normalisation. Data that
crosses GPUs by a ``put`` (``pws``, ``pwsf``; memory or port channel) from GPU a's chunks into GPU b
becomes a send on a, at the put, and a receive on b, at the first ``wait`` of b that makes the put
visible (``lift_items``); local ``copy`` and ``re`` become ``cpy`` and ``re``. A receive followed in
its threadblock by the copy, reduction or forwarding send that uses the landing chunks, when
nothing else touches them, is fused into ``r``/``rcs``/``rrc``/``rrs``/``rrcs`` (``lift_fusion``).

Packet (LL) plans lift the same way: packets written into a peer (``ppkt``, ``rppkt``, ``respkt``
and ``recspkt`` to peers; a port ``rppkt`` through the proxy) are a send at the write and a
receive at the peer's first packet read of them (it polls their flags); ``cpkt``, ``upkt``,
``repkt``, ``recpkt`` and the local parts of the reduce-and-send ops are copies and reductions.
A GPU's packet slots become scratch chunks after its plain ones, so the two never alias, and the
staging copy a port send makes before ``rppkt`` folds into the send. The algorithm's protocol is
the plan's.

Each plan threadblock becomes one IR threadblock when it sends to at most one peer and receives
from at most one; otherwise one per (send peer, receive peer) its steps use, and another for its
local steps (those of an op that receives go with that receive). Where a threadblock talks to
several threadblocks of one peer (MSCCL++'s own LL plans), ends are told apart by the plan
threadblock at the far end too. Threadblocks joined by transfers share a channel. Order inside a
GPU (program order, semaphores, barriers, packet flags, and order that passes through other GPUs)
becomes ``depends``: each step waits for the latest step of every other threadblock of its rank
that the plan orders before it, less those already implied. Signals and waits that carry no data
order nothing across GPUs in our IR, whose sends are buffered; every edge of the lifted program
runs along the plan's order, so a plan that verifies lifts to an algorithm without deadlock and
nothing runs earlier on a GPU than the plan lets it.

Refused, with one ``FormatError`` line naming GPU, threadblock and op: switch (NVLS) ops
(``gstorepkt`` included), ``get`` and the reductions that read a peer's memory (``rre``, ``rres``,
``res`` to peers), packet reduce-and-send over a port channel (the executor has no such path),
packets outside scratch, pipelines and thread-block groups (they cut chunks in parts our IR
cannot name).
"""

from __future__ import annotations

import logging
from collections import defaultdict

from taccl_py.errors import FormatError
from taccl_py.ir.algorithm import Algorithm, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective, chunk_layout
from taccl_py.mscclpp.lift_fusion import fuse_receives
from taccl_py.mscclpp.lift_items import Item, LiftedEvents, TbKey, key_of_threadblock, lift_items, threadblock_keys
from taccl_py.mscclpp.plan import MAX_MESSAGE_SIZE, BufferKind, ChannelKind, ExecutionPlan, OpName
from taccl_py.mscclpp.replay_graph import ReplayBuilder

__all__ = ["lift_mscclpp_plan", "LIFTED_OPS"]

logger = logging.getLogger(__name__)

# The ops a plan may hold to be lifted; the rest have no two-sided form here (module docstring).
LIFTED_OPS = frozenset(
    {
        OpName.NOP,
        OpName.BARRIER,
        OpName.PUT,
        OpName.PUT_WITH_SIGNAL,
        OpName.PUT_WITH_SIGNAL_AND_FLUSH,
        OpName.COPY,
        OpName.REDUCE,
        OpName.SIGNAL,
        OpName.WAIT,
        OpName.RELAXED_SIGNAL,
        OpName.RELAXED_WAIT,
        OpName.FLUSH,
        OpName.SEM_ACQUIRE,
        OpName.SEM_RELEASE,
        OpName.PUT_PACKETS,
        OpName.READ_PUT_PACKETS,
        OpName.COPY_PACKETS,
        OpName.UNPACK_PACKETS,
        OpName.REDUCE_PACKETS,
        OpName.REDUCE_COPY_PACKETS,
        OpName.REDUCE_SEND_PACKETS,
        OpName.REDUCE_COPY_SEND_PACKETS,
    }
)
_WHY_NOT = {
    OpName.GET: "reads a peer's memory (a get has no sender step to pair with)",
    OpName.READ_REDUCE: "reduces a peer's memory read directly",
    OpName.READ_REDUCE_SEND: "reduces a peer's memory read directly",
    OpName.REDUCE_SEND: "reduces and stores into peers in one op",
    OpName.PIPELINE: "a pipeline cuts chunks into parts our IR cannot name",
    OpName.MULTI_LOAD_REDUCE_STORE: "a switch (NVLS) reduction has no send/receive form",
    OpName.MULTI_STORE: "a switch (NVLS) multicast has no send/receive form",
    OpName.MULTI_STORE_PACKETS: "a switch (NVLS) multicast has no send/receive form",
}
_LIFTED_NAMES = "put/pws/pwsf, copy, re, packet ops but gstorepkt, signal/wait, flush, semaphores, barriers and nops"
# Packet reductions that store into peers: the executor's handlers have no port-channel branch.
_MEMORY_ONLY = frozenset({OpName.REDUCE_SEND_PACKETS, OpName.REDUCE_COPY_SEND_PACKETS})


def _refuse_unliftable(plan: ExecutionPlan) -> None:
    """Raise ``FormatError`` at the first op with no two-sided form in our IR."""
    try:
        Collective(plan.collective)
    except ValueError:
        raise FormatError(plan.name, "collective", f"{plan.collective!r}", "a collective our IR knows") from None
    for gpu in plan.gpus:
        for tb in gpu.threadblocks:
            for index, op in enumerate(tb.ops):
                where = f"GPU {gpu.id} tb {tb.id} op {index} ({op.name.value})"
                why = None
                if op.name not in LIFTED_OPS:
                    why = _WHY_NOT[op.name]
                elif op.tbg is not None and op.tbg.tbg_size > 1:
                    why = "a thread-block group cuts chunks into parts our IR cannot name"
                elif op.channel_type is ChannelKind.SWITCH:
                    why = "a switch (NVLS) channel has no send/receive form"
                elif op.name in _MEMORY_ONLY and op.channel_type is ChannelKind.PORT:
                    why = "a packet reduce-and-send over a port channel, which the executor does not run"
                elif op.name in (OpName.COPY, OpName.REDUCE) and any(
                    ref.buffer is None for ref in (op.src or ()) + (op.dst or ())
                ):
                    why = "reads or writes a peer's memory directly"
                if why is not None:
                    raise FormatError(plan.name, where, why, f"only {_LIFTED_NAMES}")


def _find(parent: dict, node):
    while parent[node] != node:
        parent[node] = parent[parent[node]]
        node = parent[node]
    return node


def _components(items: tuple[Item, ...], keys: dict[int, TbKey]) -> list[list[TbKey]]:
    """Return the sets of IR threadblocks joined by transfers (each shares one channel)."""
    parent = {key: key for key in keys.values()}
    ends: dict[int, list[TbKey]] = defaultdict(list)
    for index, item in enumerate(items):
        if item.transfer is not None:
            ends[item.transfer].append(keys[index])
    for a, b in ends.values():
        parent[_find(parent, a)] = _find(parent, b)
    components: dict[TbKey, list[TbKey]] = defaultdict(list)
    for key in sorted(parent, key=str):
        components[_find(parent, key)].append(key)
    return list(components.values())


def _links(members: list[TbKey]) -> list[tuple]:
    links = [(k[0], "send", k[2]) for k in members if k[2] is not None]
    return links + [(k[0], "recv", k[3]) for k in members if k[3] is not None]


def _shares_links(items: tuple[Item, ...], keys: dict[int, TbKey]) -> bool:
    """Return True when two IR threadblocks joined by transfers would use one link."""
    return any(len(set(links)) < len(links) for links in map(_links, _components(items, keys)))


def _channels(plan: ExecutionPlan, items: tuple[Item, ...], keys: dict[int, TbKey]) -> dict[TbKey, int]:
    """Return a channel per IR threadblock: one per set of threadblocks joined by transfers, links unique."""
    taken: set[tuple] = set()
    channel_of: dict[TbKey, int] = {}
    for members in _components(items, keys):
        links = _links(members)
        if len(set(links)) < len(links):
            rank, side, peer = next(link for link in links if links.count(link) > 1)
            raise FormatError(
                plan.name,
                f"GPU {rank}",
                f"two threadblocks {side} to/from GPU {peer} on transfers that share one channel",
                "each plan threadblock pair on its own channels",
            )
        channel = 0
        while any(link + (channel,) in taken for link in links):
            channel += 1
        taken.update(link + (channel,) for link in links)
        channel_of.update((key, channel) for key in members)
    return channel_of


def _before(lifted: LiftedEvents, earlier: int | None, later: int | None) -> bool:
    """Return True when plan event ``earlier`` strictly precedes ``later`` (None: the end of the program)."""
    if earlier is None:
        return False
    if later is None:
        return True
    return earlier != later and bool(lifted.order_ancestors[later] >> earlier & 1)


def _item_before(lifted: LiftedEvents, earlier: Item, later: Item) -> bool:
    """Return True when item ``earlier`` runs before ``later``: an earlier event, or first in one op.

    A receive lifted from a packet read sits at the op that reads, before that op's own items.
    """
    if earlier.position is not None and earlier.position == later.position:
        return earlier.key < later.key
    return _before(lifted, earlier.position, later.position)


def _depends(lifted: LiftedEvents, programs: dict[TbKey, list[int]], ids: dict[TbKey, int]) -> dict[int, list]:
    """Return, per item, the (tb id, step) pairs of its rank it waits for, implied ones left out."""
    items = lifted.items
    place: dict[int, tuple[TbKey, int]] = {i: (key, j) for key, seq in programs.items() for j, i in enumerate(seq)}
    by_rank: dict[int, list[TbKey]] = defaultdict(list)
    for key in programs:
        by_rank[key[0]].append(key)
    infinity = len(lifted.topo_position)
    known: dict[int, dict[TbKey, int]] = {}
    depends: dict[int, list] = defaultdict(list)
    for rank, tbs in by_rank.items():
        members = [i for key in tbs for i in programs[key]]
        members.sort(key=lambda i: (_topo(lifted, items[i].position, infinity), items[i].key, place[i][1]))
        for i in members:
            key, j = place[i]
            seen = dict(known[programs[key][j - 1]]) if j else {}
            seen[key] = j
            for other in tbs:
                if other == key:
                    continue
                steps = programs[other]
                latest = len(steps) - 1
                while latest >= 0 and not _item_before(lifted, items[steps[latest]], items[i]):
                    latest -= 1
                if latest > seen.get(other, -1):
                    depends[i].append((ids[other], latest))
                    for tb, step in known[steps[latest]].items():
                        seen[tb] = max(seen.get(tb, -1), step)
            known[i] = seen
    return depends


def _topo(lifted: LiftedEvents, position: int | None, infinity: int) -> int:
    return infinity if position is None else lifted.topo_position[position]


def _check_link_order(plan: ExecutionPlan, items, programs: dict[TbKey, list[int]], channel: dict) -> None:
    """Refuse a link whose k-th send is not its k-th receive (port puts on channels the receiver sees apart)."""
    sent: dict[tuple, list[int]] = defaultdict(list)
    received: dict[tuple, list[int]] = defaultdict(list)
    for key, seq in programs.items():
        for i in seq:
            if items[i].op is OpType.SEND:
                sent[(key[0], items[i].peer, channel[key])].append(items[i].transfer)
            elif items[i].op is OpType.RECV:
                received[(items[i].peer, key[0], channel[key])].append(items[i].transfer)
    for link, transfers in sent.items():
        if received[link] != transfers:
            raise FormatError(
                plan.name,
                f"GPU {link[0]} to GPU {link[1]}",
                "puts become visible in another order than issued on one threadblock pair",
                "puts seen in the order they are issued",
            )


def lift_mscclpp_plan(plan: ExecutionPlan) -> Algorithm:
    """Return ``plan``'s data movement as an Algorithm of our IR (same collective, ranks, chunks, placement).

    Parameters
    ----------
    plan : ExecutionPlan
        A plan that verifies (``verify_mscclpp_plan``); then ``check_algorithm`` accepts the result.

    Returns
    -------
    Algorithm
        Named as the plan, ``protocol`` the plan's, ``min_bytes``/``max_bytes`` from the message
        sizes (``max_bytes`` exclusive), metadata ``source_format = mscclpp``.

    Raises
    ------
    FormatError
        One line naming GPU, threadblock and op of the first construct with no form in our IR
        (module docstring), or a deadlocked plan.

    Notes
    -----
    Costs O(events²/64) for the order relation's bit sets, plus O(steps × threadblocks) per rank
    for the dependencies.
    """
    _refuse_unliftable(plan)
    graph = ReplayBuilder(plan, 1, 1).build()
    if graph.problems:
        raise FormatError(plan.name, None, str(graph.problems[0]), "a plan that verifies")
    lifted = lift_items(plan, graph)
    items = lifted.items
    programs = _programs(plan, lifted, by_partner=False)
    keys = {i: key for key, seq in programs.items() for i in seq}
    if _shares_links(items, keys):
        programs = _programs(plan, lifted, by_partner=True)
        keys = {i: key for key, seq in programs.items() for i in seq}
    channel = _channels(plan, items, keys)
    _check_link_order(plan, items, programs, channel)
    order = sorted(programs, key=lambda k: (k[0], k[1] is None, k[1] or 0, str(k[2:])))
    ids = {key: number for key, number in zip(order, _numbering(order))}
    depends = _depends(lifted, programs, ids)
    steps = {key: [_step(items[i], tuple(depends.get(i, ()))) for i in programs[key]] for key in order}
    threadblocks: dict[int, list[Threadblock]] = defaultdict(list)
    for key in order:
        tb = Threadblock(ids[key], tuple(steps[key]), key[2], key[3], channel[key])
        threadblocks[key[0]].append(tb)
    fused = {rank: fuse_receives(tbs) for rank, tbs in threadblocks.items()}
    return _algorithm(plan, fused, lifted.scratch_chunks)


def _programs(plan: ExecutionPlan, lifted: LiftedEvents, by_partner: bool) -> dict[TbKey, list[int]]:
    """Return the items (indices, in order) of every IR threadblock (``threadblock_keys``)."""
    items = lifted.items
    keys = threadblock_keys(items, by_partner)
    programs: dict[TbKey, list[int]] = defaultdict(list)
    for index in sorted(range(len(items)), key=lambda i: items[i].key):
        programs[keys[index]].append(index)
    joined: dict[TbKey, list[int]] = {}
    for chain in _chains(plan, lifted, programs):
        key = _joined_key(chain)
        if len(chain) > 1 and (key in joined or key in programs and key not in chain):
            joined.update((piece, programs[piece]) for piece in chain)  # a name taken: leave them apart
        else:
            joined[key] = [i for piece in chain for i in programs[piece]]
    return joined


def _ends(key: TbKey) -> tuple[tuple, tuple]:
    """Return a key's (send peer, far plan tb) and (receive peer, far plan tb)."""
    far = key[4] or (None, None)
    return (key[2], far[0]), (key[3], far[1])


def _joined_key(chain: list[TbKey]) -> TbKey:
    send = next((e[0] for e in map(_ends, chain) if e[0][0] is not None), (None, None))
    recv = next((e[1] for e in map(_ends, chain) if e[1][0] is not None), (None, None))
    return key_of_threadblock(chain[0][0], chain[0][1], send, recv, chain[0][4] is not None)


def _fits(chain: list[TbKey], key: TbKey) -> bool:
    """Return True when joining ``key`` to ``chain`` leaves one send end and one receive end."""
    ends = [_ends(k) for k in chain + [key]]
    return all(len({e[side] for e in ends if e[side][0] is not None}) <= 1 for side in (0, 1))


def _chains(plan: ExecutionPlan, lifted: LiftedEvents, programs: dict[TbKey, list[int]]) -> list[list[TbKey]]:
    """Return the IR threadblocks in chains to join: pieces of one plan threadblock cut at 64 ops.

    The exporter cuts a long threadblock into pieces that share its channels and run one after
    another (chained by a semaphore); lifted apart, they would put two threadblocks on one link.
    Pieces with the same channels and peers that fit together (a piece that only sends joins one
    that also receives), joined by transfers (else they use no link in common), each wholly after
    the one before, are joined. An LL plan's receiving threadblocks hold no channel, so the
    transfers tell which lane they were cut from.
    """
    items = lifted.items
    infinity = len(lifted.topo_position)
    keys_of = {i: key for key, seq in programs.items() for i in seq}
    component = {key: number for number, members in enumerate(_components(items, keys_of)) for key in members}
    groups: dict[tuple, list[TbKey]] = defaultdict(list)
    chains: list[list[TbKey]] = []
    for key in programs:
        if key[1] is not None and (key[2] is not None or key[3] is not None):
            channels = plan.gpus[key[0]].threadblocks[key[1]].channels
            groups[(key[0], channels, component[key])].append(key)
        else:
            chains.append([key])
    for keys in groups.values():
        keys.sort(key=lambda k: _topo(lifted, items[programs[k][0]].position, infinity))
        chain, last = [keys[0]], programs[keys[0]][-1]
        for key in keys[1:]:
            if _before(lifted, items[last].position, items[programs[key][0]].position) and _fits(chain, key):
                chain.append(key)
            else:
                chains.append(chain)
                chain = [key]
            last = programs[key][-1]
        chains.append(chain)
    return chains


def _numbering(order: list[TbKey]) -> list[int]:
    numbers, count = [], defaultdict(int)
    for key in order:
        numbers.append(count[key[0]])
        count[key[0]] += 1
    return numbers


def _step(item: Item, depends: tuple) -> Step:
    src, dst = item.src or (None, 0), item.dst or (None, 0)
    return Step(item.op, src[0], src[1], dst[0], dst[1], item.count, depends)


def _algorithm(plan: ExecutionPlan, threadblocks: dict[int, list[Threadblock]], scratch: tuple[int, ...]) -> Algorithm:
    collective = Collective(plan.collective)
    gpu0 = plan.gpus[0]
    per_loop = gpu0.output_chunks if collective is Collective.ALLGATHER else max(gpu0.input_chunks, gpu0.output_chunks)
    layout = chunk_layout(collective, len(plan.gpus), per_loop)
    keeps_input = collective is not Collective.ALLGATHER
    ranks = []
    for gpu in plan.gpus:
        inputs, outputs = gpu.chunks(BufferKind.INPUT), gpu.chunks(BufferKind.OUTPUT)
        if plan.inplace:  # our IR gives the aliased view no chunks (taccl_py.ir.inplace)
            inputs, outputs = (layout.input_chunks, 0) if keeps_input else (0, layout.output_chunks)
        tbs = tuple(tb for tb in threadblocks.get(gpu.id, ()) if tb.steps)
        ranks.append(RankProgram(gpu.id, tbs, inputs, outputs, scratch[gpu.id]))
    max_bytes = None if plan.max_message_size >= MAX_MESSAGE_SIZE else plan.max_message_size + 1
    logger.debug("lifted %s: %d threadblocks", plan.name, sum(len(p.threadblocks) for p in ranks))
    return Algorithm(
        plan.name,
        collective,
        len(plan.gpus),
        layout.chunks_per_loop,
        tuple(ranks),
        plan.inplace,
        plan.protocol.value,
        plan.min_message_size,
        max_bytes,
        (("source_format", "mscclpp"),),
    )
