"""Fuse a lifted receive with the copy, reduction and send that use its landing chunks (r, rcs, rrc, rrs, rrcs).

A receive lifted from a put lands in the chunks the put wrote (``lift_items``); the exporter's
plans then copy or reduce them and perhaps put the result on (``taccl_py.mscclpp.export``'s
table, read backwards). Where those steps follow the receive in its threadblock, over the same
chunk count, no other step of the rank touches the landing chunks and no other step waits for
one of the steps folded away, the group is one step of ours:

========================  ==========================================
r L; cpy L->D             r D            (then s D: rcs D)
r L; cpy L->D; s L        rcs D
r L; s L                  rcs L
r L; re D += L            rrc src D, dst D   (then s D: rrcs)
r L; cpy X->D; re D += L  rrc src X, dst D   (then s D: rrcs)
r L; re L += X; s L       rrs src X
r L; re L += X            rrc src X, dst L
========================  ==========================================

An ``rrcs`` whose sum lands in scratch that nothing else touches is an ``rrs``. Before all this,
a copy into scratch that only the send right after it reads (an LL plan's staging slot: ``cpkt``
or ``recpkt`` then ``rppkt``) folds into the send: ``cpy X->T; s T`` is ``s X``.

Folding a write nothing else reads changes no value, and the fused step takes the place of the
group's last step, so nothing runs earlier than before.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from taccl_py.ir.algorithm import Buffer, OpType, Step, Threadblock

__all__ = ["fuse_receives"]

Slot = tuple[Buffer, int]


def _chunks(step: Step) -> list[tuple[Buffer, int]]:
    found = []
    for used, buffer, offset in (
        (step.op.uses_src, step.src_buffer, step.src_offset),
        (step.op.uses_dst, step.dst_buffer, step.dst_offset),
    ):
        if used and buffer is not None:
            found += [(buffer, chunk) for chunk in range(offset, offset + step.count)]
    return found


def _match(steps: tuple[Step, ...], i: int) -> tuple[int, Step] | None:
    """Return (parts, fused step) for the group starting at receive ``i``, or None."""
    recv = steps[i]
    land: Slot = (recv.dst_buffer, recv.dst_offset)
    nxt = [s if s.count == recv.count else None for s in steps[i + 1 : i + 4]] + [None] * 3

    def src(s: Step | None) -> Slot | None:
        return None if s is None else (s.src_buffer, s.src_offset)

    def dst(s: Step | None) -> Slot | None:
        return None if s is None else (s.dst_buffer, s.dst_offset)

    def is_op(s: Step | None, op: OpType) -> bool:
        return s is not None and s.op is op

    def forward(parts: int, op: OpType, fused: Step) -> tuple[int, Step]:
        after = nxt[parts - 1]
        if is_op(after, OpType.SEND) and src(after) == dst(fused) and op is not OpType.RECV_REDUCE_SEND:
            sending = {OpType.RECV: OpType.RECV_COPY_SEND, OpType.RECV_REDUCE_COPY: OpType.RECV_REDUCE_COPY_SEND}
            return parts + 1, replace(fused, op=sending[op])
        return parts, fused

    a, b = nxt[0], nxt[1]
    if is_op(a, OpType.COPY) and src(a) == land and is_op(b, OpType.SEND) and src(b) == land:
        return 3, replace(recv, op=OpType.RECV_COPY_SEND, dst_buffer=a.dst_buffer, dst_offset=a.dst_offset)
    if is_op(a, OpType.COPY) and src(a) == land:
        return forward(2, OpType.RECV, replace(recv, dst_buffer=a.dst_buffer, dst_offset=a.dst_offset))
    if is_op(a, OpType.SEND) and src(a) == land:
        return 2, replace(recv, op=OpType.RECV_COPY_SEND)
    if is_op(a, OpType.REDUCE) and src(a) == land and dst(a) != land:
        fused = Step(OpType.RECV_REDUCE_COPY, a.dst_buffer, a.dst_offset, a.dst_buffer, a.dst_offset, recv.count)
        return forward(2, OpType.RECV_REDUCE_COPY, fused)
    if is_op(a, OpType.COPY) and is_op(b, OpType.REDUCE) and src(b) == land and dst(b) == dst(a) != land:
        if src(a) != land:
            fused = Step(OpType.RECV_REDUCE_COPY, a.src_buffer, a.src_offset, a.dst_buffer, a.dst_offset, recv.count)
            return forward(3, OpType.RECV_REDUCE_COPY, fused)
    if is_op(a, OpType.REDUCE) and dst(a) == land and src(a) != land:
        if is_op(b, OpType.SEND) and src(b) == land:
            return 3, Step(OpType.RECV_REDUCE_SEND, a.src_buffer, a.src_offset, count=recv.count)
        fused = Step(OpType.RECV_REDUCE_COPY, a.src_buffer, a.src_offset, land[0], land[1], recv.count)
        return 2, fused
    return None


def _fuse_one(tbs: list[Threadblock], position: int, touched: dict, waited: set) -> bool:
    """Fuse the first group of threadblock ``tbs[position]`` that may be fused; return True when one was."""
    tb = tbs[position]
    for i, step in enumerate(tb.steps):
        if step.op is not OpType.RECV or step.dst_buffer is None:
            continue
        found = _match(tb.steps, i)
        if found is None:
            continue
        parts, fused = found
        group = {(tb.id, j) for j in range(i, i + parts)}
        landing = [(step.dst_buffer, c) for c in range(step.dst_offset, step.dst_offset + step.count)]
        if any(touched[chunk] - group for chunk in landing) or any(
            (tb.id, j) in waited for j in range(i, i + parts - 1)
        ):
            continue
        if fused.op is OpType.RECV_REDUCE_COPY_SEND and _only_in(fused, Buffer.SCRATCH, touched, group):
            fused = Step(OpType.RECV_REDUCE_SEND, fused.src_buffer, fused.src_offset, count=fused.count)
        _replace_group(tbs, position, i, parts, fused)
        return True
    return False


def _only_in(step: Step, buffer: Buffer, touched: dict, group: set) -> bool:
    """Return True when ``step``'s dst chunks are in ``buffer`` and no step outside ``group`` touches them."""
    chunks = [(step.dst_buffer, c) for c in range(step.dst_offset, step.dst_offset + step.count)]
    return step.dst_buffer is buffer and not any(touched[chunk] - group for chunk in chunks)


def _fuse_staging(tbs: list[Threadblock], position: int, touched: dict, waited: set) -> bool:
    """Fold the first ``cpy X->T; s T`` of ``tbs[position]`` (T scratch, read by that send alone) into ``s X``."""
    tb = tbs[position]
    for i, (copy, send) in enumerate(zip(tb.steps, tb.steps[1:])):
        if copy.op is not OpType.COPY or send.op is not OpType.SEND or copy.count != send.count:
            continue
        if (send.src_buffer, send.src_offset) != (copy.dst_buffer, copy.dst_offset) or (tb.id, i) in waited:
            continue
        if _only_in(copy, Buffer.SCRATCH, touched, {(tb.id, i), (tb.id, i + 1)}):
            _replace_group(tbs, position, i, 2, replace(send, src_buffer=copy.src_buffer, src_offset=copy.src_offset))
            return True
    return False


def _replace_group(tbs: list[Threadblock], position: int, i: int, parts: int, fused: Step) -> None:
    """Put ``fused`` (depending on what the group did) for steps ``i .. i + parts - 1`` of ``tbs[position]``."""
    tb = tbs[position]
    depends = tuple(dict.fromkeys(d for j in range(i, i + parts) for d in tb.steps[j].depends))
    steps = tb.steps[:i] + (replace(fused, depends=depends),) + tb.steps[i + parts :]
    tbs[position] = replace(tb, steps=steps)
    for k, other in enumerate(tbs):
        renumbered = tuple(
            replace(s, depends=tuple((t, _moved(j, i, parts) if t == tb.id else j) for t, j in s.depends))
            for s in other.steps
        )
        tbs[k] = replace(tbs[k], steps=renumbered)


def _moved(j: int, start: int, parts: int) -> int:
    """Return where step ``j`` of a threadblock went when ``parts`` steps from ``start`` became one."""
    if j >= start + parts:
        return j - parts + 1
    return start if j >= start else j


def _index(tbs: list[Threadblock]) -> tuple[dict, set]:
    touched: dict = defaultdict(set)
    waited: set = set()
    for tb in tbs:
        for j, step in enumerate(tb.steps):
            for chunk in _chunks(step):
                touched[chunk].add((tb.id, j))
            waited.update(step.depends)
    return touched, waited


def fuse_receives(threadblocks: list[Threadblock]) -> list[Threadblock]:
    """Return one rank's threadblocks with each receive fused into the steps that use its landing chunks."""
    tbs = list(threadblocks)
    for fuse in (_fuse_staging, _fuse_one):
        for position in range(len(tbs)):
            while True:
                touched, waited = _index(tbs)
                if not fuse(tbs, position, touched, waited):
                    break
    return tbs
