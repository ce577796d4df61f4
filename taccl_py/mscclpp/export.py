"""Write an Algorithm as an MSCCL++ execution plan (the JSON the MSCCL++ DSL writes and its executor runs).

MSCCL++ moves data by ``put``: the sender writes into the receiver's memory, then ``signal``s a
channel the receiver ``wait``s on. Our k-th send on (sender, receiver, channel) meets the k-th
receive there; that pair is a *link*, served by one channel on each side (a MemoryChannel between
GPUs of one machine, a PortChannel across machines). Per step:

======  ====================================================================================
s       put ``src`` into the receiver's landing slot, signal (port: one ``pwsf``, put + signal + flush)
r       wait; copy landing slot -> ``dst`` unless the slot is ``dst``
rcs     wait; copy landing slot -> ``dst`` unless the slot is ``dst``; put the slot on, signal
rrs     wait; reduce slot <- ``src`` + slot; put the slot on, signal
rrc     wait; reduce ``dst`` <- ``src`` + slot
rrcs    wait; reduce ``dst`` <- ``src`` + slot; put ``dst`` on, signal
cpy     copy ``src`` -> ``dst``
re      reduce ``dst`` <- ``dst`` + ``src``
nop     nothing (its dependencies still wait and release)
mrs     barrier; ``glres`` over the switch channels of ``src`` and ``dst``; barrier
ms      barrier; ``gstore`` of ``src`` over the switch channel of ``dst``; barrier
======  ====================================================================================

Switch steps (NVLink SHARP) run on switch channels, one per (switch group, buffer), and a group
step's two barriers are memory-channel signals to and waits on every other member
(``lower.switch``); other members' multimem accesses count as touches of a rank's chunks below.

Overwrite safety: every transfer lands in a slot no one else touches during the call. That is
the receive's ``dst`` itself when no other step of the receiving rank touches any of its chunks
(and, for rrc/rrcs, ``src`` does not overlap it), else a scratch slot of its own appended after the
algorithm's scratch. A sender may then put as soon as the receiver has entered the same call:
each receiving threadblock signals its link once on entry, and the sender waits for that signal
before its first put on the link. We chose this over letting the receiver grant each slot just
before its receive step because our IR's sends are buffered: a ring in which every rank sends
before it receives would deadlock if a put had to wait for the receive step.

A rank's steps run on *lanes* (``lower.lanes``): at first one per threadblock of ours. Cross-lane
``depends`` become device semaphores, one per ordered pair of lanes: the depended-on step
releases, the dependent step acquires. Only dependencies no other path implies get one (a
transitive reduction of program order and ``depends``, ``lane_dependencies``), so releases and
acquires pair in order. A ``nop`` (``__syncthreads``) goes only where the executor needs one
(``lower.ops.LaneOps``): after a wait or acquire before a data operation, after a data operation before a signal,
release or port put, and between data operations whose chunks overlap. A lane over
``MAX_OPERATIONS_PER_THREADBLOCK`` operations is cut into consecutive threadblocks chained by a
semaphore (``cut_threadblock``); they share its channels and remote buffers. A rank that would
still need over ``MAX_THREADBLOCKS_PER_GPU`` threadblocks gets lanes merged (``merge_lanes``): their
steps interleaved in one global topological order, so no wait can close a cycle, and dependencies
inside a lane cost nothing. Each lane opens with the entry signals of all its receiving links.
Under LL (``protocol="LL"``) steps lower to packet ops instead (``lower.packets``): no signals,
waits or entry handshake, every transfer landing in a packet slot of scratch, which the plan
double-buffers across calls.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import chunk_layout
from taccl_py.mscclpp.lower.lanes import Lane, lane_semaphores, merge_lanes, step_positions
from taccl_py.mscclpp.lower.ops import (
    MAX_OPERATIONS_PER_THREADBLOCK,
    MAX_SEMAPHORES_PER_OPERATION,
    BatchedLaneOps,
    LaneOps,
    Slot,
    cut_threadblock,
    lower_step,
)
from taccl_py.mscclpp.lower.packets import PacketSlots, lower_packet_step, packet_slots
from taccl_py.mscclpp.lower.switch import (
    SwitchFacts,
    equal_switched_scratch,
    lower_switch_step,
    switch_facts,
    switch_touches,
)
from taccl_py.mscclpp.plan import MAX_MESSAGE_SIZE
from taccl_py.mscclpp.sizes import addressable_size
from taccl_py.topology.model import Topology

__all__ = [
    "PLAN_PROTOCOLS",
    "generate_mscclpp_plan",
    "MAX_OPERATIONS_PER_THREADBLOCK",
    "MAX_CHANNELS_PER_THREADBLOCK",
    "MAX_SEMAPHORES_PER_OPERATION",
    "MAX_THREADBLOCKS_PER_GPU",
]

logger = logging.getLogger(__name__)

# Limits of the MSCCL++ executor (microsoft/mscclpp src/core/include/execution_common.hpp).
MAX_CHANNELS_PER_THREADBLOCK = 16  # MAX_CHANNEL: channels, and remote buffers, per type per threadblock
# NPKIT_MAX_NUM_GPU_THREADBLOCKS (include/mscclpp/npkit/npkit.hpp); the threadblocks spin on one
# another, so all must be resident at once, which 64 keeps true on V100 (80 SMs) and later GPUs.
MAX_THREADBLOCKS_PER_GPU = 64
# The DSL's defaults (python/mscclpp/language/program.py CollectiveProgram).
THREADS_PER_BLOCK = 1024
BUFFER_ALIGNMENT_BYTES = 16
PLAN_PROTOCOLS = ("Simple", "LL")  # what the exporter writes (MSCCL++ plans have no LL128)

Link = tuple[int, int, int]  # (sender rank, receiver rank, channel)
StepKey = tuple[int, int, int]  # (rank, threadblock id, step index)


@dataclass(frozen=True)
class _Facts:
    """What every rank's lowering needs to know about the others."""

    nodes: tuple[int, ...]  # machine of each rank
    links: tuple[Link, ...]  # sorted
    landing: dict[StepKey, Slot]  # where each receiving step's data lands, on its own rank
    targets: dict[StepKey, Slot]  # where each sending step's put lands, on the receiver
    scratch: dict[int, int]  # scratch chunks per rank, landing slots included
    packets: PacketSlots | None  # LL's slots; None under Simple
    switch: SwitchFacts = SwitchFacts()  # switch channels and group-step barriers (``lower.switch``)

    def kind(self, rank: int, peer: int) -> str:
        """Return the channel type between two ranks: ``memory`` within a machine, ``port`` across."""
        return "memory" if self.nodes[rank] == self.nodes[peer] else "port"


def _fault(algorithm: Algorithm, field: str, fault: str, expected: str) -> ArgumentError:
    return ArgumentError(algorithm.name, field, fault, expected)


def _links(algorithm: Algorithm) -> tuple[dict[Link, Threadblock], dict[Link, Threadblock]]:
    """Return the sending and the receiving threadblock of every link; refuse a link two threadblocks share."""
    senders: dict[Link, Threadblock] = {}
    receivers: dict[Link, Threadblock] = {}
    for prog in algorithm.ranks:
        for tb in prog.threadblocks:
            ends = ((senders, (prog.rank, tb.send_peer, tb.channel), tb.send_peer),)
            ends += ((receivers, (tb.recv_peer, prog.rank, tb.channel), tb.recv_peer),)
            for table, link, peer in ends:
                if peer is None:
                    continue
                if link in table:
                    where = f"rank {prog.rank} tb {tb.id}"
                    raise _fault(algorithm, where, f"shares link {link} with tb {table[link].id}", "one per link")
                table[link] = tb
    return senders, receivers


def _touches(prog: RankProgram) -> dict[Slot, set[tuple[int, int]]]:
    """Return, per chunk of the rank's buffers, the (threadblock, step) pairs that read or write it."""
    touched: dict[Slot, set[tuple[int, int]]] = defaultdict(set)
    for tb in prog.threadblocks:
        for index, step in enumerate(tb.steps):
            for used, buffer, offset in (
                (step.op.uses_src, step.src_buffer, step.src_offset),
                (step.op.uses_dst, step.dst_buffer, step.dst_offset),
            ):
                if used and buffer is not None:
                    for chunk in range(offset, offset + step.count):
                        touched[(buffer, chunk)].add((tb.id, index))
    return touched


def _lands_in_dst(step: Step, owner: tuple[int, int], touched: dict[Slot, set[tuple[int, int]]]) -> bool:
    if step.op is OpType.RECV_REDUCE_SEND or step.dst_buffer is None:
        return False
    dst = range(step.dst_offset, step.dst_offset + step.count)
    if step.op.uses_src and step.src_buffer is step.dst_buffer:
        if range(max(dst.start, step.src_offset), min(dst.stop, step.src_offset + step.count)):
            return False
    return all(touched[(step.dst_buffer, chunk)] == {owner} for chunk in dst)


def _landings(algorithm: Algorithm) -> tuple[dict[StepKey, Slot], dict[int, int]]:
    """Return the landing slot of every receiving step and each rank's scratch size in chunks.

    Other members' switch steps touch a rank's buffers too: a transfer never lands in place where they do.
    """
    landing: dict[StepKey, Slot] = {}
    scratch: dict[int, int] = {}
    foreign = switch_touches(algorithm) if algorithm.uses_switch else {}
    for prog in algorithm.ranks:
        touched = _touches(prog)
        for slot, users in foreign.get(prog.rank, {}).items():
            touched[slot] |= users
        top = prog.scratch_chunks
        for tb in sorted(prog.threadblocks, key=lambda t: t.id):
            for index, step in enumerate(tb.steps):
                if not step.op.receives:
                    continue
                if _lands_in_dst(step, (tb.id, index), touched):
                    landing[(prog.rank, tb.id, index)] = (step.dst_buffer, step.dst_offset)
                else:
                    landing[(prog.rank, tb.id, index)] = (Buffer.SCRATCH, top)
                    top += step.count
        scratch[prog.rank] = top
    return landing, scratch


def _put_targets(
    algorithm: Algorithm, receivers: dict[Link, Threadblock], landing: dict[StepKey, Slot]
) -> dict[StepKey, Slot]:
    """Return, per sending step, the receiver's landing slot its k-th put on the link fills."""
    targets: dict[StepKey, Slot] = {}
    for prog in algorithm.ranks:
        for tb in prog.threadblocks:
            if tb.send_peer is None:
                continue
            receiver = receivers.get((prog.rank, tb.send_peer, tb.channel))
            sends = [index for index, step in enumerate(tb.steps) if step.op.sends]
            receives = [] if receiver is None else [i for i, s in enumerate(receiver.steps) if s.op.receives]
            if len(sends) != len(receives):
                where = f"rank {prog.rank} tb {tb.id}"
                raise _fault(
                    algorithm, where, f"{len(sends)} sends meet {len(receives)} receives", "a verified algorithm"
                )
            for send, receive in zip(sends, receives):
                targets[(prog.rank, tb.id, send)] = landing[(tb.send_peer, receiver.id, receive)]
    return targets


class _Gpu:
    """Per-rank channel and remote-buffer tables (the GPU's ``channels`` and ``remote_buffers``)."""

    def __init__(self, rank: int, facts: _Facts) -> None:
        self.rank = rank
        self.kind = facts.kind
        self.connected: dict[str, list[int]] = {"memory": [], "port": []}
        self.channel_of: dict[Link, int] = {}
        # both ends list a pair's links in one global order, so the k-th channel to a peer meets the peer's k-th
        for link in (link for link in facts.links if rank in link[:2]):
            peer = link[1] if link[0] == rank else link[0]
            listed = self.connected[facts.kind(rank, peer)]
            self.channel_of[link] = len(listed)
            listed.append(peer)
        for a, b, key in (pair for pair in facts.switch.barrier_pairs if rank in pair[:2]):  # one group, one machine
            self.channel_of[(a, b, key)] = len(self.connected["memory"])
            self.connected["memory"].append(b if a == rank else a)
        self.switch_channels = facts.switch.channels_of(rank)
        self.remote_buffers: dict[tuple[int, Buffer], int] = {}

    def remote_buffer(self, peer: int, buffer: Buffer) -> int:
        return self.remote_buffers.setdefault((peer, buffer), len(self.remote_buffers))

    def to_json(self) -> tuple[list[dict], list[dict]]:
        channels = [{"channel_type": k, "connected_to": peers} for k, peers in self.connected.items() if peers]
        channels += [
            {
                "channel_type": "switch",
                "buffer_type": buffer.value,
                "rank_groups": [{"size": len(group), "ranks": list(group)}],
            }
            for group, buffer in self.switch_channels
        ]
        remote = [
            {"rank": peer, "type": buffer.value, "access_channel_types": [self.kind(self.rank, peer)]}
            for (peer, buffer), _ in sorted(self.remote_buffers.items(), key=lambda item: item[1])
        ]
        return channels, remote


def _lane_ops(
    rank: int, lane: Lane, tbs: dict[int, Threadblock], gpu: _Gpu, facts: _Facts, semaphores, batched: bool
) -> LaneOps:
    """Return the operations of one lane: the steps of our threadblocks ``tbs`` in the lane's order."""
    acquires, releases, _ = semaphores
    # Under LL a packet read waits and a packet write publishes, unseen by BatchedLaneOps: no gathering there.
    ops = BatchedLaneOps() if batched and facts.packets is None else LaneOps()
    members = list(dict.fromkeys(tb_id for tb_id, _ in lane))
    for tb in (tbs[tb_id] for tb_id in members):  # our landing slots are free: this rank has entered the call
        if facts.packets is None and any(step.op.receives for step in tb.steps):
            ops.control("signal", facts.kind(rank, tb.recv_peer), [gpu.channel_of[(tb.recv_peer, rank, tb.channel)]])
    ready: set[int] = set()
    for tb_id, index in lane:
        tb, step, key = tbs[tb_id], tbs[tb_id].steps[index], (rank, tb_id, index)
        if acquires.get((tb_id, index)):
            ops.semaphores("sem_acquire", acquires[(tb_id, index)])
        send = None
        if step.op.sends:
            kind, channel = facts.kind(rank, tb.send_peer), gpu.channel_of[(rank, tb.send_peer, tb.channel)]
            target = facts.targets[key]
            send = (kind, channel, gpu.remote_buffer(tb.send_peer, target[0]), target)
        if step.op.switches:
            lower_switch_step(ops, gpu.channel_of, rank, key, step, tb, facts.switch)
        elif facts.packets is not None:
            lower_packet_step(ops, step, key, facts.packets, send)
        else:
            if step.op.receives:
                ops.control("wait", facts.kind(rank, tb.recv_peer), [gpu.channel_of[(tb.recv_peer, rank, tb.channel)]])
            source = lower_step(ops, step, facts.landing.get(key))
            if send is not None:
                kind, channel, remote_id, target = send
                if tb_id not in ready:  # the receiver has entered this call, so its slots are ours to fill
                    ops.control("wait", kind, [channel])
                    ready.add(tb_id)
                ops.put(source, step.count, kind, channel, remote_id, target)
                if kind == "memory":  # a port pwsf signals and flushes (the proxy has read the source) itself
                    ops.control("signal", kind, [channel])
        if releases.get((tb_id, index)):
            ops.semaphores("sem_release", releases[(tb_id, index)])
    ops.close()
    return ops


def _lane_pieces(
    prog: RankProgram, lanes: list[Lane], gpu: _Gpu, facts: _Facts, batched: bool = False
) -> tuple[list, int] | None:
    """Return each lane's ops and its pieces under the op limit, and the semaphore count; None past a channel limit."""
    semaphores = lane_semaphores(prog, lanes)
    tbs = {tb.id: tb for tb in prog.threadblocks}
    count, pieces = semaphores[2], []
    for lane in lanes:
        ops = _lane_ops(prog.rank, lane, tbs, gpu, facts, semaphores, batched)
        for kind in ("memory", "port", "switch"):
            if max(len(ops.channels[kind]), len(ops.remote.get(kind, ()))) > MAX_CHANNELS_PER_THREADBLOCK:
                return None
        pieces.append((ops, cut_threadblock(ops.ops, count)))
        count += len(pieces[-1][1]) - 1
    return pieces, count


def _threadblock_count(lowered: tuple[list, int]) -> int:
    return sum(len(segments) for _, segments in lowered[0])


def _rank_json(algorithm: Algorithm, prog: RankProgram, facts: _Facts, positions: Callable[[], dict]) -> dict:
    """Return the ``gpus`` entry of one rank."""
    gpu = _Gpu(prog.rank, facts)
    lanes = [tuple((tb.id, i) for i in range(len(tb.steps))) for tb in sorted(prog.threadblocks, key=lambda t: t.id)]
    lowered = _lane_pieces(prog, lanes, gpu, facts)
    if lowered is None:
        raise _fault(algorithm, f"rank {prog.rank}", "too many channels in one threadblock", "at most 16 per type")
    if _threadblock_count(lowered) > MAX_THREADBLOCKS_PER_GPU:
        # Gathering gates and publications costs latency; merging lanes costs parallelism: gather first.
        lowered = _lane_pieces(prog, lanes, gpu, facts, batched=True) or lowered
        logger.debug("rank %d: %d threadblocks with gates gathered", prog.rank, _threadblock_count(lowered))
    if _threadblock_count(lowered) > MAX_THREADBLOCKS_PER_GPU:

        def threadblocks_of(trial: list[Lane]) -> list[int] | None:
            result = _lane_pieces(prog, trial, gpu, facts, batched=True)
            return None if result is None else [len(segments) for _, segments in result[0]]

        lanes = merge_lanes(prog, positions(), threadblocks_of, MAX_THREADBLOCKS_PER_GPU)
        lowered = _lane_pieces(prog, lanes, gpu, facts, batched=True)
        logger.debug("rank %d: %d threadblocks merged into %d lanes", prog.rank, len(prog.threadblocks), len(lanes))
    pieces, count = lowered
    threadblocks = []
    for ops, segments in pieces:
        for segment in segments:
            threadblocks.append({"id": len(threadblocks), "ops": segment})
            threadblocks[-1]["channels"] = [
                {"channel_type": kind, "channel_ids": ids} for kind, ids in ops.channels.items() if ids
            ]
            threadblocks[-1]["remote_buffer_refs"] = [
                {"access_channel_type": kind, "remote_buffer_ids": ids} for kind, ids in ops.remote.items() if ids
            ]
    if len(threadblocks) > MAX_THREADBLOCKS_PER_GPU:
        where = f"rank {prog.rank}"
        raise _fault(algorithm, where, f"{len(threadblocks)} threadblocks", f"at most {MAX_THREADBLOCKS_PER_GPU}")
    channels, remote = gpu.to_json()
    # In place, our IR gives the aliased view no chunks of its own; MSCCL++ sizes it as the collective does.
    layout = chunk_layout(algorithm.collective, algorithm.num_ranks, algorithm.chunks_per_loop)
    return {
        "id": prog.rank,
        "input_chunks": layout.input_chunks if algorithm.inplace else prog.input_chunks,
        "output_chunks": layout.output_chunks if algorithm.inplace else prog.output_chunks,
        "scratch_chunks": facts.scratch[prog.rank],
        "threadblocks": threadblocks,
        "channels": channels,
        "remote_buffers": remote,
        "semaphores": [{"init_value": 0} for _ in range(count)],
    }


def generate_mscclpp_plan(
    algorithm: Algorithm, topology: Topology | None = None, *, protocol: str | None = None
) -> dict:
    """Return ``algorithm`` as an MSCCL++ execution plan (the JSON object, ready for ``json.dumps``).

    Parameters
    ----------
    algorithm : Algorithm
        A verified schedule (``taccl_py.verify.check_algorithm``).
    topology : Topology, optional
        Which machine holds each rank: ranks on one machine talk over MemoryChannels, others over
        PortChannels. None: every rank on one machine.
    protocol : str, optional
        ``"Simple"`` (the default) or ``"LL"`` (packets, ``lower.packets``).

    Raises
    ------
    ArgumentError
        A protocol other than Simple and LL; switch steps under LL, or a switch group over several
        machines; a topology of another rank count; two threadblocks of
        a rank on one link; a rank over ``MAX_THREADBLOCKS_PER_GPU`` threadblocks even with its lanes
        merged, or a threadblock of ours over ``MAX_CHANNELS_PER_THREADBLOCK`` channels.

    Notes
    -----
    A rank within the limits costs O(steps) plus a transitive reduction, O(edges x steps / 64);
    a rank over them is lowered again for every merge tried (``lower.lanes.merge_lanes``),
    seconds per rank for the largest shipped AllReduce bands.
    """
    protocol = "Simple" if protocol is None else protocol
    if protocol not in PLAN_PROTOCOLS:
        raise _fault(algorithm, "protocol", f"protocol {protocol!r}", " or ".join(map(repr, PLAN_PROTOCOLS)))
    if topology is not None and topology.num_ranks != algorithm.num_ranks:
        raise _fault(algorithm, "topology", f"{topology.num_ranks} GPUs", f"{algorithm.num_ranks} ranks")
    nodes = tuple(0 if topology is None else topology.node_of(rank) for rank in range(algorithm.num_ranks))
    senders, receivers = _links(algorithm)
    packets = None
    if protocol == "LL":
        packets = packet_slots(algorithm, lambda rank, peer: nodes[rank] != nodes[peer])
        landing, scratch = packets.landing, packets.scratch
    else:
        landing, scratch = _landings(algorithm)
        scratch = equal_switched_scratch(algorithm, scratch)
    targets = _put_targets(algorithm, receivers, landing)
    links = tuple(sorted(set(senders) | set(receivers)))
    facts = _Facts(nodes, links, landing, targets, scratch, packets, switch_facts(algorithm, nodes, protocol))
    positions = functools.cache(functools.partial(step_positions, algorithm))  # only a rank over the limit needs them
    if algorithm.max_bytes is not None and algorithm.max_bytes <= 1:
        raise _fault(algorithm, "max_bytes", f"{algorithm.max_bytes}", "a band holding some size above 0")
    gpus = [_rank_json(algorithm, p, facts, positions) for p in sorted(algorithm.ranks, key=lambda p: p.rank)]
    # MSCCL++ tests the upper end inclusively (execution_plan.cc checkMessageSize); ours is exclusive.
    # Its offsets are 32-bit, so no size may make a buffer, scratch included, reach 2^32 bytes.
    scratch_factor = 4 if packets is not None else 1  # LL: data and flag, double-buffered
    chunks = [(gpu["input_chunks"], gpu["output_chunks"], gpu["scratch_chunks"]) for gpu in gpus]
    largest = addressable_size(algorithm.collective.value, algorithm.num_ranks, chunks, scratch_factor)
    max_size = min(MAX_MESSAGE_SIZE if algorithm.max_bytes is None else algorithm.max_bytes - 1, largest)
    if max_size < algorithm.min_bytes:
        fault = f"offsets past 2^32 bytes from {largest + 1} bytes, below the band's {algorithm.min_bytes}"
        raise _fault(algorithm, "min_bytes", fault, "a band MSCCL++'s 32-bit offsets can address")
    return {
        "name": algorithm.name,
        "collective": algorithm.collective.value,
        "protocol": protocol,
        "inplace": algorithm.inplace,
        "reuse_resources": False,
        "gpus": gpus,
        "num_threads_per_block": THREADS_PER_BLOCK,
        "use_double_scratch_buffer": packets is not None,
        "buffer_alignment": BUFFER_ALIGNMENT_BYTES,
        "min_message_size": algorithm.min_bytes,
        "max_message_size": max_size,
    }
