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

__all__ = ["SwitchKey", "SwitchFacts", "switch_facts", "switch_op"]

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


def switch_facts(algorithm: Algorithm) -> SwitchFacts:
    """Return the switch channels, barrier channel pairs and barrier-free group steps of ``algorithm``."""
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
