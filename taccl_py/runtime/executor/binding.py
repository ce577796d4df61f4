"""Bind a RankPlan's rounds to element ranges once, then to each call's tensors by slicing.

A message longer than the segment size goes out as several messages of near-equal length (both
ends cut the same element count the same way, so they still match one to one, in order). A
computation is cut the same way — every one is elementwise — and each piece is tagged with the
last receive (in waiting order) whose memory it touches, so the executor reduces a segment as
soon as it arrived while later segments are still on the wire. Pieces keep their order in the
round: a piece never runs before an earlier one. On transports that match every message on its
own, the next round's leading sends also go out during a round, as soon as the data they carry is
final, so a segment travels on while the rest of its chunk is still arriving (a pipeline, as
gloo's own ring runs).

All of that is worked out in index space (:func:`bind_rounds`): a :data:`Range` is an element
range of one flat source (the call's output or input, or a buffer of the executor), and two
ranges overlap only within one source. It depends on no tensor, so an executor does it once per
aliasing form (see :mod:`taccl_py.runtime.executor.call_binding`); a call only slices its tensors
into the ranges' views and wraps them (:func:`views_of_rounds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from taccl_py.runtime.executor.rank_plan import RoundPlan, Span, Storage
from taccl_py.runtime.transports.interface import TAG_BASE, Message

__all__ = [
    "BoundRound",
    "IndexedRound",
    "Range",
    "RangeSlots",
    "bind_rounds",
    "overlaps",
    "views_of_rounds",
    "DEFAULT_SEGMENT_BYTES",
]

#: Longest message the executor posts on transports that progress messages one by one (gloo);
#: 1 MB keeps a reduction of one segment shorter than the transfer of the next on loopback TCP.
DEFAULT_SEGMENT_BYTES = 1 << 20

#: (source, first element, element after the last) of one flat buffer (see the module notes).
Range = tuple[int, int, int]
_Wire = tuple[int, int, Range]  # (peer, tag, range) of one message segment


@dataclass
class BoundRound:
    """One round over tensors; ``recvs`` ends with ``num_early`` segments of the next round."""

    index: int
    pre_waits: list[int]
    snapshots: list[tuple[Any, Any]]
    sends: list[Message]
    send_ids: list[int]  # the plan's send index of each segment
    send_steps: list[tuple[int, int, int]]  # (peer, threadblock, step) of each segment
    recvs: list[Message]
    recv_steps: list[tuple[int, int, int]]
    num_early: int
    send_waits: list[int]
    computes: list[tuple[Any, Any, Any, Any, int]]  # (target, source, source or None, staging, receive to wait for)
    eager: list[tuple[int, int]] | None = (
        None  # per leading send segment of the next round: (piece, receive) it waits for
    )


@dataclass
class IndexedRound:
    """A :class:`BoundRound` over slots (indices into a :class:`RangeSlots`' ranges) instead of tensors."""

    index: int
    pre_waits: list[int]
    snapshots: list[tuple[int, int]]
    sends: list[tuple[int, int, int]]  # (peer, tag, slot)
    send_ids: list[int]
    send_steps: list[tuple[int, int, int]]
    recvs: list[tuple[int, int, int]]
    recv_steps: list[tuple[int, int, int]]
    num_early: int
    send_waits: list[int]
    computes: list[tuple[int, int, int | None, tuple[int, ...] | None, int]]
    eager: list[tuple[int, int]] | None = None


class RangeSlots:
    """The distinct ranges of a binding, numbered in order of first use; staging ranges lie in ``staging_source``."""

    __slots__ = ("ranges", "staging_source", "staging_elems", "_slot")

    def __init__(self, staging_source: int) -> None:
        self.ranges: list[Range] = []
        self.staging_source = staging_source
        self.staging_elems = 0  # length of the staging buffer the ranges need
        self._slot: dict[Range, int] = {}

    def slot(self, rng: Range) -> int:
        """Return the slot of ``rng``, numbering it when new."""
        found = self._slot.get(rng)
        if found is None:
            found = self._slot[rng] = len(self.ranges)
            self.ranges.append(rng)
        return found

    def stage(self, length: int) -> int:
        """Return the slot of a fresh staging range of ``length`` elements."""
        start = self.staging_elems
        self.staging_elems += length
        return self.slot((self.staging_source, start, self.staging_elems))


def overlaps(a: Any, b: Any) -> bool:
    """Return True when two tensors share memory (byte ranges intersect)."""
    a_start, b_start = a.data_ptr(), b.data_ptr()
    return a_start < b_start + b.numel() * b.element_size() and b_start < a_start + a.numel() * a.element_size()


def _overlap(a: Range, b: Range) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _pieces(rng: Range, segment_elems: int | None) -> list[Range]:
    """Return ``rng`` cut as ``torch.tensor_split`` cuts it into segments of at most ``segment_elems``."""
    source, start, stop = rng
    length = stop - start
    if segment_elems is None or length <= segment_elems:
        return [rng]
    parts = math.ceil(length / segment_elems)
    size, longer = divmod(length, parts)  # the first `longer` pieces get one element more
    cuts = [start + index * size + min(index, longer) for index in range(parts + 1)]
    return [(source, a, b) for a, b in zip(cuts, cuts[1:])]


def _messages(ops: tuple, view: Any, segment_elems: int | None) -> tuple[list[_Wire], list[int], list[tuple]]:
    messages, owners, steps = [], [], []
    for op in ops:
        for piece in _pieces(view(op.span), segment_elems):
            messages.append((op.peer, TAG_BASE + op.channel, piece))
            owners.append(op.index)
            steps.append((op.peer, op.threadblock, op.step))
    return messages, owners, steps


def _computes(
    rnd: RoundPlan, view: Any, arrivals: list[Range], send_sources: list[Range], segment_elems: int | None
) -> list[tuple[Range, Range, Range | None, tuple[int, ...] | None, int]]:
    """Return the round's computation pieces, each with the last arrival it must wait for.

    A piece is (target, source a, source b or None, staging, last arrival): ``staging`` is None,
    or the lengths (elements) of the staging ranges the sources are copied into first.

    A piece that overwrites the source of a send the round waits for runs only after every
    receive of the round (then the send waits): waiting for a send while receives are still
    unwaited could deadlock on a transport that moves data only inside ``wait``.
    """
    bound = []
    ready_after, last = -1, len(arrivals) - 1
    for op in rnd.computes:
        target, sources = view(op.target), [view(s) for s in op.sources]
        # a source that partly overlaps its target is read into a copy before the target is written
        staged = any(span != op.target and span.overlaps(op.target) for span in op.sources)
        splits = (
            [[target], [[s] for s in sources]]
            if staged
            else [_pieces(target, segment_elems), [_pieces(s, segment_elems) for s in sources]]
        )
        for index, piece in enumerate(splits[0]):
            parts = [split[index] if not staged else split[0] for split in splits[1]]
            touched = [piece] + parts
            needs = max(
                (p for p, arrival in enumerate(arrivals) if any(_overlap(t, arrival) for t in touched)), default=-1
            )
            if any(_overlap(piece, source) for source in send_sources):
                needs = max(needs, last)
            ready_after = max(ready_after, needs)
            staging = tuple(part[2] - part[1] for part in parts) if staged else None
            bound.append((piece, parts[0], parts[1] if len(parts) > 1 else None, staging, ready_after))
    return bound


def _eager_sends(
    now_computes: list, now_recvs: list[_Wire], num_early: int, arrivals: list[Range], nxt: list[_Wire], snapshot: Any
) -> list[tuple[int, int]]:
    """Return, for the leading send segments of the next round, the last piece and receive of this one they need.

    Such a segment may go out during this round as soon as both are done: nothing later in the
    round writes its source (no piece, no receive, no receive posted ahead for the next round).
    Segments from a snapshot are taken at the next round's start and never go early; the list
    stops at the first segment that cannot go, so the order of sends per peer is kept.
    """
    ahead = [wire[2] for wire in now_recvs[len(now_recvs) - num_early :]]
    found = []
    for _peer, _tag, source in nxt:
        if snapshot is not None and _overlap(source, snapshot) or any(_overlap(source, r) for r in ahead):
            break
        piece = max((i for i, c in enumerate(now_computes) if _overlap(source, c[0])), default=-1)
        arrival = max((p for p, a in enumerate(arrivals) if _overlap(source, a)), default=-1)
        found.append((piece, arrival))
    return found


def bind_rounds(
    rounds: tuple[RoundPlan, ...],
    sources: dict[Storage, tuple[int, int]],
    chunk_elems: int,
    segment_elems: int | None,
    slots: RangeSlots,
    *,
    eager_sends: bool = False,
) -> list[IndexedRound]:
    """Return ``rounds`` over ranges of flat sources, numbered in ``slots``.

    ``sources`` maps each storage the plan uses to its (source, length in elements); a span's
    range is its chunks of ``chunk_elems`` elements there. ``segment_elems`` None posts every
    message whole (NCCL: one group per round anyway). ``eager_sends`` lets a round post the next
    round's leading sends as soon as their data is final (transports that match every message on
    its own only).
    """

    def view(span: Span) -> Range:
        return (sources[span.storage][0], span.offset * chunk_elems, (span.offset + span.count) * chunk_elems)

    send_source = {op.index: op.span for rnd in rounds for op in rnd.sends}
    wired: list[tuple[list[_Wire], list[_Wire], int, list, list[Range]]] = []
    indexed: list[IndexedRound] = []
    early_prev: list[_Wire] = []
    for rnd in rounds:
        sends, send_ids, send_steps = _messages(rnd.sends, view, segment_elems)
        own, _own_ids, own_steps = _messages(rnd.recvs, view, segment_elems)
        early, _early_ids, early_steps = _messages(rnd.early_recvs, view, segment_elems)
        arrivals = [wire[2] for wire in early_prev + own]
        pieces = _computes(rnd, view, arrivals, [view(send_source[i]) for i in rnd.send_waits], segment_elems)
        wired.append((sends, own + early, len(early), pieces, arrivals))
        indexed.append(
            IndexedRound(
                rnd.index,
                list(rnd.pre_waits),
                [(slots.slot(view(copy)), slots.slot(view(src))) for copy, src in rnd.snapshots],
                [(peer, tag, slots.slot(rng)) for peer, tag, rng in sends],
                send_ids,
                send_steps,
                [(peer, tag, slots.slot(rng)) for peer, tag, rng in own + early],
                own_steps + early_steps,
                len(early),
                list(rnd.send_waits),
                [_slotted(piece, slots) for piece in pieces],
            )
        )
        early_prev = early
    if eager_sends:
        snap = sources.get(Storage.SNAP)
        snapshot = (snap[0], 0, snap[1]) if snap is not None and snap[1] else None
        for now, (_s, recvs, num_early, pieces, arrivals), (nxt_sends, *_rest) in zip(indexed, wired, wired[1:]):
            now.eager = _eager_sends(pieces, recvs, num_early, arrivals, nxt_sends, snapshot)
    return indexed


def _slotted(piece: tuple, slots: RangeSlots) -> tuple[int, int, int | None, tuple[int, ...] | None, int]:
    target, a, b, staging, after = piece
    staged = None if staging is None else tuple(slots.stage(length) for length in staging)
    return slots.slot(target), slots.slot(a), None if b is None else slots.slot(b), staged, after


def views_of_rounds(rounds: list[IndexedRound], views: list[Any]) -> list[BoundRound]:
    """Return ``rounds`` over tensors: each slot replaced by its view in ``views`` (host work per slot use only)."""
    bound = []
    for rnd in rounds:
        computes = [
            (
                views[t],
                views[a],
                None if b is None else views[b],
                None if staging is None else tuple(views[s] for s in staging),
                after,
            )
            for t, a, b, staging, after in rnd.computes
        ]
        bound.append(
            BoundRound(
                rnd.index,
                rnd.pre_waits,
                [(views[d], views[s]) for d, s in rnd.snapshots],
                [Message(peer, tag, views[s]) for peer, tag, s in rnd.sends],
                rnd.send_ids,
                rnd.send_steps,
                [Message(peer, tag, views[s]) for peer, tag, s in rnd.recvs],
                rnd.recv_steps,
                rnd.num_early,
                rnd.send_waits,
                computes,
                rnd.eager,
            )
        )
    return bound
