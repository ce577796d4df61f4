"""Build the replay graph of an MSCCL++ plan: events, the locations they touch, order and visibility.

See ``taccl_py.mscclpp.replay`` for the semantics; this module turns each op into events (a
pipeline's body once per modelled iteration, a port-channel put into its issue and its proxy
write, a control op's ids past the first into events of their threads, joined at the next ``nop``
or ``barrier``) and matches signals with waits, semaphore releases with acquires, barrier rounds
and packet writes with packet reads.
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
# Packet ops (the executor's names end in "pkt") ignore a pipeline's offset (their handlers take
# none), so they touch whole ranges.
_PACKET_OPS = frozenset(name for name in OpName if name.value.endswith("pkt"))
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
    thread: int = 0  # the thread that runs it: 0 for the op itself, k for the k-th id of a per-thread op


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
        self.after: dict[int, list[int]] = defaultdict(list)  # event -> the events that follow it in its threadblock
        # Where the threadblock being built stands: thread 0's last event (the op before), the last
        # __syncthreads, and each thread k > 0's own last event since it.
        self.previous: int | None = None
        self.synced: int | None = None
        self.lanes: dict[int, int] = {}

    def build(self) -> ReplayGraph:
        for gpu in self.plan.gpus:
            for tb in gpu.threadblocks:
                self._threadblock(gpu, tb)
        self._match_in_order()
        self._match_barriers()
        self._match_packets()
        return self.graph

    def _threadblock(self, gpu: Gpu, tb) -> None:
        self.previous, self.synced, self.lanes = None, None, {}
        barrier_events: dict[int, list[int]] = defaultdict(list)
        for step, op in enumerate(tb.ops):
            runs = [(op, None, None)]
            if op.name is OpName.PIPELINE:
                runs = [(inner, j, k) for k in range(self.iterations) for j, inner in enumerate(op.ops)]
            for inner, j, k in runs:
                where = f"gpu {gpu.id} tb {tb.id} op {step}" + ("" if j is None else f".{j} iteration {k}")
                pipe = None if k is None else (k, op.num_chunks)
                first, last = self._op(gpu, tb, step, inner, f"{where} ({inner.name.value})", pipe)
                self._follow(self.previous, first)
                if inner.name is OpName.BARRIER:
                    barrier_events[inner.barrier_id].append(last)
                self.previous = last
        for barrier_id, events in barrier_events.items():
            self.barriers[(gpu.id, barrier_id)].append(events)

    def _op(self, gpu: Gpu, tb, step: int, op: Operation, label: str, pipe) -> tuple[int, int]:
        node = self.graph.add(Event(gpu.id, tb.id, step, label, op.name))
        if op.name in _SIGNALS or op.name in _WAITS or op.name is OpName.FLUSH:
            channels = self._channels(tb, op)
            if op.name is OpName.FLUSH:
                # handleFlush flushes op.nOutputs channels (execution_kernel.hpp:120-127), and the parser
                # counts nOutputs from dst_buff alone (execution_plan.cc:550-551): none without one
                channels = channels[: len(op.dst or ())]
            gates = op.name in _WAITS or op.name is OpName.FLUSH
            for channel, event in zip(channels, self._per_thread(node, len(channels), gates)):
                key = (gpu.id, op.channel_type, channel)
                if op.name in _WAITS:
                    self.waits[key].append(event)
                elif op.name is OpName.FLUSH or op.channel_type is ChannelKind.PORT:
                    self._proxy(gpu, tb, op, channel, event, op.name is OpName.FLUSH)
                else:
                    self.signals[key].append(event)
        elif op.name in (OpName.SEM_ACQUIRE, OpName.SEM_RELEASE):
            events = self._per_thread(node, len(op.semaphore_ids), op.name is OpName.SEM_ACQUIRE)
            for semaphore, event in zip(op.semaphore_ids, events):
                self.sem_ops[(gpu.id, semaphore, op.name)].append((tb.id, event))
        elif op.name in (OpName.NOP, OpName.BARRIER):
            self._sync(node)
        else:
            return node, self._data(gpu, tb, op, node, pipe)
        return node, node

    def _follow(self, before: int | None, after: int) -> None:
        """Order ``after`` behind ``before`` in its threadblock (nothing when ``before`` is None: its first event)."""
        if before is not None:
            self.graph.edge(before, after)
            self.after[before].append(after)

    def _per_thread(self, node: int, count: int, gates: bool) -> list[int]:
        """Return, for threads 0..count-1, the event where each runs its id of ``node``'s op (thread 0: ``node``).

        Thread k comes from its own last event, else the last sync: not from thread 0's gates, nor
        (unsynced) from the data ops. Where that is ``node``'s predecessor and the op does not hold
        the thread (``gates``: wait, acquire, flush), ``node`` stands for it; else it gets an event.
        """
        events = [node]
        for k in range(1, count):
            pred = self.lanes.get(k, self.synced)
            event = node
            if gates or pred != self.previous:
                label = self.graph.events[node]
                event = self.graph.add(Event(label.gpu, label.tb, label.step, label.label, label.name, thread=k))
                self._follow(pred, event)
            self.lanes[k] = event
            events.append(event)
        return events

    def _sync(self, node: int) -> None:
        """Make ``node`` a ``__syncthreads``: every thread's own events come before it, and all go on from it."""
        for event in self.lanes.values():
            self.graph.edge(event, node)
        self.synced, self.lanes = node, {}

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
        if any(len(locs) != len(dst_locs) for dst_locs, sources in pairs for locs in sources):
            self.graph.problems.append(violation_at(event, "size mismatch", "sources and destinations differ in size"))
            return node
        port = op.channel_type is ChannelKind.PORT and op.name not in (OpName.COPY, OpName.GET)
        if not port:
            event.writes = pairs
            return node
        channels = self._channels(tb, op)
        if not channels:
            self.graph.problems.append(violation_at(event, "missing channel", "a port put names no channel"))
            return node
        if op.name is OpName.READ_PUT_PACKETS:  # every thread reads the flags, then __syncthreads
            self._sync(node)
        # thread i puts the i-th destination over the i-th channel (and flushes it, for pwsf)
        channels = [channels[min(i, len(channels) - 1)] for i in range(len(pairs))]
        issues = self._per_thread(node, len(pairs), False)
        for pair, channel, issue in zip(pairs, channels, issues):
            proxy = self._proxy(gpu, tb, op, channel, issue, False)
            self.graph.events[proxy].writes = [pair]
            if op.name is OpName.READ_PUT_PACKETS:  # every thread saw the flags before thread 0 started the copy
                self.graph.events[proxy].packet_reads = event.packet_reads
        if op.name is not OpName.PUT_WITH_SIGNAL_AND_FLUSH:
            return node
        flushes = []
        for i, (channel, issue) in enumerate(zip(channels, issues)):
            done = self.graph.add(Event(gpu.id, tb.id, event.step, event.label + " flush", thread=i))
            self.graph.edge(issue, done)
            self.graph.edge(self.port_tail[(gpu.id, ChannelKind.PORT, channel)], done)
            flushes.append(done)
        self.lanes.update(enumerate(flushes[1:], start=1))
        return flushes[0]

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
        # events of one thread of one threadblock run in program order; matching adds edges, never events
        threadblocks = [(event.tb, event.thread) for event in self.graph.events]
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
        theirs = [p for c in self.plan.gpus[peer].channels if c.channel_type is kind for p in c.connected_to]
        back = [i for i, p in enumerate(theirs) if p == rank]
        return (peer, back[ordinal]) if ordinal < len(back) else (peer, None)

    def _match_barriers(self) -> None:
        graph = self.graph
        for (rank, barrier_id), per_tb in self.barriers.items():
            for k in range(max(len(events) for events in per_tb)):
                members = [events[k] for events in per_tb if k < len(events)]
                wanted = self._barrier_size(members[0])
                if len(members) != wanted:
                    why = f"barrier {barrier_id} round {k + 1} waits for {wanted} threadblocks; {len(members)} arrive"
                    for member in members:
                        graph.events[member].blocked = why
                    continue
                join = graph.add(Event(rank, None, None, f"gpu {rank} barrier {barrier_id} round {k + 1}"))
                for member in members:
                    graph.edge(member, join)
                    for after in self.after.get(member, ()):
                        graph.edge(join, after)

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
