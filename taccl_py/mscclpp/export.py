"""Write an Algorithm as an MSCCL++ execution plan (the JSON the MSCCL++ DSL writes and its executor runs).

MSCCL++ moves data by ``put``: the sender writes into the receiver's memory, then ``signal``s a
channel the receiver ``wait``s on. Our k-th send on (sender, receiver, channel) meets the k-th
receive there; that pair is a *link*, served by one channel on each side (a MemoryChannel between
GPUs of one machine, a PortChannel across machines). Per step:

======  ====================================================================================
s       put ``src`` into the receiver's landing slot, signal (port: then flush)
r       wait; copy landing slot -> ``dst`` unless the slot is ``dst``
rcs     wait; copy landing slot -> ``dst`` unless the slot is ``dst``; put the slot on, signal
rrs     wait; reduce slot <- ``src`` + slot; put the slot on, signal
rrc     wait; reduce ``dst`` <- ``src`` + slot
rrcs    wait; reduce ``dst`` <- ``src`` + slot; put ``dst`` on, signal
cpy     copy ``src`` -> ``dst``
re      reduce ``dst`` <- ``dst`` + ``src``
nop     nothing (its dependencies still wait and release)
======  ====================================================================================

Overwrite safety: every transfer lands in a slot no one else touches during the call. That is
the receive's ``dst`` itself when no other step of the receiving rank touches any of its chunks
(and, for rrc/rrcs, ``src`` does not overlap it), else a scratch slot of its own appended after the
algorithm's scratch. A sender may then put as soon as the receiver has entered the same call:
each receiving threadblock signals its link once on entry, and the sender waits for that signal
before its first put on the link. We chose this over letting the receiver grant each slot just
before its receive step because our IR's sends are buffered: a ring in which every rank sends
before it receives would deadlock if a put had to wait for the receive step.

Cross-threadblock ``depends`` become device semaphores, one per ordered pair of threadblocks:
the depended-on step releases, the dependent step acquires; dependencies implied by an earlier
one are dropped, so releases and acquires pair in order. A ``nop`` (``__syncthreads``) separates a
wait or acquire from the data operation after it and a data operation from the next data
operation, signal or release. A threadblock over ``MAX_OPERATIONS_PER_THREADBLOCK`` operations is cut
into consecutive threadblocks chained by a semaphore; they share its channels and remote buffers.
Only the Simple protocol is written; LL (packets) is refused.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import chunk_layout
from taccl_py.mscclpp.plan import MAX_MESSAGE_SIZE
from taccl_py.topology.model import Topology

__all__ = [
    "generate_mscclpp_plan",
    "MAX_OPERATIONS_PER_THREADBLOCK",
    "MAX_CHANNELS_PER_THREADBLOCK",
    "MAX_SEMAPHORES_PER_OPERATION",
    "MAX_THREADBLOCKS_PER_GPU",
]

logger = logging.getLogger(__name__)

# Limits of the MSCCL++ executor (microsoft/mscclpp src/core/include/execution_common.hpp).
MAX_OPERATIONS_PER_THREADBLOCK = 64  # MAX_OPERATION; executor.cc refuses a threadblock with more
MAX_CHANNELS_PER_THREADBLOCK = 16  # MAX_CHANNEL: channels, and remote buffers, per type per threadblock
MAX_SEMAPHORES_PER_OPERATION = 16  # MAX_DEVICE_SEMAPHORES: semaphore ids in one sem_acquire/sem_release
# NPKIT_MAX_NUM_GPU_THREADBLOCKS (include/mscclpp/npkit/npkit.hpp); the threadblocks spin on one
# another, so all must be resident at once, which 64 keeps true on V100 (80 SMs) and later GPUs.
MAX_THREADBLOCKS_PER_GPU = 64
# The DSL's defaults (python/mscclpp/language/program.py CollectiveProgram).
THREADS_PER_BLOCK = 1024
BUFFER_ALIGNMENT_BYTES = 16
_CHAIN_OPS = 4  # a cut threadblock's acquire + nop at its start and nop + release at its end

Link = tuple[int, int, int]  # (sender rank, receiver rank, channel)
Slot = tuple[Buffer, int]
StepKey = tuple[int, int, int]  # (rank, threadblock id, step index)


@dataclass(frozen=True)
class _Facts:
    """What every rank's lowering needs to know about the others."""

    nodes: tuple[int, ...]  # machine of each rank
    links: tuple[Link, ...]  # sorted
    landing: dict[StepKey, Slot]  # where each receiving step's data lands, on its own rank
    targets: dict[StepKey, Slot]  # where each sending step's put lands, on the receiver
    scratch: dict[int, int]  # scratch chunks per rank, landing slots included

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
    """Return the landing slot of every receiving step and each rank's scratch size in chunks."""
    landing: dict[StepKey, Slot] = {}
    scratch: dict[int, int] = {}
    for prog in algorithm.ranks:
        touched = _touches(prog)
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


def _semaphores(prog: RankProgram) -> tuple[dict[tuple[int, int], list[int]], dict[tuple[int, int], list[int]], int]:
    """Return the semaphores each (threadblock, step) acquires before it and releases after it, and their count."""
    semaphore_of: dict[tuple[int, int], int] = {}
    acquires: dict[tuple[int, int], list[int]] = defaultdict(list)
    releases: dict[tuple[int, int], list[int]] = defaultdict(list)
    for tb in sorted(prog.threadblocks, key=lambda t: t.id):
        latest: dict[int, int] = {}
        for index, step in enumerate(tb.steps):
            for other, other_step in sorted(set(step.depends)):
                # a wait on an own step, or on a step before one already waited for, is implied by program order
                if other == tb.id or other_step <= latest.get(other, -1):
                    continue
                latest[other] = other_step
                semaphore = semaphore_of.setdefault((other, tb.id), len(semaphore_of))
                acquires[(tb.id, index)].append(semaphore)
                releases[(other, other_step)].append(semaphore)
    return acquires, releases, len(semaphore_of)


class _Ops:
    """One threadblock's operations with its channel and remote-buffer references (per channel type)."""

    def __init__(self) -> None:
        self.ops: list[dict] = []
        self.channels: dict[str, list[int]] = {"memory": [], "port": []}
        self.remote: dict[str, list[int]] = {"memory": [], "port": []}
        self.pending = False  # threads may still be in a data operation or behind a wait: sync before acting

    def _sync(self) -> None:
        if self.pending:
            self.ops.append({"name": "nop"})
            self.pending = False

    def _channel(self, kind: str, gpu_channel: int) -> int:
        refs = self.channels[kind]
        if gpu_channel not in refs:
            refs.append(gpu_channel)
        return refs.index(gpu_channel)

    def control(self, name: str, kind: str, gpu_channel: int) -> None:
        if name == "signal" and kind == "memory":  # a port put and signal are both queued by thread 0, in order
            self._sync()
        self.ops.append({"name": name, "channel_ids": [self._channel(kind, gpu_channel)], "channel_type": kind})
        self.pending = self.pending or name == "wait"

    def semaphores(self, name: str, ids: list[int]) -> None:
        if name == "sem_release":
            self._sync()
        for start in range(0, len(ids), MAX_SEMAPHORES_PER_OPERATION):
            self.ops.append({"name": name, "semaphore_ids": ids[start : start + MAX_SEMAPHORES_PER_OPERATION]})
        self.pending = self.pending or name == "sem_acquire"

    def data(self, op: dict) -> None:
        self._sync()
        self.ops.append(op)
        self.pending = True

    def put(self, source: Slot, count: int, kind: str, gpu_channel: int, remote_id: int, target: Slot) -> None:
        refs = self.remote[kind]
        if remote_id not in refs:
            refs.append(remote_id)
        op = {"name": "put", "src_buff": [_chunk(source, count)]}
        op["dst_buff"] = [{"buffer_id": refs.index(remote_id), "index": target[1], "size": count}]
        if kind == "port":  # the DSL names the channel of a port put; a memory put writes through the buffer
            op["channel_ids"] = [self._channel(kind, gpu_channel)]
        op["channel_type"] = kind
        self.data(op)


def _chunk(slot: Slot, count: int) -> dict:
    return {"type": slot[0].value, "index": slot[1], "size": count}


def _compute(ops: _Ops, step: Step, land: Slot | None) -> Slot | None:
    """Append the local part of ``step``; return the slot its send part reads."""
    op, count = step.op, step.count
    src = (step.src_buffer, step.src_offset) if step.src_buffer is not None else None
    dst = (step.dst_buffer, step.dst_offset) if step.dst_buffer is not None else None
    if op is OpType.COPY or (op in (OpType.RECV, OpType.RECV_COPY_SEND) and land != dst):
        source = src if op is OpType.COPY else land
        ops.data({"name": "copy", "src_buff": [_chunk(source, count)], "dst_buff": [_chunk(dst, count)]})
    elif op.reduces:
        inputs, target = ((dst, src), dst) if op is OpType.REDUCE else ((src, land), land)
        if op in (OpType.RECV_REDUCE_COPY, OpType.RECV_REDUCE_COPY_SEND):
            target = dst
        reduce = {"name": "re", "src_buff": [_chunk(slot, count) for slot in inputs]}
        reduce.update({"dst_buff": [_chunk(target, count)], "reduce_op": "sum"})
        ops.data(reduce)
    return {
        OpType.SEND: src,
        OpType.RECV_COPY_SEND: land,
        OpType.RECV_REDUCE_SEND: land,
        OpType.RECV_REDUCE_COPY_SEND: dst,
    }.get(op)


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
        self.remote_buffers: dict[tuple[int, Buffer], int] = {}

    def remote_buffer(self, peer: int, buffer: Buffer) -> int:
        return self.remote_buffers.setdefault((peer, buffer), len(self.remote_buffers))

    def to_json(self) -> tuple[list[dict], list[dict]]:
        channels = [{"channel_type": k, "connected_to": peers} for k, peers in self.connected.items() if peers]
        remote = [
            {"rank": peer, "type": buffer.value, "access_channel_types": [self.kind(self.rank, peer)]}
            for (peer, buffer), _ in sorted(self.remote_buffers.items(), key=lambda item: item[1])
        ]
        return channels, remote


def _threadblock_ops(rank: int, tb: Threadblock, gpu: _Gpu, facts: _Facts, semaphores: tuple) -> _Ops:
    """Return the operations of our threadblock ``tb`` on ``rank``."""
    acquires, releases, _ = semaphores
    ops = _Ops()
    out_link = (rank, tb.send_peer, tb.channel)
    in_link = (tb.recv_peer, rank, tb.channel)
    if any(step.op.receives for step in tb.steps):  # our landing slots are free: this rank has entered the call
        ops.control("signal", facts.kind(rank, tb.recv_peer), gpu.channel_of[in_link])
    ready = False
    for index, step in enumerate(tb.steps):
        if acquires.get((tb.id, index)):
            ops.semaphores("sem_acquire", acquires[(tb.id, index)])
        key = (rank, tb.id, index)
        if step.op.receives:
            ops.control("wait", facts.kind(rank, tb.recv_peer), gpu.channel_of[in_link])
        source = _compute(ops, step, facts.landing.get(key))
        if step.op.sends:
            kind, channel = facts.kind(rank, tb.send_peer), gpu.channel_of[out_link]
            if not ready:  # the receiver has entered this call, so its slots are ours to fill
                ops.control("wait", kind, channel)
                ready = True
            target = facts.targets[key]
            ops.put(source, step.count, kind, channel, gpu.remote_buffer(tb.send_peer, target[0]), target)
            ops.control("signal", kind, channel)
            if kind == "port":  # the proxy reads the source later; flush before it may change
                ops.control("flush", kind, channel)
        if releases.get((tb.id, index)):
            ops.semaphores("sem_release", releases[(tb.id, index)])
    return ops


def _segments(ops: list[dict], first_semaphore: int) -> Iterator[list[dict]]:
    """Yield ``ops`` cut into threadblocks under the limit, chained by semaphores from ``first_semaphore``."""
    if len(ops) <= MAX_OPERATIONS_PER_THREADBLOCK:
        yield ops
        return
    pieces, start = [], 0
    while start < len(ops):
        end = min(start + MAX_OPERATIONS_PER_THREADBLOCK - _CHAIN_OPS, len(ops))
        while end < len(ops) and ops[end]["name"] in ("nop", "signal", "flush"):
            end -= 1  # keep a put with its signal (and flush) on one threadblock
        pieces.append(ops[start:end])
        start = end
    for number, piece in enumerate(pieces):
        head = [{"name": "sem_acquire", "semaphore_ids": [first_semaphore + number - 1]}, {"name": "nop"}]
        tail = [{"name": "nop"}, {"name": "sem_release", "semaphore_ids": [first_semaphore + number]}]
        yield (head if number else []) + piece + (tail if number + 1 < len(pieces) else [])


def _rank_json(algorithm: Algorithm, prog: RankProgram, facts: _Facts) -> dict:
    """Return the ``gpus`` entry of one rank."""
    gpu = _Gpu(prog.rank, facts)
    semaphores = _semaphores(prog)
    count = semaphores[2]
    threadblocks = []
    for tb in sorted(prog.threadblocks, key=lambda t: t.id):
        ops = _threadblock_ops(prog.rank, tb, gpu, facts, semaphores)
        for kind in ("memory", "port"):
            if max(len(ops.channels[kind]), len(ops.remote[kind])) > MAX_CHANNELS_PER_THREADBLOCK:
                raise _fault(algorithm, f"rank {prog.rank} tb {tb.id}", f"too many {kind} channels", "at most 16")
        segments = list(_segments(ops.ops, count))
        count += len(segments) - 1
        if len(segments) > 1:
            logger.debug(
                "rank %d tb %d: %d operations cut into %d threadblocks", prog.rank, tb.id, len(ops.ops), len(segments)
            )
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
        ``"Simple"`` (the default).

    Raises
    ------
    ArgumentError
        LL or another protocol; a topology of another rank count; two threadblocks of a rank on one
        link; a rank over ``MAX_THREADBLOCKS_PER_GPU`` threadblocks or a threadblock over
        ``MAX_CHANNELS_PER_THREADBLOCK`` channels.
    """
    protocol = "Simple" if protocol is None else protocol
    if protocol != "Simple":
        fault = "LL packets are not written yet" if protocol == "LL" else f"protocol {protocol!r}"
        raise _fault(algorithm, "protocol", fault, "'Simple'")
    if topology is not None and topology.num_ranks != algorithm.num_ranks:
        raise _fault(algorithm, "topology", f"{topology.num_ranks} GPUs", f"{algorithm.num_ranks} ranks")
    nodes = tuple(0 if topology is None else topology.node_of(rank) for rank in range(algorithm.num_ranks))
    senders, receivers = _links(algorithm)
    landing, scratch = _landings(algorithm)
    targets = _put_targets(algorithm, receivers, landing)
    facts = _Facts(nodes, tuple(sorted(set(senders) | set(receivers))), landing, targets, scratch)
    if algorithm.max_bytes is not None and algorithm.max_bytes <= 1:
        raise _fault(algorithm, "max_bytes", f"{algorithm.max_bytes}", "a band holding some size above 0")
    return {
        "name": algorithm.name,
        "collective": algorithm.collective.value,
        "protocol": protocol,
        "inplace": algorithm.inplace,
        "reuse_resources": False,
        "gpus": [_rank_json(algorithm, prog, facts) for prog in sorted(algorithm.ranks, key=lambda p: p.rank)],
        "num_threads_per_block": THREADS_PER_BLOCK,
        "use_double_scratch_buffer": False,
        "buffer_alignment": BUFFER_ALIGNMENT_BYTES,
        "min_message_size": algorithm.min_bytes,
        # MSCCL++ tests the upper end inclusively (execution_plan.cc checkMessageSize); ours is exclusive
        "max_message_size": MAX_MESSAGE_SIZE if algorithm.max_bytes is None else algorithm.max_bytes - 1,
    }
