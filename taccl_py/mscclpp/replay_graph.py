"""Build the replay graph of an MSCCL++ plan: events, the locations they touch, order and visibility.

See ``taccl_py.mscclpp.replay`` for the semantics; this module turns each op into events (a
pipeline's body once per modelled iteration, a port-channel put into its issue and its proxy
write) and matches signals with waits, semaphore releases with acquires, barrier rounds and
packet writes with packet reads.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from taccl_py.errors import Violation
from taccl_py.mscclpp.event_order import in_forced_order, reached_neighbours, topological_order
from taccl_py.mscclpp.plan import BufferKind, BufferRef, ChannelKind, ExecutionPlan, Gpu, Operation, OpName
from taccl_py.mscclpp.references import switch_channels

__all__ = [
    "DEFAULT_PIPELINE_ITERATIONS",
    "Event",
    "ReplayGraph",
    "ReplayBuilder",
    "all_ops",
    "describe_location",
    "violation_at",
    "Location",
]

# Pipeline iterations replayed per pipeline op: enough that consecutive iterations overlap.
DEFAULT_PIPELINE_ITERATIONS = 3
_SIGNALS = {OpName.SIGNAL, OpName.RELAXED_SIGNAL}
_WAITS = {OpName.WAIT, OpName.RELAXED_WAIT}
# Packet ops ignore a pipeline's offset (their handlers take none), so they touch whole ranges.
_PACKET_OPS = {
    OpName.PUT_PACKETS,
    OpName.READ_PUT_PACKETS,
    OpName.REDUCE_SEND_PACKETS,
    OpName.COPY_PACKETS,
    OpName.UNPACK_PACKETS,
    OpName.REDUCE_PACKETS,
    OpName.REDUCE_COPY_PACKETS,
    OpName.REDUCE_COPY_SEND_PACKETS,
    OpName.MULTI_STORE_PACKETS,
}
# Location: (gpu, buffer spelling, slice, packet); packets live apart from plain data.
Location = tuple


@dataclass
class Event:
    """One node of the replay graph: an op (or an op's proxy write or signal) on one GPU."""

    gpu: int
    tb: int | None
    step: int | None
    label: str
    name: OpName | None = None
    writes: list = field(default_factory=list)  # (destination locations, list of source location lists)
    packet_reads: list = field(default_factory=list)
    blocked: str | None = None  # why the event can never run, when nothing it waits for exists


@dataclass
class ReplayGraph:
    """Events with their predecessors under order and under visibility, and structural problems found."""

    events: list[Event] = field(default_factory=list)
    order: list[set[int]] = field(default_factory=list)  # predecessors
    visible: list[set[int]] = field(default_factory=list)  # predecessors that publish their writes
    problems: list[Violation] = field(default_factory=list)

    def add(self, event: Event) -> int:
        """Return the index of ``event``, added with no predecessors."""
        self.events.append(event)
        self.order.append(set())
        self.visible.append(set())
        return len(self.events) - 1

    def edge(self, before: int, after: int, publishes: bool = True) -> None:
        """Order ``after`` behind ``before``; with ``publishes``, ``before``'s writes are visible to ``after``."""
        self.order[after].add(before)
        if publishes:
            self.visible[after].add(before)


def all_ops(ops: tuple[Operation, ...]):
    """Yield every op of ``ops``, each pipeline followed by its body."""
    for op in ops:
        yield op
        yield from op.ops


class ReplayBuilder:
    """Turn a plan into the replay graph: events, their locations and both relations."""

    def __init__(self, plan: ExecutionPlan, slices: int, iterations: int) -> None:
        self.plan, self.slices, self.iterations = plan, slices, iterations
        self.graph = ReplayGraph()
        self.signals: dict[tuple, list[int]] = defaultdict(list)  # (gpu, kind, channel) -> signal events
        self.waits: dict[tuple, list[int]] = defaultdict(list)
        self.port_tail: dict[tuple, int] = {}  # (gpu, channel) -> last proxy event on it
        self.sem_ops: dict[tuple, list[tuple[int, int]]] = defaultdict(list)  # (gpu, sem, name) -> (tb, event)
        self.barriers: dict[tuple, list[list[int]]] = defaultdict(list)  # (gpu, id) -> per-tb barrier events
        self.after: dict[int, int] = {}  # event -> next event in its threadblock

    def build(self) -> ReplayGraph:
        for gpu in self.plan.gpus:
            for tb in gpu.threadblocks:
                self._threadblock(gpu, tb)
        self._match_in_order()
        self._match_barriers()
        self._match_packets()
        return self.graph

    def _threadblock(self, gpu: Gpu, tb) -> None:
        previous: int | None = None
        barrier_events: dict[int, list[int]] = defaultdict(list)
        for step, op in enumerate(tb.ops):
            runs = [(op, None, None)]
            if op.name is OpName.PIPELINE:
                runs = [(inner, j, k) for k in range(self.iterations) for j, inner in enumerate(op.ops)]
            for inner, j, k in runs:
                where = f"gpu {gpu.id} tb {tb.id} op {step}" + ("" if j is None else f".{j} iteration {k}")
                pipe = None if k is None else (k, op.num_chunks)
                first, last = self._op(gpu, tb, step, inner, f"{where} ({inner.name.value})", pipe)
                if previous is not None:
                    self.graph.edge(previous, first)
                    self.after[previous] = first
                if inner.name is OpName.BARRIER:
                    barrier_events[inner.barrier_id].append(last)
                previous = last
        for barrier_id, events in barrier_events.items():
            self.barriers[(gpu.id, barrier_id)].append(events)

    def _op(self, gpu: Gpu, tb, step: int, op: Operation, label: str, pipe) -> tuple[int, int]:
        graph = self.graph
        node = graph.add(Event(gpu.id, tb.id, step, label, op.name))
        if op.name in _SIGNALS or op.name in _WAITS or op.name is OpName.FLUSH:
            for channel in self._channels(tb, op):
                key = (gpu.id, op.channel_type, channel)
                if op.name in _WAITS:
                    self.waits[key].append(node)
                elif op.name is OpName.FLUSH or op.channel_type is ChannelKind.PORT:
                    self._proxy(gpu, tb, op, channel, node, op.name is OpName.FLUSH)
                else:
                    self.signals[key].append(node)
        elif op.name in (OpName.SEM_ACQUIRE, OpName.SEM_RELEASE):
            for semaphore in op.semaphore_ids:
                self.sem_ops[(gpu.id, semaphore, op.name)].append((tb.id, node))
        elif op.name not in (OpName.NOP, OpName.BARRIER):
            return node, self._data(gpu, tb, op, node, pipe)
        return node, node

    def _proxy(self, gpu: Gpu, tb, op: Operation, channel: int, issue: int, flush: bool) -> int:
        """Add a proxy event for a port op after ``issue``, chained on the channel; return it."""
        key = (gpu.id, ChannelKind.PORT, channel)
        tail = self.port_tail.get(key)
        if flush:
            if tail is not None:
                self.graph.edge(tail, issue)
            return issue
        proxy = self.graph.add(Event(gpu.id, tb.id, self.graph.events[issue].step, self.graph.events[issue].label))
        self.graph.edge(issue, proxy)
        if tail is not None:
            self.graph.edge(tail, proxy)
        self.port_tail[key] = proxy
        if op.name in _SIGNALS or op.name in (OpName.PUT_WITH_SIGNAL, OpName.PUT_WITH_SIGNAL_AND_FLUSH):
            self.signals[key].append(proxy)
        return proxy

    def _channels(self, tb, op: Operation) -> list[int]:
        ids = [c for entry in tb.channels if entry.channel_type is op.channel_type for c in entry.channel_ids]
        return [ids[i] for i in op.channel_ids or ()]

    def _data(self, gpu: Gpu, tb, op: Operation, node: int, pipe) -> int:
        """Record the op's writes on ``node`` (or its proxy events); return the event the threadblock continues from."""
        pipe = None if op.name in _PACKET_OPS else pipe
        src = [self._locations(gpu, tb, op, ref, pipe) for ref in op.src]
        dst = [self._locations(gpu, tb, op, ref, pipe) for ref in op.dst]
        packet_src, packet_dst = _packet_operands(op, len(src), len(dst))
        src = [[_as_packet(loc, i in packet_src) for loc in locs] for i, locs in enumerate(src)]
        dst = [[_as_packet(loc, i in packet_dst) for loc in locs] for i, locs in enumerate(dst)]
        # Reads with a flag: packets read by anything but a port put, which copies them raw.
        raw_copy = op.channel_type is ChannelKind.PORT and op.name is OpName.PUT_PACKETS
        event = self.graph.events[node]
        event.packet_reads = [] if raw_copy else [loc for i in packet_src for owner in src[i] for loc in owner]
        pairs = _assignments(op.name, src, dst)
        for dst_locs, sources in pairs:
            if any(len(locs) != len(dst_locs) for locs in sources):
                self.graph.problems.append(
                    violation_at(event, "size mismatch", "sources and destinations differ in size")
                )
                return node
        port = op.channel_type is ChannelKind.PORT and op.name not in (OpName.COPY, OpName.GET)
        if not port:
            event.writes = pairs
            return node
        channels = self._channels(tb, op)
        for i, pair in enumerate(pairs):
            channel = channels[min(i, len(channels) - 1)] if channels else None
            if channel is None:
                self.graph.problems.append(violation_at(event, "missing channel", "a port put names no channel"))
                return node
            proxy = self._proxy(gpu, tb, op, channel, node, False)
            self.graph.events[proxy].writes = [pair]
            if op.name is OpName.READ_PUT_PACKETS:  # every thread saw the flags before thread 0 started the copy
                self.graph.events[proxy].packet_reads = event.packet_reads
        if op.name is OpName.PUT_WITH_SIGNAL_AND_FLUSH:
            done = self.graph.add(Event(gpu.id, tb.id, event.step, event.label + " flush"))
            self.graph.edge(node, done)
            for channel in channels:
                self.graph.edge(self.port_tail[(gpu.id, ChannelKind.PORT, channel)], done)
            return done
        return node

    def _locations(self, gpu: Gpu, tb, op: Operation, ref: BufferRef, pipe) -> list[list[Location]]:
        """Return the slices ``ref`` names, one list per GPU it reaches (a switch ref reaches several)."""
        if ref.buffer_id is not None:
            ids = [
                b
                for e in tb.remote_buffer_refs
                if e.access_channel_type is op.channel_type
                for b in e.remote_buffer_ids
            ]
            remote = gpu.remote_buffers[ids[ref.buffer_id]]
            owners, buffer = (remote.rank,), remote.buffer
        elif ref.switch_channel_id is not None:
            ids = [c for e in tb.channels if e.channel_type is ChannelKind.SWITCH for c in e.channel_ids]
            buffer, owners = switch_channels(gpu)[ids[ref.switch_channel_id]]
        else:
            owners, buffer = (gpu.id,), ref.buffer
        start, length = ref.index * self.slices, ref.size * self.slices
        if op.tbg is not None:
            length //= op.tbg.tbg_size
            start += op.tbg.tb_id * length
        if pipe is not None:
            iteration, num_chunks = pipe
            unit = num_chunks * self.slices // self.iterations
            low, high = min(iteration * unit, length), min((iteration + 1) * unit, length)
            start, length = start + low, high - low
        return [[self.canonical(owner, buffer, s) for s in range(start, start + length)] for owner in owners]

    def canonical(self, rank: int, buffer: BufferKind, slice_index: int) -> Location:
        """Return the plain location of a slice, in-place buffers folded onto the one they share."""
        plan, (chunk, part) = self.plan, divmod(slice_index, self.slices)
        if plan.inplace:
            gpu = plan.gpus[rank]
            if plan.collective == "allreduce" and buffer is BufferKind.OUTPUT:
                buffer = BufferKind.INPUT
            # the aliased block is rank's share of the whole buffer (a plan may give the view 0 chunks)
            elif plan.collective == "allgather" and buffer is BufferKind.INPUT:
                buffer, chunk = BufferKind.OUTPUT, rank * (gpu.output_chunks // len(plan.gpus)) + chunk
            elif plan.collective == "reducescatter" and buffer is BufferKind.OUTPUT:
                buffer, chunk = BufferKind.INPUT, rank * (gpu.input_chunks // len(plan.gpus)) + chunk
        return (rank, buffer.value, chunk * self.slices + part, False)

    def _match_in_order(self) -> None:
        """Match signals with waits and releases with acquires, in each sequence's order of execution.

        A channel or semaphore one threadblock uses on each side matches in program order. One that
        several threadblocks share (an exported threadblock cut at 64 ops, its pieces chained by a
        semaphore) matches in the order the graph already forces on its uses; matching one may order
        another, so rounds repeat until none matches. Uses left in no forced order are not modelled:
        which wait meets which signal would depend on timing.
        """
        pending = self._channel_matches() + self._semaphore_matches()
        threadblocks = [event.tb for event in self.graph.events]  # matching adds edges, never events
        while pending:
            order = topological_order(self.graph.order)
            position = {event: place for place, event in enumerate(order)}
            every_sequence = [events for sequences, _match, _unordered in pending for events in sequences]
            known = reached_neighbours(self.graph.order, order, threadblocks, every_sequence)
            left = []
            for sequences, match, unordered in pending:
                ordered = [
                    in_forced_order(self.graph.order, threadblocks, events, position, known) for events in sequences
                ]
                if any(events is None for events in ordered):
                    left.append((sequences, match, unordered))
                else:
                    match(*ordered)
            if len(left) == len(pending):
                break
            pending = left
        for _sequences, _match, unordered in pending:
            self.graph.problems.append(unordered())

    def _channel_matches(self) -> list[tuple]:
        """Return, per waited channel, its (waits, the partner's signals), the matcher, and the refusal."""
        matches = []
        for (rank, kind, channel), waits in self.waits.items():
            peer, partner = self._partner(rank, kind, channel)
            signals = self.signals.get((peer, kind, partner), []) if peer is not None else []

            def match(waits, signals, kind=kind, channel=channel, peer=peer) -> None:
                for k, wait in enumerate(waits):
                    if k >= len(signals):
                        self.graph.events[wait].blocked = (
                            f"wait {k + 1} on {kind.value} channel {channel} meets no signal "
                            f"(GPU {peer} signals it {len(signals)} times)"
                        )
                        continue
                    relaxed = self.graph.events[wait].name is OpName.RELAXED_WAIT or (
                        self.graph.events[signals[k]].name is OpName.RELAXED_SIGNAL
                    )
                    self.graph.edge(signals[k], wait, publishes=not relaxed)

            def unordered(rank=rank, kind=kind, channel=channel, peer=peer, waits=waits, signals=signals) -> Violation:
                waiting = sorted({self.graph.events[event].tb for event in waits})
                signalling = sorted({self.graph.events[event].tb for event in signals})
                message = (
                    f"{kind.value} channel {channel} of GPU {rank} is waited on by threadblocks {waiting} and "
                    f"signalled by GPU {peer}'s {signalling} in no fixed order"
                )
                return violation_at(self.graph.events[waits[0]], "not modelled", message)

            matches.append(((waits, signals), match, unordered))
        return matches

    def _semaphore_matches(self) -> list[tuple]:
        """Return, per acquired semaphore, its (acquires, releases), the matcher, and the refusal."""
        matches = []
        for gpu in self.plan.gpus:
            for semaphore, initial in enumerate(gpu.semaphores):
                acquires = [event for _, event in self.sem_ops.get((gpu.id, semaphore, OpName.SEM_ACQUIRE), [])]
                releases = [event for _, event in self.sem_ops.get((gpu.id, semaphore, OpName.SEM_RELEASE), [])]
                if not acquires:
                    continue

                def match(acquires, releases, semaphore=semaphore, initial=initial) -> None:
                    for n, acquire in enumerate(acquires, start=1):
                        needed = n - initial
                        if needed > len(releases):
                            self.graph.events[acquire].blocked = (
                                f"acquire {n} of semaphore {semaphore} (initial {initial}) "
                                f"needs {needed} releases; {len(releases)} happen"
                            )
                        elif needed > 0:
                            self.graph.edge(releases[needed - 1], acquire)

                def unordered(gpu=gpu.id, semaphore=semaphore, acquires=acquires, releases=releases) -> Violation:
                    users = sorted({self.graph.events[event].tb for event in acquires + releases})
                    message = f"semaphore {semaphore} of GPU {gpu} is shared by threadblocks {users} in no fixed order"
                    return violation_at(self.graph.events[acquires[0]], "not modelled", message)

                matches.append(((acquires, releases), match, unordered))
        return matches

    def _partner(self, rank: int, kind: ChannelKind, channel: int) -> tuple[int | None, int | None]:
        """Return the peer of a GPU's channel and the peer's channel it pairs with (None when unpaired)."""
        peers = [p for c in self.plan.gpus[rank].channels if c.channel_type is kind for p in c.connected_to]
        if channel >= len(peers):
            return None, None
        peer = peers[channel]
        ordinal = peers[:channel].count(peer)
        back = [
            i
            for i, p in enumerate(
                p for c in self.plan.gpus[peer].channels if c.channel_type is kind for p in c.connected_to
            )
            if p == rank
        ]
        return (peer, back[ordinal]) if ordinal < len(back) else (peer, None)

    def _match_barriers(self) -> None:
        graph = self.graph
        for (rank, barrier_id), per_tb in self.barriers.items():
            for k in range(max(len(events) for events in per_tb)):
                members = [events[k] for events in per_tb if k < len(events)]
                wanted = self._barrier_size(members[0])
                if len(members) != wanted:
                    for member in members:
                        graph.events[
                            member
                        ].blocked = (
                            f"barrier {barrier_id} round {k + 1} waits for {wanted} threadblocks; {len(members)} arrive"
                        )
                    continue
                join = graph.add(Event(rank, None, None, f"gpu {rank} barrier {barrier_id} round {k + 1}"))
                for member in members:
                    graph.edge(member, join)
                    if member in self.after:
                        graph.edge(join, self.after[member])

    def _barrier_size(self, event: int) -> int:
        label = self.graph.events[event]
        tb = self.plan.gpus[label.gpu].threadblocks[label.tb]
        top = tb.ops[label.step]
        return next(op.num_threadblocks for op in all_ops((top,)) if op.name is OpName.BARRIER)

    def _match_packets(self) -> None:
        graph = self.graph
        writers: dict[Location, set[int]] = defaultdict(set)
        for index, event in enumerate(graph.events):
            for dst_locs, _ in event.writes:
                for loc in dst_locs:
                    if loc[3]:
                        writers[loc].add(index)
        for index, event in enumerate(graph.events):
            for loc in event.packet_reads:
                found = writers.get(loc, set())
                if not found:
                    event.blocked = f"reads {describe_location(loc)}, which nothing writes"
                elif len(found) == 1:
                    graph.edge(next(iter(found)), index, publishes=False)


def _packet_operands(op: Operation, sources: int, destinations: int) -> tuple[set[int], set[int]]:
    """Return which source and destination operands of ``op`` are packets (LL: data with a flag)."""
    rest_src, rest_dst = set(range(1, sources)), set(range(1, destinations))
    every_dst = set(range(destinations))
    table = {
        OpName.COPY_PACKETS: (set(), {0}),
        OpName.UNPACK_PACKETS: ({0}, set()),
        OpName.READ_PUT_PACKETS: ({0}, every_dst),
        OpName.REDUCE_PACKETS: (rest_src, set()),
        OpName.REDUCE_COPY_PACKETS: (rest_src, {1}),
        OpName.REDUCE_SEND_PACKETS: (rest_src, rest_dst),
        OpName.REDUCE_COPY_SEND_PACKETS: (rest_src, rest_dst),
        OpName.MULTI_STORE_PACKETS: ({0}, {0}),
    }
    if op.name is OpName.PUT_PACKETS:
        # A memory channel packs plain data; a port channel copies data already packed.
        return (set(range(sources)) if op.channel_type is ChannelKind.PORT else set()), every_dst
    return table.get(op.name, (set(), set()))


def _as_packet(locations: list[Location], packet: bool) -> list[Location]:
    return [(loc[0], loc[1], loc[2], packet) for loc in locations]


def _assignments(name: OpName, src: list, dst: list) -> list[tuple[list[Location], list[list[Location]]]]:
    """Return (destination, sources) pairs: each destination slice receives the sum of the sources' slices."""
    if name in (OpName.COPY, OpName.COPY_PACKETS, OpName.UNPACK_PACKETS):
        return [(dst[0][0], [src[0][0]])]
    if name in (
        OpName.GET,
        OpName.PUT,
        OpName.PUT_WITH_SIGNAL,
        OpName.PUT_WITH_SIGNAL_AND_FLUSH,
        OpName.PUT_PACKETS,
        OpName.READ_PUT_PACKETS,
    ):
        return [(d[0], [src[min(i, len(src) - 1)][0]]) for i, d in enumerate(dst)]
    if name is OpName.MULTI_LOAD_REDUCE_STORE:
        return [(owner, list(src[min(i, len(src) - 1)])) for i, d in enumerate(dst) for owner in d]
    if name in (OpName.MULTI_STORE, OpName.MULTI_STORE_PACKETS):
        return [(owner, [src[0][0]]) for owner in dst[0]]
    sources = [s[0] for s in src]
    return [(d[0], sources) for d in dst]


def violation_at(event: Event, kind: str, message: str) -> Violation:
    """Return a ``Violation`` located at ``event``'s GPU, threadblock and op index."""
    return Violation(kind, f"{event.label}: {message}", rank=event.gpu, threadblock=event.tb, step=event.step)


def describe_location(loc: Location) -> str:
    """Return a location for a message: ``GPU 1 packet s slice 0``."""
    kind = "packet " if loc[3] else ""
    return f"GPU {loc[0]} {kind}{loc[1]} slice {loc[2]}"
