"""Bind a RankPlan's rounds to tensor views: messages cut into segments, computes ordered by arrival.

A message longer than the segment size goes out as several messages of near-equal length (both
ends cut the same element count the same way, so they still match one to one, in order). A
computation is cut the same way — every one is elementwise — and each piece is tagged with the
last receive (in waiting order) whose memory it touches, so the executor reduces a segment as
soon as it arrived while later segments are still on the wire. Pieces keep their order in the
round: a piece never runs before an earlier one. On transports that match every message on its
own, the next round's leading sends also go out during a round, as soon as the data they carry is
final, so a segment travels on while the rest of its chunk is still arriving (a pipeline, as
gloo's own ring runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from taccl_py.runtime.executor.rank_plan import RoundPlan, Span, Storage
from taccl_py.runtime.transports.interface import TAG_BASE, Message

__all__ = ["BoundRound", "bind_rounds", "overlaps", "DEFAULT_SEGMENT_BYTES"]

#: Longest message the executor posts on transports that progress messages one by one (gloo);
#: 1 MB keeps a reduction of one segment shorter than the transfer of the next on loopback TCP.
DEFAULT_SEGMENT_BYTES = 1 << 20


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


def overlaps(a: Any, b: Any) -> bool:
    """Return True when two tensors share memory (byte ranges intersect)."""
    a_start, b_start = a.data_ptr(), b.data_ptr()
    return a_start < b_start + b.numel() * b.element_size() and b_start < a_start + a.numel() * a.element_size()


def _pieces(tensor: Any, segment_elems: int | None) -> list[Any]:
    if segment_elems is None or tensor.numel() <= segment_elems:
        return [tensor]
    return list(tensor.tensor_split(math.ceil(tensor.numel() / segment_elems)))


def _messages(
    ops: tuple, view: Any, segment_elems: int | None
) -> tuple[list[Message], list[int], list[tuple[int, int, int]]]:
    messages, owners, steps = [], [], []
    for op in ops:
        for piece in _pieces(view(op.span), segment_elems):
            messages.append(Message(op.peer, TAG_BASE + op.channel, piece))
            owners.append(op.index)
            steps.append((op.peer, op.threadblock, op.step))
    return messages, owners, steps


def _computes(
    rnd: RoundPlan, view: Any, arrivals: list[Any], send_sources: list[Any], segment_elems: int | None
) -> list[tuple[Any, Any, Any, Any, int]]:
    """Return the round's computation pieces, each with the last arrival it must wait for.

    A piece is (target, source a, source b or None, staging, last arrival): ``staging`` is None,
    or the buffers (allocated here, once per binding) the sources are copied into first.

    A piece that overwrites the source of a send the round waits for runs only after every
    receive of the round (then the send waits): waiting for a send while receives are still
    unwaited could deadlock on a transport that moves data only inside ``wait``.
    """
    bound: list[tuple[Any, Any, Any, Any, int]] = []
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
                (p for p, arrival in enumerate(arrivals) if any(overlaps(t, arrival) for t in touched)), default=-1
            )
            if any(overlaps(piece, source) for source in send_sources):
                needs = max(needs, last)
            ready_after = max(ready_after, needs)
            staging = tuple(part.new_empty(part.shape) for part in parts) if staged else None
            bound.append((piece, parts[0], parts[1] if len(parts) > 1 else None, staging, ready_after))
    return bound


def _eager_sends(now: BoundRound, arrivals: list[Any], nxt: BoundRound, snapshot_storage: Any) -> list[tuple[int, int]]:
    """Return, for the leading send segments of ``nxt``, the last piece and receive of ``now`` they need.

    Such a segment may go out during ``now`` as soon as both are done: nothing later in ``now``
    writes its source (no piece, no receive of ``now``, no receive posted ahead for ``nxt``).
    Segments from a snapshot are taken at ``nxt``'s start and never go early; the list stops at
    the first segment that cannot go, so the order of sends per peer is kept.
    """
    ahead = [m.tensor for m in now.recvs[len(now.recvs) - now.num_early :]]
    found = []
    for message in nxt.sends:
        source = message.tensor
        if (
            snapshot_storage is not None
            and overlaps(source, snapshot_storage)
            or any(overlaps(source, r) for r in ahead)
        ):
            break
        piece = max((i for i, c in enumerate(now.computes) if overlaps(source, c[0])), default=-1)
        arrival = max((p for p, a in enumerate(arrivals) if overlaps(source, a)), default=-1)
        found.append((piece, arrival))
    return found


def bind_rounds(
    rounds: tuple[RoundPlan, ...],
    storages: dict[Storage, Any],
    chunk_elems: int,
    segment_bytes: int | None,
    element_size: int,
    *,
    eager_sends: bool = False,
) -> list[BoundRound]:
    """Return ``rounds`` over the flat tensors in ``storages`` (chunks of ``chunk_elems`` elements).

    ``segment_bytes`` None posts every message whole (NCCL: one group per round anyway).
    ``eager_sends`` lets a round post the next round's leading sends as soon as their data is
    final (transports that match every message on its own only).
    """
    segment_elems = None if segment_bytes is None else max(1, segment_bytes // element_size)

    def view(span: Span) -> Any:
        return storages[span.storage][span.offset * chunk_elems : (span.offset + span.count) * chunk_elems]

    send_source = {op.index: op.span for rnd in rounds for op in rnd.sends}
    bound: list[BoundRound] = []
    arrivals_of: list[list[Any]] = []
    early_prev: list[Message] = []
    for rnd in rounds:
        sends, send_ids, send_steps = _messages(rnd.sends, view, segment_elems)
        own, _own_ids, own_steps = _messages(rnd.recvs, view, segment_elems)
        early, _early_ids, early_steps = _messages(rnd.early_recvs, view, segment_elems)
        arrivals_of.append([m.tensor for m in early_prev + own])
        bound.append(
            BoundRound(
                rnd.index,
                list(rnd.pre_waits),
                [(view(copy), view(src)) for copy, src in rnd.snapshots],
                sends,
                send_ids,
                send_steps,
                own + early,
                own_steps + early_steps,
                len(early),
                list(rnd.send_waits),
                _computes(rnd, view, arrivals_of[-1], [view(send_source[i]) for i in rnd.send_waits], segment_elems),
            )
        )
        early_prev = early
    if eager_sends:
        snapshots = storages.get(Storage.SNAP)
        snapshots = snapshots if snapshots is not None and snapshots.numel() else None
        for now, arrivals, nxt in zip(bound, arrivals_of, bound[1:]):
            now.eager = _eager_sends(now, arrivals, nxt, snapshots)
    return bound
