"""Turn an MSCCL++ plan's replay graph into IR items: local copies and reductions, sends and receives.

``lift_items`` reads the events ``ReplayBuilder`` makes (one chunk per slice, no pipeline) and
returns, per rank, the steps our IR needs, each at the plan event whose place in the plan's order
it takes: a local ``copy`` becomes ``cpy``, a local ``re`` becomes ``re`` steps (a ``cpy`` first
when the destination is none of the sources), and a put from GPU a into GPU b becomes a send on a
at the put and a receive on b at the first ``wait`` of b whose visibility covers the put's write
(``taccl_py.mscclpp.replay``), or at the end of b's program when no wait covers it (the data is
then read by nothing before the call ends). ``threadblock_keys`` says which IR threadblock each
item goes to; ``lift.py`` assembles them.

Packet (LL) ops lift the same way. A packet write into a peer (``ppkt``, ``rppkt``, the peer
destinations of ``respkt``) is a send at the write and a receive at b's first packet read of the
written slot, where b polls its flag (the replay graph's packet edges); one put whose slots b
first reads in different places is cut there. The local parts of ``cpkt``, ``upkt``, ``repkt``,
``recpkt``, ``respkt`` are copies and reductions. An op that writes one sum to several places
computes it into its first destination and copies or sends that on. Packets in scratch live apart
from plain scratch (``describe_location``), so packet slot p of a GPU with k plain scratch chunks
becomes our scratch chunk k + p.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from taccl_py.errors import FormatError
from taccl_py.ir.algorithm import Buffer, OpType
from taccl_py.mscclpp.event_order import topological_order
from taccl_py.mscclpp.plan import ExecutionPlan, OpName
from taccl_py.mscclpp.replay_graph import ReplayGraph

__all__ = ["Item", "LiftedEvents", "TbKey", "key_of_threadblock", "lift_items", "threadblock_keys"]

_PUTS = frozenset({OpName.PUT, OpName.PUT_WITH_SIGNAL, OpName.PUT_WITH_SIGNAL_AND_FLUSH})
_PACKET_SENDS = frozenset(
    {OpName.PUT_PACKETS, OpName.READ_PUT_PACKETS, OpName.REDUCE_SEND_PACKETS, OpName.REDUCE_COPY_SEND_PACKETS}
)
# Ops whose writes into their own GPU are local copies and reductions.
_LOCAL = frozenset(
    {
        OpName.COPY,
        OpName.REDUCE,
        OpName.COPY_PACKETS,
        OpName.UNPACK_PACKETS,
        OpName.REDUCE_PACKETS,
        OpName.REDUCE_COPY_PACKETS,
        OpName.REDUCE_SEND_PACKETS,
        OpName.REDUCE_COPY_SEND_PACKETS,
    }
)
_BUFFERS = {buffer.value: buffer for buffer in Buffer}

Slot = tuple[Buffer, int]
TbKey = tuple  # (rank, plan tb id or None, send peer, receive peer, far-end plan tbs or None)


@dataclass
class Item:
    """One IR step to be: its operands, where it sits in the plan, and the transfer it is an end of.

    ``position`` is the plan event it takes the place of (None: after everything on its rank);
    ``key`` sorts the items of one plan threadblock (op index, then order among one op's items);
    ``tb`` is the plan threadblock ((rank, id), id None for the end of the program).
    """

    rank: int
    op: OpType
    src: Slot | None
    dst: Slot | None
    count: int
    position: int | None
    key: tuple
    tb: tuple[int, int | None]
    peer: int | None = None  # the send peer of a send, the receive peer of a receive
    transfer: int | None = None  # shared by the two ends of one transfer


@dataclass(frozen=True)
class LiftedEvents:
    """The items of a plan and the order relation their positions are compared under."""

    items: tuple[Item, ...]
    order_ancestors: tuple[int, ...]  # per event, the bit set of events before it (itself included)
    topo_position: tuple[int, ...]  # per event, its place in one topological order
    scratch_chunks: tuple[int, ...]  # per rank, our scratch chunks: the plan's plain ones, then its packet slots


def _fault(plan: ExecutionPlan, where: str, fault: str, expected: str) -> FormatError:
    return FormatError(plan.name, where, fault, expected)


def _ancestors(predecessors: list[set[int]], order: list[int]) -> list[int]:
    reach = [0] * len(predecessors)
    for node in order:
        bits = 1 << node
        for pred in predecessors[node]:
            bits |= reach[pred]
        reach[node] = bits
    return reach


def _runs(columns: list[list[tuple]], cuts: list | None = None) -> list[tuple[int, int]]:
    """Return (start, length) runs over which every column stays in one buffer at consecutive chunks.

    ``cuts``, one label per chunk, also ends a run where the label changes.
    """
    runs: list[tuple[int, int]] = []
    start = 0
    for j in range(1, len(columns[0]) + 1):
        if j < len(columns[0]) and all(
            col[j][:2] == col[j - 1][:2] and col[j][3] == col[j - 1][3] and col[j][2] == col[j - 1][2] + 1
            for col in columns
        ):
            if cuts is None or cuts[j] == cuts[j - 1]:
                continue
        runs.append((start, j - start))
        start = j
    return runs


def _shared_sum(writes: list) -> list:
    """Return ``writes`` with every destination after the first of one sum fed from the first one."""
    first_dst, first_sources = writes[0] if writes else (None, None)
    if first_sources is None or len(first_sources) < 2:
        return writes
    return writes[:1] + [(dst, [first_dst]) if src == first_sources else (dst, src) for dst, src in writes[1:]]


class _Lifter:
    """Collect the items of every write of the replay graph."""

    def __init__(self, plan: ExecutionPlan, graph: ReplayGraph) -> None:
        self.plan, self.graph = plan, graph
        order = topological_order(graph.order)
        if len(order) < len(graph.events):
            raise _fault(plan, "threadblocks", "the plan deadlocks", "a plan that verifies")
        self.topo = [0] * len(graph.events)
        for place, node in enumerate(order):
            self.topo[node] = place
        self.order_anc = _ancestors(graph.order, order)
        self.vis_anc = _ancestors(graph.visible, order)
        self.op_event: dict[tuple, int] = {}
        self.waits: dict[int, list[int]] = {}
        for index, event in enumerate(graph.events):
            if event.tb is not None:
                self.op_event.setdefault((event.gpu, event.tb, event.step), index)
                if event.name is OpName.WAIT:
                    self.waits.setdefault(event.gpu, []).append(index)
        self.packet_readers: dict[tuple, list[int]] = {}
        for index, event in enumerate(graph.events):
            for loc in event.packet_reads:
                self.packet_readers.setdefault(loc, []).append(index)
        self.scratch = [gpu.scratch_chunks for gpu in plan.gpus]
        self.items: list[Item] = []
        self.transfers = 0

    def where(self, event) -> str:
        name = self.graph.events[self.op_event[(event.gpu, event.tb, event.step)]].name
        return f"GPU {event.gpu} tb {event.tb} op {event.step} ({name.value})"

    def lift(self) -> LiftedEvents:
        for index, event in enumerate(self.graph.events):
            if not event.writes:
                continue
            op_index = self.op_event[(event.gpu, event.tb, event.step)]
            name = self.graph.events[op_index].name
            self._check_packets(event)
            for number, (dst_locs, sources) in enumerate(_shared_sum(event.writes)):
                readers = {loc[0] for locs in sources for loc in locs}
                if readers | {loc[0] for loc in dst_locs} == {event.gpu} and name in _LOCAL:
                    self._local(event, op_index, name, dst_locs, sources, number)
                elif name in _PUTS | _PACKET_SENDS and readers == {event.gpu} and len(sources) == 1:
                    self._put(event, index, op_index, dst_locs, sources[0], number)
                else:
                    raise _fault(
                        self.plan,
                        self.where(event),
                        "reads or writes a peer's memory in a way with no send/receive form",
                        "puts from local chunks into a peer, local copies and reductions",
                    )
        return LiftedEvents(tuple(self.items), tuple(self.order_anc), tuple(self.topo), tuple(self.scratch))

    def _check_packets(self, event) -> None:
        """Refuse packets outside scratch: our IR could not keep them apart from the plain chunks there."""
        for dst_locs, sources in event.writes:
            for loc in dst_locs + [loc for locs in sources for loc in locs]:
                if loc[3] and loc[1] != Buffer.SCRATCH.value:
                    raise _fault(self.plan, self.where(event), "packets outside scratch", "packet slots in scratch")

    def _slot(self, location: tuple) -> Slot:
        """Return our chunk of a plan location: packet slots follow the GPU's plain scratch chunks."""
        if not location[3]:
            return _BUFFERS[location[1]], location[2]
        return Buffer.SCRATCH, self.plan.gpus[location[0]].scratch_chunks + location[2]

    def _add(self, event, position, key, op, src, dst, count, peer=None, transfer=None, tb=None) -> None:
        tb = (event.gpu, event.tb) if tb is None else tb
        for slot in (src, dst):
            if slot is not None and slot[0] is Buffer.SCRATCH:
                self.scratch[tb[0]] = max(self.scratch[tb[0]], slot[1] + count)
        self.items.append(Item(tb[0], op, src, dst, count, position, key, tb, peer, transfer))

    def _local(self, event, op_index: int, name: OpName, dst_locs, sources, number: int) -> None:
        """Add the cpy/re steps of a local copy or reduction (``dst`` <- sum of ``sources``)."""
        for start, length in _runs([dst_locs, *sources]):
            dst = self._slot(dst_locs[start])
            srcs = [self._slot(locs[start]) for locs in sources]
            key = (event.step, number, start)
            if name is OpName.COPY or len(srcs) == 1:
                if srcs[0] != dst:
                    self._add(event, op_index, key + (0,), OpType.COPY, srcs[0], dst, length)
                continue
            rest = list(srcs)
            if dst in rest:
                rest.remove(dst)
            else:
                first = rest.pop(0)
                self._check_disjoint(event, dst, length, rest)
                self._add(event, op_index, key + (0,), OpType.COPY, first, dst, length)
            self._check_disjoint(event, dst, length, rest)
            for j, src in enumerate(rest, start=1):
                self._add(event, op_index, key + (j,), OpType.REDUCE, src, dst, length)

    def _check_disjoint(self, event, dst: Slot, length: int, sources: list[Slot]) -> None:
        for src in sources:
            if src[0] is dst[0] and src[1] < dst[1] + length and dst[1] < src[1] + length:
                raise _fault(
                    self.plan,
                    self.where(event),
                    "reduces into chunks that partly overlap a source",
                    "a destination that is one of the sources or disjoint from them",
                )

    def _put(self, event, write: int, op_index: int, dst_locs, src_locs, number: int) -> None:
        """Add a send on the putting GPU and a receive where the receiver first sees the data."""
        points = [self._receive_point(event, write, loc) for loc in dst_locs]
        for start, length in _runs([dst_locs, src_locs], points):
            receiver, wait = dst_locs[start][0], points[start]
            transfer = self.transfers
            self.transfers += 1
            self._add(
                event,
                op_index,
                (event.step, number, start),
                OpType.SEND,
                self._slot(src_locs[start]),
                None,
                length,
                receiver,
                transfer,
            )
            if wait is None:
                tb, key = (receiver, None), (transfer,)
            else:
                tb, key = (receiver, self.graph.events[wait].tb), (self.graph.events[wait].step, -1, write, start)
            self._add(event, wait, key, OpType.RECV, None, self._slot(dst_locs[start]), length, event.gpu, transfer, tb)

    def _same_tb(self, node: int, event) -> bool:
        other = self.graph.events[node]
        return other.gpu == event.gpu and other.tb == event.tb

    def _receive_point(self, event, write: int, location: tuple) -> int | None:
        """Return where ``location``'s owner first sees ``write``: its first wait that makes it visible
        or, for a packet, its first read of it (None: nothing does)."""
        receiver = location[0]
        if location[3]:
            seen = self.packet_readers.get(location, [])
            what = f"packets are first read by GPU {receiver}"
        else:
            seen = [w for w in self.waits.get(receiver, []) if self.vis_anc[w] >> write & 1]
            what = f"its data becomes visible to GPU {receiver}"
        first = [w for w in seen if not any(o != w and self.order_anc[w] >> o & 1 for o in seen)]
        if len(first) > 1:  # several see it: the wait met by a signal of the putting threadblock
            mine = [w for w in first if any(self._same_tb(p, event) for p in self.graph.order[w])]
            first = mine if len(mine) == 1 else first
        if len(first) > 1:
            labels = ", ".join(self.graph.events[w].label for w in first)
            raise _fault(
                self.plan,
                self.where(event),
                f"{what} at several unordered places ({labels})",
                "one first wait or packet read per put",
            )
        return first[0] if first else None


def lift_items(plan: ExecutionPlan, graph: ReplayGraph) -> LiftedEvents:
    """Return the IR items of ``plan`` (its replay graph ``graph``, one slice per chunk)."""
    return _Lifter(plan, graph).lift()


def threadblock_keys(items: tuple[Item, ...], by_partner: bool) -> dict[int, TbKey]:
    """Return the IR threadblock of every item (by its index in ``items``).

    A plan threadblock that talks to several peers is cut per peer (and one for its local steps).
    With ``by_partner`` a transfer's end is told apart by the plan threadblock at its other end too,
    for plans (MSCCL++'s own LL ones) whose threadblock talks to several threadblocks of one peer.
    """
    partner: dict[int, tuple] = {}
    if by_partner:
        ends: dict[int, list[int]] = defaultdict(list)
        for index, item in enumerate(items):
            if item.transfer is not None:
                ends[item.transfer].append(index)
        for a, b in ends.values():
            partner[a], partner[b] = items[b].tb, items[a].tb
    by_plan_tb: dict[tuple, list[int]] = defaultdict(list)
    for index, item in enumerate(items):
        by_plan_tb[item.tb].append(index)
    keys: dict[int, TbKey] = {}
    for (rank, tb), members in by_plan_tb.items():
        sends = {(items[i].peer, partner.get(i)) for i in members if items[i].op is OpType.SEND}
        recvs = {(items[i].peer, partner.get(i)) for i in members if items[i].op is OpType.RECV}
        if len(sends) <= 1 and len(recvs) <= 1:
            send, recv = next(iter(sends), (None, None)), next(iter(recvs), (None, None))
            keys.update((i, key_of_threadblock(rank, tb, send, recv, by_partner)) for i in members)
            continue
        receiving: dict[int, TbKey] = {}  # an op's local items go with a receive at that op (LL: fusable)
        for i in members:
            end, none = (items[i].peer, partner.get(i)), (None, None)
            send = end if items[i].op is OpType.SEND else none
            recv = end if items[i].op is OpType.RECV else none
            keys[i] = key_of_threadblock(rank, tb, send, recv, by_partner)
            if items[i].op is OpType.RECV and items[i].position is not None:
                receiving.setdefault(items[i].position, keys[i])
        for i in members:
            if items[i].transfer is None and items[i].position in receiving:
                keys[i] = receiving[items[i].position]
    return keys


def key_of_threadblock(rank: int, tb: int | None, send: tuple, recv: tuple, by_partner: bool) -> TbKey:
    """Return (rank, plan tb, send peer, receive peer, the plan threadblocks at the far ends or None)."""
    return (rank, tb, send[0], recv[0], (send[1], recv[1]) if by_partner else None)
