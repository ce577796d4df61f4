"""The LL (packet) form of an exported MSCCL++ plan: where packets land, and each step's packet ops.

Under LL every 8 bytes travel with a flag (an ``LL16`` packet, twice the bytes), and a reader polls
the flag, so a transfer needs no signal, no wait and no entry handshake. The executor keeps packets
only in scratch: a packet slot of index p and n chunks spans bytes ``[2 off(p), 2 off(p + n))``
while a plain scratch chunk c spans ``[off(c), off(c + 1))`` (``execution_kernel.hpp`` shifts
packet offsets left by one; ``calScratchBufferSize`` doubles an LL plan's scratch). So a rank's
plain scratch (the algorithm's own, then one slot per ``rrs`` result) takes chunks ``[0, k)`` and
its packet slots start at ``ceil(k / 2)``: the two never share a byte.

Every receive lands in a packet slot of its own, as in the Simple export. A port channel moves
raw bytes, so what crosses machines is made packets first (``cpkt``, or a reduce writing packets)
in a *staging* slot on the sender and forwarded with ``rppkt``. Per step:

======  ============================================  ==========================================
step    memory channel                                port channel
======  ============================================  ==========================================
s       ``ppkt`` src -> peer's slot                   ``cpkt`` src -> staging; ``rppkt`` staging
r       ``upkt`` slot -> dst
rcs     ``upkt`` slot -> dst; ``rppkt`` slot           ``upkt`` slot -> dst; ``rppkt`` slot
rrs     ``respkt`` src + slot -> plain, peer's slot   ``recpkt`` -> plain, staging; ``rppkt``
rrc     ``repkt`` src + slot -> dst
rrcs    ``respkt`` src + slot -> dst, peer's slot     ``recpkt`` -> dst, staging; ``rppkt``
======  ============================================  ==========================================

A slot is written once per call; the plan double-buffers its scratch
(``use_double_scratch_buffer``), so a sender one call ahead writes the other half, and one two
calls ahead cannot be: it has finished a call that needed every rank to start the one between.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, Step
from taccl_py.mscclpp.lower.lanes import StepKey
from taccl_py.mscclpp.lower.ops import LaneOps, Slot, buffer_ref, lower_step

__all__ = ["PacketSlots", "lower_packet_step", "packet_slots"]

# Ops whose staging slot a port send fills before ``rppkt`` forwards it.
_STAGED = frozenset({OpType.SEND, OpType.RECV_REDUCE_SEND, OpType.RECV_REDUCE_COPY_SEND})


@dataclass
class PacketSlots:
    """Where each step's packets land and are staged, its plain result slot, and each rank's scratch (chunks)."""

    landing: dict[StepKey, Slot] = field(default_factory=dict)  # packet slot a receiving step reads
    staging: dict[StepKey, Slot] = field(default_factory=dict)  # packet slot a port send fills on its own rank
    plain: dict[StepKey, Slot] = field(default_factory=dict)  # where an rrs step's sum goes (the reduce writes one)
    scratch: dict[int, int] = field(default_factory=dict)


def packet_slots(algorithm: Algorithm, sends_over_port: Callable[[int, int], bool]) -> PacketSlots:
    """Return the LL slots of every step of ``algorithm``.

    ``sends_over_port(rank, peer)`` says whether a send from ``rank`` to ``peer`` crosses machines.
    """
    slots = PacketSlots()
    for prog in algorithm.ranks:
        top = prog.scratch_chunks
        packets: list[tuple[dict[StepKey, Slot], StepKey, int]] = []
        for tb in sorted(prog.threadblocks, key=lambda t: t.id):
            for index, step in enumerate(tb.steps):
                key = (prog.rank, tb.id, index)
                if step.op is OpType.RECV_REDUCE_SEND:
                    slots.plain[key] = (Buffer.SCRATCH, top)
                    top += step.count
                if step.op.receives:
                    packets.append((slots.landing, key, step.count))
                if step.op in _STAGED and sends_over_port(prog.rank, tb.send_peer):
                    packets.append((slots.staging, key, step.count))
        first = (top + 1) // 2  # packet slot p starts at byte 2 off(p), past the plain chunks [0, top)
        for table, key, count in packets:
            table[key] = (Buffer.SCRATCH, first)
            first += count
        slots.scratch[prog.rank] = max(top, first)
    return slots


def lower_packet_step(
    ops: LaneOps,
    step: Step,
    key: StepKey,
    slots: PacketSlots,
    send: tuple[str, int, int, Slot] | None,
) -> None:
    """Append the packet ops of ``step`` (the table in the module docstring).

    ``send`` is (channel type, GPU channel, remote buffer id, the peer's landing slot) of a sending
    step, None for a step that sends nothing.
    """
    op, count = step.op, step.count
    src = None if step.src_buffer is None else buffer_ref((step.src_buffer, step.src_offset), count)
    dst = None if step.dst_buffer is None else buffer_ref((step.dst_buffer, step.dst_offset), count)
    land = slots.landing.get(key)
    if op in (OpType.COPY, OpType.REDUCE):
        lower_step(ops, step, None)  # local steps lower as under Simple
    elif op in (OpType.RECV, OpType.RECV_COPY_SEND):
        ops.data({"name": "upkt", "src_buff": [buffer_ref(land, count)], "dst_buff": [dst]})
    elif op is OpType.RECV_REDUCE_COPY:
        reduce = {"name": "repkt", "src_buff": [src, buffer_ref(land, count)], "dst_buff": [dst]}
        ops.data(reduce | {"reduce_op": "sum"})
    if send is None:
        return
    kind, channel, remote_id, target = send
    remote = {"buffer_id": ops.remote_ref(kind, remote_id), "index": target[1], "size": count}
    channel_ref = ops.channel_ref(kind, channel)  # the DSL lists a packet op's channel on its threadblock
    if op in (OpType.RECV_REDUCE_SEND, OpType.RECV_REDUCE_COPY_SEND):
        result = buffer_ref(slots.plain[key], count) if op is OpType.RECV_REDUCE_SEND else dst
        reduce = {"src_buff": [src, buffer_ref(land, count)], "reduce_op": "sum"}
        if kind == "memory":  # the reduce writes the peer's packets itself; its handler has no port branch
            ops.data({"name": "respkt", **reduce, "dst_buff": [result, remote], "channel_type": kind})
            return
        ops.data({"name": "recpkt", **reduce, "dst_buff": [result, buffer_ref(slots.staging[key], count)]})
        forward = slots.staging[key]
    elif op is OpType.SEND:
        if kind == "memory":
            ops.data({"name": "ppkt", "src_buff": [src], "dst_buff": [remote], "channel_type": kind})
            return
        ops.data({"name": "cpkt", "src_buff": [src], "dst_buff": [buffer_ref(slots.staging[key], count)]})
        forward = slots.staging[key]
    else:  # rcs: the packets that landed go on as they are
        forward = land
    put = {"name": "rppkt", "src_buff": [buffer_ref(forward, count)], "dst_buff": [remote]}
    if kind == "port":  # a port rppkt polls its packets on every thread, then thread 0 has the proxy copy them
        ops.data(put | {"channel_ids": [channel_ref], "channel_type": kind}, all_threads=False)
    else:
        ops.data(put | {"channel_type": kind})
