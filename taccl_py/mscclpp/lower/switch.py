"""Switch steps (``mrs``, ``ms``) as MSCCL++ switch-channel ops, and the barriers of their group steps.

A switch step becomes one op on a *switch channel* (NVLS multicast memory bound to one buffer of
every member of a group; ``python/mscclpp/language/channel.py`` ``SwitchChannel``):

======  =========================================================================================
mrs     ``glres`` (``multimem.ld_reduce`` + ``multimem.st``): src and dst are switch refs of the
        channels over the step's src and dst buffers
ms      ``gstore`` (``multimem.st``): src a local ref, dst a switch ref of the dst buffer's channel
======  =========================================================================================

Every rank lists the switch channels of every (group, buffer) the algorithm uses whose group holds
it, in one global order, so the members create each NVLS connection (a collective call over the
group, ``connectNvlsCollective`` in ``src/core/executor/executor.cc``) in the same order.

MSCCL++ runs switch ops with no synchronisation of their own: a group step's two barriers
(``taccl_py.ir.algorithm``) become memory-channel signals and waits, as MSCCL++'s own NVLS plans
do (``test/executor-tests/execution-plans/reduce_nvls.json``: signal every peer, wait on every
peer, the op, then the same again). Each (group, channel) of ours gets one memory channel per
pair of members for them, so the barriers of two threadblocks never share a channel. We signal
with a fence (not ``rlxsignal``): the barrier before publishes each member's operand, the one
after the stores. A group step whose every member's step directly follows the previous group
step on its threadblock and has no ``depends`` needs no barrier before: the barrier after the
previous step already orders all that precedes it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, Step, Threadblock
from taccl_py.mscclpp.lower.ops import MAX_CHANNELS_PER_OPERATION, LaneOps, Slot

__all__ = [
    "SwitchKey",
    "SwitchFacts",
    "equal_switched_scratch",
    "lower_switch_step",
    "switch_facts",
    "switch_op",
    "switch_touches",
]

SwitchKey = tuple[tuple[int, ...], int]  # (switch group, channel): one sequence of group steps


@dataclass(frozen=True)
class SwitchFacts:
    """What the exporter needs of an algorithm's switch steps.

    ``channels``: (group, buffer) in the global order every member lists them; ``barrier_pairs``:
    (lower rank, higher rank, key) per pair of members of each key, in one global order;
    ``no_barrier_before``: (rank, threadblock, step) of switch steps whose group step needs no
    barrier before.
    """

    channels: tuple[tuple[tuple[int, ...], Buffer], ...] = ()
    barrier_pairs: tuple[tuple[int, int, SwitchKey], ...] = ()
    no_barrier_before: frozenset[tuple[int, int, int]] = frozenset()

    def channels_of(self, rank: int) -> list[tuple[tuple[int, ...], Buffer]]:
        """Return the switch channels of ``rank``, in the order its GPU entry lists them."""
        return [channel for channel in self.channels if rank in channel[0]]


def _switch_steps(tb: Threadblock) -> list[int]:
    return [index for index, step in enumerate(tb.steps) if step.op.switches]


def switch_facts(algorithm: Algorithm, nodes: tuple[int, ...], protocol: str) -> SwitchFacts:
    """Return the switch channels, barrier channel pairs and barrier-free group steps of ``algorithm``.

    ``nodes`` holds the machine of each rank. Raises ``ArgumentError`` for switch steps under a
    protocol other than Simple (``glres`` has no packet form) or a group over several machines.
    """
    if not algorithm.uses_switch:
        return SwitchFacts()
    if protocol != "Simple":
        raise ArgumentError(
            algorithm.name, "protocol", f"switch steps under {protocol}", "Simple (glres has no packet form)"
        )
    for prog in algorithm.ranks:
        for tb in prog.threadblocks:
            if len({nodes[rank] for rank in tb.switch_group}) > 1:
                where = f"rank {prog.rank} tb {tb.id}"
                fault = f"switch group {list(tb.switch_group)} spans machines"
                raise ArgumentError(algorithm.name, where, fault, "the GPUs of one machine")
    channels: set[tuple[tuple[int, ...], Buffer]] = set()
    keys: set[SwitchKey] = set()
    chained: dict[tuple[SwitchKey, int], list[bool]] = defaultdict(list)  # (key, k) -> per member
    where: dict[tuple[SwitchKey, int], list[tuple[int, int, int]]] = defaultdict(list)
    for prog in algorithm.ranks:
        for tb in prog.threadblocks:
            indices = _switch_steps(tb)
            if not indices:
                continue
            key = (tb.switch_group, tb.channel)
            keys.add(key)
            for k, index in enumerate(indices):
                step = tb.steps[index]
                if step.op is OpType.SWITCH_REDUCE_STORE:
                    channels.add((tb.switch_group, step.src_buffer))
                channels.add((tb.switch_group, step.dst_buffer))
                follows = k > 0 and indices[k - 1] == index - 1 and not step.depends
                chained[(key, k)].append(follows)
                where[(key, k)].append((prog.rank, tb.id, index))
    skip = frozenset(
        step
        for (key, k), flags in chained.items()
        if len(flags) == len(key[0]) and all(flags)
        for step in where[(key, k)]
    )
    order = {buffer: position for position, buffer in enumerate(Buffer)}
    pairs = tuple((a, b, key) for key in sorted(keys) for i, a in enumerate(key[0]) for b in key[0][i + 1 :])
    return SwitchFacts(tuple(sorted(channels, key=lambda c: (c[0], order[c[1]]))), pairs, skip)


def switch_op(step: Step, rank: int, group: tuple[int, ...], channel_ref, facts: SwitchFacts) -> dict:
    """Return the ``glres`` or ``gstore`` op of a switch step of ``rank`` over ``group``.

    ``channel_ref(gpu_channel)`` returns the threadblock's number of the GPU's switch channel.
    """
    mine = facts.channels_of(rank)

    def ref(buffer: Buffer, offset: int) -> dict:
        channel = channel_ref(mine.index((group, buffer)))
        return {"switch_channel_id": channel, "index": offset, "size": step.count}

    if step.op is OpType.SWITCH_REDUCE_STORE:
        src = [ref(step.src_buffer, step.src_offset)]
        dst = [ref(step.dst_buffer, step.dst_offset)]
        return {"name": "glres", "src_buff": src, "dst_buff": dst, "channel_type": "switch", "reduce_op": "sum"}
    if step.op is OpType.SWITCH_STORE:
        src = [{"type": step.src_buffer.value, "index": step.src_offset, "size": step.count}]
        dst = [ref(step.dst_buffer, step.dst_offset)]
        return {"name": "gstore", "src_buff": src, "dst_buff": dst, "channel_type": "switch"}
    raise ArgumentError("step", "op", f"{step.op.value}", "a switch step (mrs, ms)")


def lower_switch_step(
    ops: LaneOps,
    channel_of: dict,
    rank: int,
    key: tuple[int, int, int],
    step: Step,
    tb: Threadblock,
    facts: SwitchFacts,
) -> None:
    """Append a switch step's op between its group step's barriers (``channel_of``: the GPU's channel numbers)."""
    group = tb.switch_group
    channels = [channel_of[(min(rank, p), max(rank, p), (group, tb.channel))] for p in group if p != rank]
    size = MAX_CHANNELS_PER_OPERATION
    batches = [channels[i : i + size] for i in range(0, len(channels), size)]

    def barrier() -> None:
        for name in ("signal", "wait"):
            for batch in batches:
                ops.control(name, "memory", batch)

    if key not in facts.no_barrier_before:
        barrier()
    ops.data(switch_op(step, rank, group, lambda channel: ops.channel_ref("switch", channel), facts))
    barrier()


def switch_touches(algorithm: Algorithm) -> dict[int, dict[Slot, set]]:
    """Return, per rank, the chunks of its buffers other members' switch steps read or write (multimem)."""
    touched: dict[int, dict[Slot, set]] = defaultdict(lambda: defaultdict(set))
    for prog in algorithm.ranks:
        for tb in prog.threadblocks:
            for index, step in enumerate(tb.steps):
                if not step.op.switches:
                    continue
                regions = [(step.dst_buffer, step.dst_offset)]
                regions += [(step.src_buffer, step.src_offset)] if step.op is OpType.SWITCH_REDUCE_STORE else []
                for member in (m for m in tb.switch_group if m != prog.rank):
                    for buffer, offset in regions:
                        for chunk in range(offset, offset + step.count):
                            touched[member][(buffer, chunk)].add((-1 - prog.rank, tb.id, index))
    return touched


def equal_switched_scratch(algorithm: Algorithm, scratch: dict[int, int]) -> dict[int, int]:
    """Return ``scratch`` (chunks per rank), each group multicasting over scratch sized at its largest member's.

    A switch channel binds one NVLS multicast object to the buffer of every member
    (``connectNvlsCollective`` with each rank's buffer size, src/core/executor/executor.cc), so
    the members' scratch buffers are made one size.
    """
    sized = dict(scratch)
    for prog in algorithm.ranks:
        for tb in prog.threadblocks:
            steps = [s for s in tb.steps if s.op.switches]
            if any(Buffer.SCRATCH in (s.src_buffer, s.dst_buffer) for s in steps):
                top = max(sized[m] for m in tb.switch_group)
                sized.update((m, top) for m in tb.switch_group)
    return sized
