"""Lower an Algorithm to primitive actions, match sends with receives, and order them in rounds.

Every MSCCL step becomes one to three actions: a RECV, a COMPUTE (copy or sum into a region or a
per-step temporary) and a SEND. Sends are buffered (they complete without their receiver), so a
program deadlocks only when receives wait, in a cycle, on sends that cannot be issued.

Rounds are the replay order the verifier and the executor share. In round L a rank (1) issues its
SENDs of round L, snapshotting their source, (2) posts its RECVs of round L, (3) waits for them,
(4) runs its COMPUTEs of round L in topological order. Hence a SEND or RECV that follows a COMPUTE
or RECV goes one round later; everything else may share the round of its predecessor, and a RECV
is never in an earlier round than the SEND it matches.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass
from enum import Enum

from taccl_py.errors import Violation
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, Step, Threadblock

__all__ = ["ActionKind", "Region", "Action", "Dataflow", "build_dataflow"]


class ActionKind(str, Enum):
    """The three primitive actions a step decomposes into."""

    SEND = "send"
    RECV = "recv"
    COMPUTE = "compute"


@dataclass(frozen=True)
class Region:
    """``count`` chunks of a buffer from ``offset``, or of a step's temporary when ``buffer`` is None."""

    buffer: Buffer | None
    offset: int
    count: int
    temp: tuple[int, int] | None = None  # (threadblock, step) owning the temporary

    def chunks(self) -> range:
        """Return the chunk indices this region covers."""
        return range(self.offset, self.offset + self.count)


@dataclass(frozen=True)
class Action:
    """A primitive action of one rank; COMPUTE stores the sum of ``sources`` into ``target``."""

    id: int
    kind: ActionKind
    rank: int
    threadblock: int
    step: int
    sources: tuple[Region, ...] = ()
    target: Region | None = None
    peer: int | None = None
    channel: int = 0


@dataclass(frozen=True)
class Dataflow:
    """The actions of an algorithm with their precedence, matching and rounds.

    ``predecessors[i]`` are the actions that must finish before action i starts; ``match[i]`` is
    the SEND a RECV meets (and the RECV a SEND meets). ``rounds`` and ``order`` are None when the
    structure has violations (unmatched transfers, deadlock, bad references).
    """

    algorithm: Algorithm
    actions: tuple[Action, ...]
    predecessors: tuple[tuple[int, ...], ...]
    match: tuple[int | None, ...]
    violations: tuple[Violation, ...]
    rounds: tuple[int, ...] | None
    order: tuple[int, ...] | None

    @property
    def num_rounds(self) -> int:
        """Return the number of rounds (0 when the structure is broken)."""
        return 1 + max(self.rounds) if self.rounds else 0

    def actions_in_round_order(self) -> tuple[Action, ...]:
        """Return the actions sorted by (round, phase, topological position)."""
        if self.order is None or self.rounds is None:
            return ()
        phase = {ActionKind.SEND: 0, ActionKind.RECV: 1, ActionKind.COMPUTE: 2}
        position = {action_id: index for index, action_id in enumerate(self.order)}
        return tuple(sorted(self.actions, key=lambda a: (self.rounds[a.id], phase[a.kind], position[a.id])))


def _region(buffer: Buffer | None, offset: int, count: int) -> Region:
    return Region(buffer, offset, count)


def _decompose_step(
    rank: int, tb: Threadblock, index: int, step: Step
) -> list[tuple[ActionKind, tuple[Region, ...], Region | None, int | None]]:
    """Return (kind, sources, target, peer) for each action of ``step``, in execution order."""
    src = _region(step.src_buffer, step.src_offset, step.count)
    dst = _region(step.dst_buffer, step.dst_offset, step.count)
    temp = Region(None, 0, step.count, temp=(tb.id, index))
    op = step.op
    recv = (ActionKind.RECV, (), None, tb.recv_peer)
    if op is OpType.SEND:
        return [(ActionKind.SEND, (src,), None, tb.send_peer)]
    if op is OpType.RECV:
        return [(ActionKind.RECV, (), dst, tb.recv_peer)]
    if op is OpType.RECV_COPY_SEND:
        return [(ActionKind.RECV, (), dst, tb.recv_peer), (ActionKind.SEND, (dst,), None, tb.send_peer)]
    if op is OpType.RECV_REDUCE_SEND:
        return [
            (recv[0], (), temp, recv[3]),
            (ActionKind.COMPUTE, (temp, src), temp, None),
            (ActionKind.SEND, (temp,), None, tb.send_peer),
        ]
    if op is OpType.RECV_REDUCE_COPY:
        return [(recv[0], (), temp, recv[3]), (ActionKind.COMPUTE, (src, temp), dst, None)]
    if op is OpType.RECV_REDUCE_COPY_SEND:
        return [
            (recv[0], (), temp, recv[3]),
            (ActionKind.COMPUTE, (src, temp), dst, None),
            (ActionKind.SEND, (dst,), None, tb.send_peer),
        ]
    if op is OpType.COPY:
        return [(ActionKind.COMPUTE, (src,), dst, None)]
    if op is OpType.REDUCE:
        return [(ActionKind.COMPUTE, (dst, src), dst, None)]
    return []  # nop: only carries dependencies


@dataclass
class _Builder:
    actions: list[Action]
    preds: list[list[int]]
    violations: list[Violation]


def _structural_checks(algorithm: Algorithm, violations: list[Violation]) -> None:
    if len(algorithm.ranks) != algorithm.num_ranks:
        violations.append(
            Violation("structure", f"{len(algorithm.ranks)} rank programs for {algorithm.num_ranks} ranks")
        )
    for prog in algorithm.ranks:
        ids = [tb.id for tb in prog.threadblocks]
        if len(set(ids)) != len(ids):
            violations.append(Violation("structure", "threadblock id used twice", rank=prog.rank))
        for tb in prog.threadblocks:
            for index, step in enumerate(tb.steps):
                if step.op.sends and tb.send_peer is None:
                    violations.append(
                        Violation(
                            "structure", f"{step.op.value} on a threadblock with no send peer", prog.rank, tb.id, index
                        )
                    )
                if step.op.receives and tb.recv_peer is None:
                    violations.append(
                        Violation(
                            "structure",
                            f"{step.op.value} on a threadblock with no receive peer",
                            prog.rank,
                            tb.id,
                            index,
                        )
                    )
                for peer in (tb.send_peer, tb.recv_peer):
                    if peer is not None and not 0 <= peer < algorithm.num_ranks:
                        violations.append(Violation("structure", f"peer {peer} out of range", prog.rank, tb.id, index))
                for buffer, offset in ((step.src_buffer, step.src_offset), (step.dst_buffer, step.dst_offset)):
                    if buffer is not None and not (0 <= offset and offset + step.count <= prog.chunks(buffer)):
                        violations.append(
                            Violation(
                                "out of bounds",
                                f"{buffer.value}[{offset}:{offset + step.count}] outside {prog.chunks(buffer)} chunks",
                                prog.rank,
                                tb.id,
                                index,
                            )
                        )


def _add_actions(algorithm: Algorithm, builder: _Builder) -> dict[tuple[int, int, int], tuple[int, int]]:
    """Create the actions with program-order edges; return (rank, tb, step) -> (first, last) action id."""
    span: dict[tuple[int, int, int], tuple[int, int]] = {}
    for prog in algorithm.ranks:
        for tb in prog.threadblocks:
            previous_last: int | None = None
            for index, step in enumerate(tb.steps):
                parts = _decompose_step(prog.rank, tb, index, step)
                if not parts:  # nop: a COMPUTE with nothing to do keeps dependencies explicit
                    parts = [(ActionKind.COMPUTE, (), None, None)]
                first = len(builder.actions)
                for kind, sources, target, peer in parts:
                    action_id = len(builder.actions)
                    builder.actions.append(
                        Action(action_id, kind, prog.rank, tb.id, index, sources, target, peer, tb.channel)
                    )
                    builder.preds.append([action_id - 1] if action_id > first else [])
                if previous_last is not None:
                    builder.preds[first].append(previous_last)
                previous_last = len(builder.actions) - 1
                span[(prog.rank, tb.id, index)] = (first, previous_last)
    return span


def _add_dependencies(
    algorithm: Algorithm, span: dict[tuple[int, int, int], tuple[int, int]], builder: _Builder
) -> None:
    for prog in algorithm.ranks:
        for tb in prog.threadblocks:
            for index, step in enumerate(tb.steps):
                for dep_tb, dep_step in step.depends:
                    target = span.get((prog.rank, dep_tb, dep_step))
                    if target is None:
                        builder.violations.append(
                            Violation(
                                "bad dependency",
                                f"depends on missing tb {dep_tb} step {dep_step}",
                                prog.rank,
                                tb.id,
                                index,
                            )
                        )
                        continue
                    builder.preds[span[(prog.rank, tb.id, index)][0]].append(target[1])


def _match_transfers(actions: list[Action], violations: list[Violation]) -> list[int | None]:
    """Pair the k-th SEND on (src, dst, channel) with the k-th RECV there."""
    sends: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for action in actions:  # actions of one threadblock are in program order
        if action.peer is None:
            continue  # reported by the structural checks
        if action.kind is ActionKind.SEND:
            sends[(action.rank, action.peer, action.channel)].append(action.id)
        elif action.kind is ActionKind.RECV:
            recvs[(action.peer, action.rank, action.channel)].append(action.id)
    match: list[int | None] = [None] * len(actions)
    for key in sorted(set(sends) | set(recvs)):
        s_ids, r_ids = sends.get(key, []), recvs.get(key, [])
        for s_id, r_id in zip(s_ids, r_ids):
            match[s_id], match[r_id] = r_id, s_id
            sent, received = actions[s_id].sources[0].count, actions[r_id].target.count
            if sent != received:
                violations.append(
                    Violation(
                        "size mismatch",
                        f"receives {received} chunks from rank {key[0]} which sends {sent}",
                        actions[r_id].rank,
                        actions[r_id].threadblock,
                        actions[r_id].step,
                    )
                )
        for s_id in s_ids[len(r_ids) :]:
            a = actions[s_id]
            violations.append(
                Violation(
                    "unmatched send",
                    f"send to rank {a.peer} on channel {a.channel} is never received",
                    a.rank,
                    a.threadblock,
                    a.step,
                )
            )
        for r_id in r_ids[len(s_ids) :]:
            a = actions[r_id]
            violations.append(
                Violation(
                    "unmatched receive",
                    f"receive from rank {a.peer} on channel {a.channel} has no matching send",
                    a.rank,
                    a.threadblock,
                    a.step,
                )
            )
    return match


def _topological_order(preds: list[list[int]]) -> tuple[list[int], set[int]]:
    """Return a topological order (Kahn, smallest id first) and the ids left in cycles."""
    succs: list[list[int]] = [[] for _ in preds]
    indegree = [len(p) for p in preds]
    for node, node_preds in enumerate(preds):
        for pred in node_preds:
            succs[pred].append(node)
    ready = deque(node for node, degree in enumerate(indegree) if degree == 0)
    order: list[int] = []
    while ready:
        node = ready.popleft()
        order.append(node)
        for succ in succs[node]:
            indegree[succ] -= 1
            if indegree[succ] == 0:
                ready.append(succ)
    return order, {node for node, degree in enumerate(indegree) if degree > 0}


def _describe_deadlock(actions: list[Action], preds: list[list[int]], stuck: set[int]) -> Violation:
    """Return a violation naming one cycle of waits among the ``stuck`` actions."""
    node = min(stuck)
    seen: dict[int, int] = {}
    path: list[int] = []
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(p for p in preds[node] if p in stuck)
    cycle = path[seen[node] :]
    words = [
        f"rank {actions[i].rank} tb {actions[i].threadblock} step {actions[i].step} ({actions[i].kind.value})"
        for i in reversed(cycle)
    ]
    first = actions[cycle[-1]]
    return Violation(
        "deadlock",
        "circular wait: " + " waits on ".join(words[::-1] + words[-1:]),
        first.rank,
        first.threadblock,
        first.step,
    )


def _assign_rounds(actions: list[Action], preds: list[list[int]], order: list[int]) -> list[int]:
    rounds = [0] * len(actions)
    for node in order:
        kind = actions[node].kind
        level = 0
        for pred in preds[node]:
            pred_kind = actions[pred].kind
            # a transfer reads state at the start of its round: after a RECV or COMPUTE it waits a round
            delay = 1 if kind is not ActionKind.COMPUTE and pred_kind is not ActionKind.SEND else 0
            level = max(level, rounds[pred] + delay)
        rounds[node] = level
    return rounds


def build_dataflow(algorithm: Algorithm) -> Dataflow:
    """Return the actions of ``algorithm`` with precedence, send/receive matching and rounds.

    Structural faults (a step on a threadblock without the peer it needs, an out-of-range chunk,
    an unmatched send or receive, a size mismatch, a missing dependency, a circular wait) are
    returned in ``violations``; ``rounds`` is then None.
    """
    builder = _Builder([], [], [])
    _structural_checks(algorithm, builder.violations)
    span = _add_actions(algorithm, builder)
    _add_dependencies(algorithm, span, builder)
    match = _match_transfers(builder.actions, builder.violations)
    for action in builder.actions:
        if action.kind is ActionKind.RECV and match[action.id] is not None:
            builder.preds[action.id].append(match[action.id])
    order, stuck = _topological_order(builder.preds)
    if stuck:
        builder.violations.append(_describe_deadlock(builder.actions, builder.preds, stuck))
    rounds = None if builder.violations else tuple(_assign_rounds(builder.actions, builder.preds, order))
    return Dataflow(
        algorithm=algorithm,
        actions=tuple(builder.actions),
        predecessors=tuple(tuple(p) for p in builder.preds),
        match=tuple(match),
        violations=tuple(builder.violations),
        rounds=rounds,
        order=tuple(order) if rounds is not None else None,
    )
