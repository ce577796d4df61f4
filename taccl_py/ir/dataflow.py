"""Lower an Algorithm to primitive actions, match sends with receives, and order them in rounds.

Every MSCCL step becomes one to three actions: a RECV, a COMPUTE (copy or sum into a region or a
per-step temporary) and a SEND. Sends are buffered (they complete without their receiver), so a
program deadlocks only when receives wait, in a cycle, on sends that cannot be issued.

A switch step (``mrs``, ``ms``) becomes one SWITCH_REDUCE or SWITCH_STORE action whose ``group``
lists the ranks it reads (a reduction reads ``sources`` on every member) and writes (``target`` on
every member). The members' actions of one group step (``taccl_py.ir.algorithm``) are joined by
two barriers: each waits for what precedes every member's action, and whatever follows one of
them waits for all of them.

Rounds are the replay order the verifier and the executor share. In round L a rank (1) issues its
SENDs of round L, snapshotting their source, (2) posts its RECVs of round L, (3) waits for them,
(4) runs its COMPUTEs of round L in topological order. Hence a SEND or RECV that follows a COMPUTE
or RECV goes one round later; everything else may share the round of its predecessor, and a RECV
is never in an earlier round than the SEND it matches.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from enum import Enum

import numpy as np

from taccl_py.errors import Violation
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, Step, Threadblock

__all__ = ["ActionKind", "Region", "Action", "Dataflow", "build_dataflow"]


class ActionKind(str, Enum):
    """The three primitive actions a step decomposes into."""

    SEND = "send"
    RECV = "recv"
    COMPUTE = "compute"
    SWITCH_REDUCE = "switch-reduce"
    SWITCH_STORE = "switch-store"

    @property
    def is_switch(self) -> bool:
        """Return True for an action that reads or writes other ranks' memory through a switch."""
        return self in (ActionKind.SWITCH_REDUCE, ActionKind.SWITCH_STORE)


@dataclass(frozen=True, slots=True)
class Region:
    """``count`` chunks of a buffer from ``offset``, or of a step's temporary when ``buffer`` is None."""

    buffer: Buffer | None
    offset: int
    count: int
    temp: tuple[int, int] | None = None  # (threadblock, step) owning the temporary

    def chunks(self) -> range:
        """Return the chunk indices this region covers."""
        return range(self.offset, self.offset + self.count)


@dataclass(frozen=True, slots=True)
class Action:
    """A primitive action of one rank; COMPUTE stores the sum of ``sources`` into ``target``.

    A switch action reads ``sources`` (SWITCH_REDUCE: on every rank of ``group``, summed;
    SWITCH_STORE: its own) and writes ``target`` on every rank of ``group``.
    """

    id: int
    kind: ActionKind
    rank: int
    threadblock: int
    step: int
    sources: tuple[Region, ...] = ()
    target: Region | None = None
    peer: int | None = None
    channel: int = 0
    group: tuple[int, ...] = ()


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
        phase = {ActionKind.SEND: 0, ActionKind.RECV: 1}  # COMPUTEs and switch actions last
        position = [0] * len(self.actions)
        for index, action_id in enumerate(self.order):
            position[action_id] = index
        rounds = self.rounds
        return tuple(sorted(self.actions, key=lambda a: (rounds[a.id], phase.get(a.kind, 2), position[a.id])))


_Part = tuple[ActionKind, tuple[Region, ...], Region | None, int | None]
_NOP_PARTS: tuple[_Part, ...] = ((ActionKind.COMPUTE, (), None, None),)


def _interned(regions: dict[tuple, Region], buffer: Buffer | None, offset: int, count: int, temp=None) -> Region:
    """Return the one ``Region`` of a build with these fields (they recur on every rank)."""
    key = (buffer, offset, count, temp)
    region = regions.get(key)
    if region is None:
        region = regions[key] = Region(buffer, offset, count, temp)
    return region


def _decompose_step(tb: Threadblock, index: int, step: Step, regions: dict[tuple, Region]) -> list[_Part]:
    """Return (kind, sources, target, peer) for each action of ``step``, in execution order.

    ``regions`` interns the regions of one build: one object per distinct region keeps the
    build's memory, and the garbage collector's work, small on large programs.
    """
    op = step.op
    if op is OpType.NOP:
        return []  # nop: only carries dependencies
    if op is OpType.SEND:
        src = _interned(regions, step.src_buffer, step.src_offset, step.count)
        return [(ActionKind.SEND, (src,), None, tb.send_peer)]
    if op.switches:
        src = _interned(regions, step.src_buffer, step.src_offset, step.count)
        dst = _interned(regions, step.dst_buffer, step.dst_offset, step.count)
        kind = ActionKind.SWITCH_REDUCE if op is OpType.SWITCH_REDUCE_STORE else ActionKind.SWITCH_STORE
        return [(kind, (src,), dst, None)]
    dst = _interned(regions, step.dst_buffer, step.dst_offset, step.count)
    if op is OpType.RECV:
        return [(ActionKind.RECV, (), dst, tb.recv_peer)]
    if op is OpType.RECV_COPY_SEND:
        return [(ActionKind.RECV, (), dst, tb.recv_peer), (ActionKind.SEND, (dst,), None, tb.send_peer)]
    src = _interned(regions, step.src_buffer, step.src_offset, step.count)
    if op is OpType.COPY:
        return [(ActionKind.COMPUTE, (src,), dst, None)]
    if op is OpType.REDUCE:
        return [(ActionKind.COMPUTE, (dst, src), dst, None)]
    temp = _interned(regions, None, 0, step.count, (tb.id, index))
    recv = (ActionKind.RECV, (), temp, tb.recv_peer)
    if op is OpType.RECV_REDUCE_SEND:
        return [recv, (ActionKind.COMPUTE, (temp, src), temp, None), (ActionKind.SEND, (temp,), None, tb.send_peer)]
    if op is OpType.RECV_REDUCE_COPY:
        return [recv, (ActionKind.COMPUTE, (src, temp), dst, None)]
    return [recv, (ActionKind.COMPUTE, (src, temp), dst, None), (ActionKind.SEND, (dst,), None, tb.send_peer)]


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
        sizes = {buffer: prog.chunks(buffer) for buffer in Buffer}
        for tb in prog.threadblocks:
            bad_peers = [p for p in (tb.send_peer, tb.recv_peer) if p is not None and not 0 <= p < algorithm.num_ranks]
            _check_switch_group(algorithm, prog.rank, tb, violations)
            for index, step in enumerate(tb.steps):
                if tb.send_peer is None and step.op.sends:
                    violations.append(
                        Violation(
                            "structure", f"{step.op.value} on a threadblock with no send peer", prog.rank, tb.id, index
                        )
                    )
                if tb.recv_peer is None and step.op.receives:
                    violations.append(
                        Violation(
                            "structure",
                            f"{step.op.value} on a threadblock with no receive peer",
                            prog.rank,
                            tb.id,
                            index,
                        )
                    )
                for peer in bad_peers:
                    violations.append(Violation("structure", f"peer {peer} out of range", prog.rank, tb.id, index))
                for buffer, offset in ((step.src_buffer, step.src_offset), (step.dst_buffer, step.dst_offset)):
                    if buffer is not None and not (0 <= offset and offset + step.count <= sizes[buffer]):
                        violations.append(
                            Violation(
                                "out of bounds",
                                f"{buffer.value}[{offset}:{offset + step.count}] outside {sizes[buffer]} chunks",
                                prog.rank,
                                tb.id,
                                index,
                            )
                        )


def _check_switch_group(algorithm: Algorithm, rank: int, tb: Threadblock, violations: list[Violation]) -> None:
    """Report a switch step without a group, and a group that is unsorted, out of range or lacks the rank."""
    group = tb.switch_group
    switching = [index for index, step in enumerate(tb.steps) if step.op.switches]
    if switching and not group:
        violations.append(
            Violation(
                "structure", f"{tb.steps[switching[0]].op.value} on a threadblock with no switch group", rank, tb.id
            )
        )
    if group and (
        list(group) != sorted(set(group)) or rank not in group or not all(0 <= r < algorithm.num_ranks for r in group)
    ):
        violations.append(
            Violation(
                "structure",
                f"switch group {list(group)}: expected distinct ranks in increasing order, this rank among them",
                rank,
                tb.id,
            )
        )


def _add_actions(algorithm: Algorithm, builder: _Builder) -> dict[tuple[int, int, int], tuple[int, int]]:
    """Create the actions with program-order edges; return (rank, tb, step) -> (first, last) action id."""
    span: dict[tuple[int, int, int], tuple[int, int]] = {}
    actions, preds = builder.actions, builder.preds
    regions: dict[tuple, Region] = {}
    for prog in algorithm.ranks:
        rank = prog.rank
        for tb in prog.threadblocks:
            previous_last: int | None = None
            for index, step in enumerate(tb.steps):
                # a nop is a COMPUTE with nothing to do, which keeps its dependencies explicit
                parts = _decompose_step(tb, index, step, regions) or _NOP_PARTS
                first = len(actions)
                preds.append([] if previous_last is None else [previous_last])
                group = tb.switch_group if parts[0][0].is_switch else ()
                actions.append(Action(first, parts[0][0], rank, tb.id, index, *parts[0][1:], tb.channel, group))
                for kind, sources, target, peer in parts[1:]:
                    action_id = len(actions)
                    actions.append(Action(action_id, kind, rank, tb.id, index, sources, target, peer, tb.channel))
                    preds.append([action_id - 1])
                previous_last = len(actions) - 1
                span[(rank, tb.id, index)] = (first, previous_last)
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


def _group_switch_steps(actions: list[Action], violations: list[Violation]) -> list[list[int]]:
    """Return the actions of each group step: the k-th switch action on (group, channel) of every member.

    Reports a rank with two threadblocks on one (group, channel), and members whose counts of
    switch steps there differ (a group step some member never reaches).
    """
    by_member: dict[tuple[tuple[int, ...], int], dict[int, list[int]]] = defaultdict(dict)
    owner: dict[tuple[tuple[int, ...], int, int], int] = {}
    for action in actions:  # actions of one threadblock are in program order
        if not action.kind.is_switch or not action.group:
            continue
        key = (action.group, action.channel)
        first_tb = owner.setdefault((*key, action.rank), action.threadblock)
        if first_tb != action.threadblock:
            violations.append(
                Violation(
                    "structure",
                    f"threadblocks {first_tb} and {action.threadblock} both run switch steps on group "
                    f"{list(action.group)} channel {action.channel}",
                    action.rank,
                    action.threadblock,
                    action.step,
                )
            )
            continue
        by_member[key].setdefault(action.rank, []).append(action.id)
    steps: list[list[int]] = []
    for (group, channel), members in sorted(by_member.items()):
        counts = {rank: len(members.get(rank, ())) for rank in group}
        if len(set(counts.values())) > 1:
            most = max(counts.values())
            rank = min(r for r, c in counts.items() if c < most)
            violations.append(
                Violation(
                    "unmatched switch step",
                    f"{counts[rank]} switch steps on group {list(group)} channel {channel} where another member has "
                    f"{most}",
                    rank,
                )
            )
            continue
        steps.extend([members[rank][k] for rank in group] for k in range(counts[group[0]]))
    return steps


def _add_switch_barriers(steps: list[list[int]], preds: list[list[int]]) -> None:
    """Join each group step's actions by the two barriers the module docstring describes."""
    step_of = {action: index for index, members in enumerate(steps) for action in members}
    for members in steps:  # before: every member waits for what precedes each member
        before = sorted({p for action in members for p in preds[action] if step_of.get(p) != step_of[action]})
        for action in members:
            preds[action] = list(before)
    for action_preds in preds:  # after: a successor of one member waits for all of them
        joined = [m for p in action_preds if p in step_of for m in steps[step_of[p]]]
        if joined:
            action_preds[:] = sorted(set(action_preds) | set(joined))


def _successors(preds: list[list[int]]) -> tuple[list[int], list[int]]:
    """Return (targets, offsets): the successors of node i are ``targets[offsets[i]:offsets[i + 1]]``.

    Successors come in increasing id order. Two flat lists instead of one list per node keep a
    large program's build from allocating (and the garbage collector from scanning) many lists.
    """
    counts = [len(p) for p in preds]
    dst = np.repeat(np.arange(len(preds), dtype=np.int64), counts)
    src = np.fromiter((p for node_preds in preds for p in node_preds), dtype=np.int64, count=len(dst))
    targets = dst[np.argsort(src, kind="stable")].tolist()
    offsets = np.zeros(len(preds) + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=len(preds)), out=offsets[1:])
    return targets, offsets.tolist()


def _topological_order(preds: list[list[int]]) -> tuple[list[int], set[int]]:
    """Return a topological order (Kahn, smallest id first) and the ids left in cycles."""
    targets, offsets = _successors(preds)
    indegree = [len(p) for p in preds]
    # ``order`` is also the FIFO queue: a for loop over a growing list visits the appended items.
    order = [node for node, degree in enumerate(indegree) if degree == 0]
    for node in order:
        for succ in targets[offsets[node] : offsets[node + 1]]:
            indegree[succ] -= 1
            if indegree[succ] == 0:
                order.append(succ)
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
    send, recv = ActionKind.SEND, ActionKind.RECV
    kinds = [action.kind for action in actions]
    for node in order:
        # a transfer reads state at the start of its round: after a RECV or COMPUTE it waits a round;
        # switch actions run with the COMPUTEs, in topological order
        transfer = kinds[node] is send or kinds[node] is recv
        level = 0
        for pred in preds[node]:
            here = rounds[pred] + 1 if transfer and kinds[pred] is not send else rounds[pred]
            if here > level:
                level = here
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
    _add_switch_barriers(_group_switch_steps(builder.actions, builder.violations), builder.preds)
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
