"""Compile one rank's part of an Algorithm into a flat, replayable plan of rounds (chunk units).

The plan follows the round semantics of :mod:`taccl_py.ir.dataflow`: in round L a rank issues its
SENDs of round L (their source as it is at the start of the round), posts its RECVs of round L,
waits for them, then runs its COMPUTEs of round L in topological order. A RECV may meet a SEND its
peer issued in an earlier round. The dataflow's sends are buffered; real transports (NCCL above
all) are not, so each message goes on the wire in the round of its RECV on both ends — the
*wire round* — and both ends issue the messages of one round to one peer in the same order
(channel, then sequence number). Every message of a wire round is then matched inside that
round, so posting everything before waiting cannot deadlock.

Between a SEND's round and the end of its wire transfer its source must not change. The compiler
finds the first later write to an overlapping region on the rank: when it falls before the
transfer can safely be waited for (a RECV up to and including the wire round, or a COMPUTE
before it), the SEND copies its source to a private *snapshot* at its round; otherwise the plan
waits for the transfer right before that write (after the RECVs of a round completed, never
while posting), or at the end of the collective.

With ``prepost_receives`` (transports that match each message on its own) a RECV is posted one
round early when nothing on the rank touches its target in between; a send of an earlier round
still reading that target is then waited for at the start of the posting round (it was matched
in its own round, so that wait cannot deadlock).

Everything here is pure Python over chunk indices; :mod:`taccl_py.runtime.executor` binds it to
tensors.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from enum import Enum

from taccl_py.errors import ArgumentError, VerificationError
from taccl_py.ir.algorithm import Algorithm, Buffer, aliased_slot
from taccl_py.ir.collectives import Collective
from taccl_py.ir.dataflow import Action, ActionKind, Dataflow, Region, build_dataflow

__all__ = ["Storage", "Span", "WireOp", "ComputeOp", "RoundPlan", "RankPlan", "compile_rank_plan"]


class Storage(str, Enum):
    """Where a span lives on the rank: the collective's buffers or the plan's private ones."""

    INPUT = "input"
    OUTPUT = "output"
    SCRATCH = "scratch"
    TEMP = "temp"  # the per-step temporaries of rrs/rrc/rrcs
    SNAP = "snapshot"  # private copies of send sources


@dataclass(frozen=True)
class Span:
    """``count`` chunks of ``storage`` from chunk ``offset``."""

    storage: Storage
    offset: int
    count: int

    def overlaps(self, other: Span) -> bool:
        """Return True when both spans share a chunk of the same storage."""
        return (
            self.storage is other.storage
            and self.offset < other.offset + other.count
            and other.offset < self.offset + self.count
        )


@dataclass(frozen=True)
class WireOp:
    """One message to or from ``peer`` on ``channel`` (the transport's tag), with its origin step."""

    peer: int
    channel: int
    span: Span
    threadblock: int
    step: int
    index: int = 0  # sends: position in the plan's send list (for lazy waits)


@dataclass(frozen=True)
class ComputeOp:
    """Store the copy (one source) or the reduction (two sources) of ``sources`` into ``target``."""

    target: Span
    sources: tuple[Span, ...]
    threadblock: int
    step: int


@dataclass(frozen=True)
class RoundPlan:
    """What a rank does in one round, in order.

    ``pre_waits`` (sends of earlier rounds) are waited for first, ``snapshots`` (private copy,
    source) pairs copied next; then ``sends``, ``recvs`` and
    ``early_recvs`` (receives of the next round, posted ahead) are posted together; the round
    waits for the receives posted ahead for it by the previous round, then for its ``recvs``, then
    for the earlier sends listed in ``send_waits`` (indices into the plan's sends), then runs
    ``computes``.
    """

    index: int
    snapshots: tuple[tuple[Span, Span], ...]
    sends: tuple[WireOp, ...]
    recvs: tuple[WireOp, ...]
    send_waits: tuple[int, ...]
    computes: tuple[ComputeOp, ...]
    early_recvs: tuple[WireOp, ...] = ()
    pre_waits: tuple[int, ...] = ()


@dataclass(frozen=True)
class RankPlan:
    """One rank's compiled schedule: its buffer sizes in chunks and its non-empty rounds."""

    name: str
    collective: Collective
    rank: int
    num_ranks: int
    chunks_per_loop: int
    inplace: bool
    input_chunks: int
    output_chunks: int
    scratch_chunks: int
    temp_chunks: int
    snapshot_chunks: int
    rounds: tuple[RoundPlan, ...]
    num_sends: int
    final_send_waits: tuple[int, ...]
    writes_input: bool

    def chunks(self, storage: Storage) -> int:
        """Return how many chunks ``storage`` holds in this plan."""
        return {
            Storage.INPUT: self.input_chunks,
            Storage.OUTPUT: self.output_chunks,
            Storage.SCRATCH: self.scratch_chunks,
            Storage.TEMP: self.temp_chunks,
            Storage.SNAP: self.snapshot_chunks,
        }[storage]


def _data_chunks(algorithm: Algorithm) -> tuple[int, int]:
    """Return the (input, output) chunk counts of the buffers the plan keeps after aliasing."""
    layout = algorithm.layout
    if not algorithm.inplace:
        return layout.input_chunks, layout.output_chunks
    if algorithm.collective is Collective.ALLGATHER:
        return 0, layout.output_chunks
    return layout.input_chunks, 0


def _alias(algorithm: Algorithm, rank: int, buffer: Buffer, offset: int) -> tuple[Storage, int]:
    """Return the storage and chunk offset a buffer reference means after in-place aliasing."""
    if algorithm.inplace:
        buffer, offset = aliased_slot(algorithm, rank, buffer, offset)
    return {Buffer.INPUT: Storage.INPUT, Buffer.OUTPUT: Storage.OUTPUT, Buffer.SCRATCH: Storage.SCRATCH}[buffer], offset


@dataclass
class _Spans:
    """Maps dataflow regions of one rank to spans, allocating temporaries as they appear."""

    algorithm: Algorithm
    rank: int
    temps: dict[tuple[int, int], Span]
    temp_chunks: int = 0

    def span(self, region: Region) -> Span:
        if region.buffer is None:
            if region.temp not in self.temps:
                self.temps[region.temp] = Span(Storage.TEMP, self.temp_chunks, region.count)
                self.temp_chunks += region.count
            return self.temps[region.temp]
        storage, offset = _alias(self.algorithm, self.rank, region.buffer, region.offset)
        return Span(storage, offset, region.count)


def _sequence_numbers(actions: tuple[Action, ...]) -> dict[int, int]:
    """Return, for every SEND and RECV, its position among those on its (src, dst, channel)."""
    counters: dict[tuple, int] = defaultdict(int)
    seq: dict[int, int] = {}
    for action in actions:  # the dataflow matches the k-th send with the k-th receive in id order
        if action.kind is ActionKind.SEND:
            key = (action.rank, action.peer, action.channel)
        elif action.kind is ActionKind.RECV:
            key = (action.peer, action.rank, action.channel)
        else:
            continue
        seq[action.id] = counters[key]
        counters[key] += 1
    return seq


def _checked_dataflow(algorithm: Algorithm, rank: int, dataflow: Dataflow | None) -> Dataflow:
    if not 0 <= rank < algorithm.num_ranks:
        raise ArgumentError(
            algorithm.name, "rank", f"rank {rank} outside 0..{algorithm.num_ranks - 1}", "a rank of the algorithm"
        )
    flow = dataflow if dataflow is not None else build_dataflow(algorithm)
    if flow.violations or flow.rounds is None:
        raise VerificationError(algorithm.name, flow.violations)
    return flow


@dataclass
class _Write:
    round: int
    is_recv: bool
    span: Span


def _send_hazard(send_round: int, wire_round: int, source: Span, writes: list[_Write]) -> tuple[bool, int | None]:
    """Return (needs a snapshot, round after whose RECV wait the send must be waited, None = at the end)."""
    # Writes are in replay order; every write of the send's round or later comes after the send was
    # issued (a SEND that follows a COMPUTE or RECV is placed a round later by the dataflow).
    first = next((w for w in writes if w.round >= send_round and w.span.overlaps(source)), None)
    if first is None:
        return False, None
    if (first.is_recv and first.round <= wire_round) or (not first.is_recv and first.round < wire_round):
        return True, None
    return False, first.round - 1 if first.is_recv else first.round


def compile_rank_plan(
    algorithm: Algorithm, rank: int, dataflow: Dataflow | None = None, *, prepost_receives: bool = False
) -> RankPlan:
    """Return the flat plan that runs ``rank``'s part of ``algorithm`` under the round semantics.

    Parameters
    ----------
    algorithm : Algorithm
        A structurally sound algorithm (no unmatched transfers, no circular waits).
    rank : int
        The rank whose plan to build.
    dataflow : Dataflow, optional
        ``build_dataflow(algorithm)`` when the caller already has it (compiling every rank).
    prepost_receives : bool
        Post a receive one round early where nothing touches its target in between, so the data
        can land while this rank still computes. Only for transports that match every message on
        its own (gloo): under NCCL's grouped rounds an early receive would join the wrong group.

    Returns
    -------
    RankPlan
        Rounds in order (empty rounds left out), with buffer sizes in chunks.

    Raises
    ------
    ArgumentError
        ``rank`` is not a rank of the algorithm, or it has switch steps (in-network: no
        point-to-point transport runs them; callers hand such bands to the backend's collective).
    VerificationError
        The algorithm's structure is broken (the dataflow's violations).

    Examples
    --------
    >>> from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
    >>> I, O = Buffer.INPUT, Buffer.OUTPUT
    >>> algo = lower_plan("ag2", Collective.ALLGATHER, 2, 2, [
    ...     LocalCopy(0, (I, 0), (O, 0)), LocalCopy(1, (I, 0), (O, 1)),
    ...     Transfer(0, 1, (I, 0), (O, 0)), Transfer(1, 0, (I, 0), (O, 1))])
    >>> plan = compile_rank_plan(algo, 0)
    >>> [(len(r.sends), len(r.recvs), len(r.computes)) for r in plan.rounds]
    [(1, 1, 1)]
    """
    if algorithm.uses_switch:
        raise ArgumentError(
            algorithm.name,
            "step",
            "switch steps (NVLink SHARP multimem) cannot run over a point-to-point transport",
            "a point-to-point algorithm; the group's own collective (NCCL's NVLS) serves such a band",
        )
    flow = _checked_dataflow(algorithm, rank, dataflow)
    spans = _Spans(algorithm, rank, {})
    mine = [a for a in flow.actions_in_round_order() if a.rank == rank]
    writes = [
        _Write(flow.rounds[a.id], a.kind is ActionKind.RECV, spans.span(a.target))
        for a in mine
        if a.target is not None and a.kind is not ActionKind.SEND
    ]
    per_round, send_keys, snapshot_chunks = _place_actions(flow, mine, spans, writes)
    return _assemble(algorithm, rank, spans, snapshot_chunks, per_round, send_keys, writes, prepost_receives)


def _place_actions(
    flow: Dataflow, mine: list[Action], spans: _Spans, writes: list[_Write]
) -> tuple[dict, list[tuple], int]:
    """Put each action of the rank in its round; sends go to their wire round, snapshotted where needed.

    Returns the per-round parts, the sends as (wire round, peer, channel, sequence number, source,
    action, round to wait after) and the snapshot size in chunks.
    """
    rounds, seq = flow.rounds, _sequence_numbers(flow.actions)
    per_round: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    snapshot_chunks = 0
    send_keys: list[tuple] = []
    for action in mine:
        level = rounds[action.id]
        if action.kind is ActionKind.COMPUTE:
            if action.target is not None:  # a nop carries only dependencies
                sources = tuple(spans.span(region) for region in action.sources)
                per_round[level]["computes"].append(
                    ComputeOp(spans.span(action.target), sources, action.threadblock, action.step)
                )
        elif action.kind is ActionKind.RECV:
            key = (action.channel, seq[action.id])
            per_round[level]["recvs"].append(
                (key, WireOp(action.peer, action.channel, spans.span(action.target), action.threadblock, action.step))
            )
        else:
            source = spans.span(action.sources[0])
            wire_round = rounds[flow.match[action.id]]
            snapshot, wait_round = _send_hazard(level, wire_round, source, writes)
            if snapshot:
                copy = Span(Storage.SNAP, snapshot_chunks, source.count)
                snapshot_chunks += source.count
                per_round[level]["snapshots"].append((copy, source))
                source = copy
            send_keys.append((wire_round, action.peer, action.channel, seq[action.id], source, action, wait_round))
    return per_round, send_keys, snapshot_chunks


def _busy_spans(
    parts: dict,
    a: int,
    b: int,
    arriving: list[WireOp],
    sends: dict[int, tuple[Span, int]],
    waits: dict[int, tuple[str, int | None]],
) -> tuple[list[Span], dict[int, Span]]:
    """Return what rank-local work touches between round ``a``'s post and round ``b``'s receive wait.

    The second value holds the in-flight sends of rounds before ``a``: instead of blocking an early
    receive they can be waited for at the start of round ``a``.
    """
    now, after = parts[a], parts[b]
    busy = (
        [m.span for m in list(now["recvs"]) + arriving]
        + [c.target for c in now["computes"]]
        + [x for c in now["computes"] for x in c.sources]
    )
    busy += [source for _copy, source in after["snapshots"]] + [op.span for _key, op in after["sends"]]
    movable: dict[int, Span] = {}
    for index, (source, wire_round) in sends.items():
        kind, level = waits[index]
        if wire_round > a or (kind == "pre" and level <= a) or (kind == "after" and level < a):
            continue  # not yet issued, or already complete when round a posts
        if wire_round < a:
            movable[index] = source
        else:
            busy.append(source)
    return busy, movable


def _prepost(
    parts: dict, levels: list[int], sends: dict[int, tuple[Span, int]], waits: dict[int, tuple[str, int | None]]
) -> None:
    """Move each round's receives that nothing touches in between into the previous round's early list.

    A send of an earlier round whose source an early receive would overwrite is waited for at the
    start of the posting round instead (it was matched in its own round, so that cannot deadlock).
    Receives from one (peer, channel) keep their order: once one stays, the later ones stay too.
    """
    arriving: list[WireOp] = []
    for a, b in zip(levels, levels[1:]):
        busy, movable = _busy_spans(parts, a, b, arriving, sends, waits)
        early, late, blocked = [], [], set()
        for op in parts[b]["recvs"]:
            key = (op.peer, op.channel)
            if key in blocked or any(op.span.overlaps(span) for span in busy):
                blocked.add(key)
                late.append(op)
                continue
            early.append(op)
            for index, source in movable.items():
                if source.overlaps(op.span) and waits[index] != ("pre", a):
                    waits[index] = ("pre", a)
        parts[a]["early"], parts[b]["recvs"], arriving = early, late, early


def _assemble(
    algorithm: Algorithm,
    rank: int,
    spans: _Spans,
    snapshot_chunks: int,
    per_round: dict,
    send_keys: list[tuple],
    writes: list[_Write],
    prepost_receives: bool,
) -> RankPlan:
    """Order the wire sends, place the lazy waits (and receives posted ahead) and build the RankPlan."""
    send_keys.sort(key=lambda item: (item[0], item[1], item[2], item[3]))
    waits: dict[int, tuple[str, int | None]] = {}
    sources: dict[int, tuple[Span, int]] = {}
    for index, (wire_round, peer, channel, seq, source, action, wait_round) in enumerate(send_keys):
        per_round[wire_round]["sends"].append(
            ((peer, channel, seq), WireOp(peer, channel, source, action.threadblock, action.step, index))
        )
        waits[index] = ("final", None) if wait_round is None else ("after", wait_round)
        sources[index] = (source, wire_round)
    for kind, level in waits.values():
        if level is not None:
            per_round.setdefault(level, defaultdict(list))  # a round may hold nothing but this wait
    for parts in per_round.values():
        parts["recvs"] = [op for _key, op in sorted(parts["recvs"], key=lambda item: (item[1].peer, item[0]))]
    # every level here has work: an action, or a send wait (a round that loses all its receives
    # to the round before still waits for them, so levels are fixed before receives move)
    levels = sorted(per_round)
    if prepost_receives:
        _prepost(per_round, levels, sources, waits)
    for index, (kind, level) in waits.items():
        if kind != "final":
            per_round[level]["pre_waits" if kind == "pre" else "send_waits"].append(index)
    built = []
    for level in levels:
        parts = per_round[level]
        built.append(
            RoundPlan(
                level,
                tuple(parts["snapshots"]),
                tuple(op for _key, op in parts["sends"]),
                tuple(parts["recvs"]),
                tuple(sorted(parts["send_waits"])),
                tuple(parts["computes"]),
                tuple(parts["early"]),
                tuple(sorted(parts["pre_waits"])),
            )
        )
    input_chunks, output_chunks = _data_chunks(algorithm)
    program = algorithm.ranks[rank]
    return RankPlan(
        name=algorithm.name,
        collective=algorithm.collective,
        rank=rank,
        num_ranks=algorithm.num_ranks,
        chunks_per_loop=algorithm.chunks_per_loop,
        inplace=algorithm.inplace,
        input_chunks=input_chunks,
        output_chunks=output_chunks,
        scratch_chunks=program.scratch_chunks,
        temp_chunks=spans.temp_chunks,
        snapshot_chunks=snapshot_chunks,
        rounds=tuple(built),
        num_sends=len(send_keys),
        final_send_waits=tuple(i for i, (kind, _l) in sorted(waits.items()) if kind == "final"),
        writes_input=any(write.span.storage is Storage.INPUT for write in writes),
    )
