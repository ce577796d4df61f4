"""The MSCCL++ execution plan as frozen dataclasses: plan, GPUs, threadblocks, operations.

An execution plan is the JSON file MSCCL++'s Python DSL writes and its executor runs
(microsoft/mscclpp ``python/mscclpp/language/program.py``, read by
``src/core/executor/execution_plan.cc``). Buffers are counted in chunks; a chunk's size in bytes
is fixed only when the executor is given a message size, so nothing here carries bytes except a
pipeline's ``unit_size`` and the message-size window.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "BufferKind",
    "ChannelKind",
    "OpName",
    "Protocol",
    "BufferRef",
    "ThreadblockGroup",
    "Operation",
    "RankGroup",
    "Channel",
    "RemoteBuffer",
    "ThreadblockChannels",
    "RemoteBufferRefs",
    "Threadblock",
    "Gpu",
    "ExecutionPlan",
    "MAX_MESSAGE_SIZE",
    "MAX_THREADS_PER_BLOCK",
    "generate_mscclpp_plan_json",
]

# The executor's default upper bound on the message size (``std::numeric_limits<uint64_t>::max()``), bytes.
MAX_MESSAGE_SIZE = 2**64 - 1
# The executor kernel is compiled ``__launch_bounds__(1024, 1)`` (microsoft/mscclpp
# src/core/include/execution_kernel.hpp, ``executionKernel``): a launch with more threads per block
# fails; 1024 is also CUDA's per-block maximum.
MAX_THREADS_PER_BLOCK = 1024


class BufferKind(str, Enum):
    """A GPU's buffers; values are the plan's spelling."""

    INPUT = "i"
    OUTPUT = "o"
    SCRATCH = "s"


class ChannelKind(str, Enum):
    """How a threadblock reaches a peer: GPU stores (memory), a proxy (port), NVLink SHARP (switch)."""

    MEMORY = "memory"
    PORT = "port"
    SWITCH = "switch"
    NONE = "none"


class Protocol(str, Enum):
    """Simple: data then a signal; LL: every 8 bytes travel with a flag (packets)."""

    SIMPLE = "Simple"
    LL = "LL"


class OpName(str, Enum):
    """The operations the executor knows (``getOpType`` in ``execution_plan.cc``); values are the plan's names."""

    NOP = "nop"
    BARRIER = "barrier"
    PUT = "put"
    PUT_WITH_SIGNAL = "pws"
    PUT_WITH_SIGNAL_AND_FLUSH = "pwsf"
    GET = "get"
    COPY = "copy"
    SIGNAL = "signal"
    WAIT = "wait"
    RELAXED_SIGNAL = "rlxsignal"
    RELAXED_WAIT = "rlxwait"
    FLUSH = "flush"
    REDUCE = "re"
    REDUCE_SEND = "res"
    READ_REDUCE = "rre"
    READ_REDUCE_SEND = "rres"
    PUT_PACKETS = "ppkt"
    READ_PUT_PACKETS = "rppkt"
    REDUCE_SEND_PACKETS = "respkt"
    COPY_PACKETS = "cpkt"
    UNPACK_PACKETS = "upkt"
    REDUCE_PACKETS = "repkt"
    REDUCE_COPY_PACKETS = "recpkt"
    REDUCE_COPY_SEND_PACKETS = "recspkt"
    MULTI_LOAD_REDUCE_STORE = "glres"
    MULTI_STORE = "gstore"
    MULTI_STORE_PACKETS = "gstorepkt"
    SEM_ACQUIRE = "sem_acquire"
    SEM_RELEASE = "sem_release"
    PIPELINE = "pipeline"


@dataclass(frozen=True)
class BufferRef:
    """Chunks ``index`` .. ``index + size - 1`` of one buffer, named one of three ways.

    Exactly one of ``buffer`` (a local buffer), ``buffer_id`` (the threadblock's remote buffer of
    that number for the op's channel type) and ``switch_channel_id`` (the threadblock's switch
    channel of that number) is set.
    """

    index: int
    size: int
    buffer: BufferKind | None = None
    buffer_id: int | None = None
    switch_channel_id: int | None = None


@dataclass(frozen=True)
class ThreadblockGroup:
    """An op split over ``tbg_size`` threadblocks; this one does part ``tb_id`` of every range."""

    tb_id: int
    tbg_size: int


@dataclass(frozen=True)
class Operation:
    """One op of a threadblock; fields absent from the file are None (a pipeline's body is ``ops``).

    ``unit_size`` (bytes) and ``num_chunks`` are a pipeline's ``iter_context``.
    """

    name: OpName
    src: tuple[BufferRef, ...] | None = None
    dst: tuple[BufferRef, ...] | None = None
    channel_type: ChannelKind | None = None
    channel_ids: tuple[int, ...] | None = None
    reduce_op: str | None = None
    tbg: ThreadblockGroup | None = None
    barrier_id: int | None = None
    num_threadblocks: int | None = None
    semaphore_ids: tuple[int, ...] | None = None
    unit_size: int | None = None
    num_chunks: int | None = None
    ops: tuple[Operation, ...] = ()

    @property
    def iter_context_present(self) -> bool:
        """Return True when the op carries a pipeline's ``iter_context``."""
        return self.unit_size is not None


@dataclass(frozen=True)
class RankGroup:
    """The ranks one switch channel spans (``size`` of them)."""

    size: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Channel:
    """A GPU's channel entry: one channel per peer in ``connected_to``, or switch rank groups over ``buffer``."""

    channel_type: ChannelKind
    connected_to: tuple[int, ...] = ()
    buffer: BufferKind | None = None
    rank_groups: tuple[RankGroup, ...] = ()


@dataclass(frozen=True)
class RemoteBuffer:
    """A peer's buffer this GPU reaches, through the listed channel types."""

    rank: int
    buffer: BufferKind
    access_channel_types: tuple[ChannelKind, ...]


@dataclass(frozen=True)
class ThreadblockChannels:
    """The GPU-level channels of one type a threadblock uses, in the order its ops number them."""

    channel_type: ChannelKind
    channel_ids: tuple[int, ...]
    buffer: BufferKind | None = None


@dataclass(frozen=True)
class RemoteBufferRefs:
    """The GPU-level remote buffers a threadblock reaches through one channel type, in op numbering order."""

    access_channel_type: ChannelKind
    remote_buffer_ids: tuple[int, ...]


@dataclass(frozen=True)
class Threadblock:
    """One threadblock: its ops in program order, its channels and remote buffers."""

    id: int
    ops: tuple[Operation, ...]
    channels: tuple[ThreadblockChannels, ...] = ()
    remote_buffer_refs: tuple[RemoteBufferRefs, ...] = ()


@dataclass(frozen=True)
class Gpu:
    """One rank: buffer sizes in chunks, channels, remote buffers, semaphore initial values, threadblocks."""

    id: int
    input_chunks: int
    output_chunks: int
    scratch_chunks: int
    threadblocks: tuple[Threadblock, ...]
    channels: tuple[Channel, ...] = ()
    remote_buffers: tuple[RemoteBuffer, ...] = ()
    semaphores: tuple[int, ...] = ()

    def chunks(self, buffer: BufferKind) -> int:
        """Return how many chunks ``buffer`` holds on this GPU."""
        if buffer is BufferKind.INPUT:
            return self.input_chunks
        if buffer is BufferKind.OUTPUT:
            return self.output_chunks
        return self.scratch_chunks


@dataclass(frozen=True)
class ExecutionPlan:
    """A whole MSCCL++ execution plan; message sizes in bytes, ``collective`` as the file spells it."""

    name: str
    collective: str
    protocol: Protocol
    inplace: bool
    gpus: tuple[Gpu, ...]
    reuse_resources: bool = False
    num_threads_per_block: int = 1024
    use_double_scratch_buffer: bool = False
    buffer_alignment: int = 16
    min_message_size: int = 0
    max_message_size: int = MAX_MESSAGE_SIZE


def generate_mscclpp_plan_json(plan: ExecutionPlan, indent: int | None = 2) -> str:
    """Return ``plan`` as MSCCL++ execution-plan JSON, fields laid out as MSCCL++'s DSL writes them.

    ``parse_mscclpp_plan`` of the result equals ``plan``. Fields the file left out come back with
    the value the executor assumed for them.
    """
    document = {
        "name": plan.name,
        "collective": plan.collective,
        "protocol": plan.protocol.value,
        "inplace": plan.inplace,
        "reuse_resources": plan.reuse_resources,
        "gpus": [_gpu_json(gpu) for gpu in plan.gpus],
        "num_threads_per_block": plan.num_threads_per_block,
        "use_double_scratch_buffer": plan.use_double_scratch_buffer,
        "buffer_alignment": plan.buffer_alignment,
        "min_message_size": plan.min_message_size,
        "max_message_size": plan.max_message_size,
    }
    return json.dumps(document, indent=indent) + "\n"


def _gpu_json(gpu: Gpu) -> dict:
    channels = []
    for channel in gpu.channels:
        if channel.channel_type is ChannelKind.SWITCH:
            entry = {"channel_type": channel.channel_type.value}
            if channel.buffer is not None:
                entry["buffer_type"] = channel.buffer.value
            entry["rank_groups"] = [{"size": g.size, "ranks": list(g.ranks)} for g in channel.rank_groups]
        else:
            entry = {"channel_type": channel.channel_type.value, "connected_to": list(channel.connected_to)}
        channels.append(entry)
    return {
        "id": gpu.id,
        "input_chunks": gpu.input_chunks,
        "output_chunks": gpu.output_chunks,
        "scratch_chunks": gpu.scratch_chunks,
        "threadblocks": [_threadblock_json(tb) for tb in gpu.threadblocks],
        "channels": channels,
        "remote_buffers": [
            {"rank": b.rank, "type": b.buffer.value, "access_channel_types": [c.value for c in b.access_channel_types]}
            for b in gpu.remote_buffers
        ],
        "semaphores": [{"init_value": value} for value in gpu.semaphores],
    }


def _threadblock_json(tb: Threadblock) -> dict:
    channels = []
    for entry in tb.channels:
        channel = {"channel_type": entry.channel_type.value, "channel_ids": list(entry.channel_ids)}
        if entry.buffer is not None:
            channel["buff"] = entry.buffer.value
        channels.append(channel)
    refs = [
        {"access_channel_type": r.access_channel_type.value, "remote_buffer_ids": list(r.remote_buffer_ids)}
        for r in tb.remote_buffer_refs
    ]
    return {
        "id": tb.id,
        "ops": [_op_json(op) for op in tb.ops],
        "channels": channels,
        "remote_buffer_refs": refs,
    }


def _ref_json(ref: BufferRef) -> dict:
    if ref.buffer_id is not None:
        return {"buffer_id": ref.buffer_id, "index": ref.index, "size": ref.size}
    if ref.switch_channel_id is not None:
        return {"switch_channel_id": ref.switch_channel_id, "index": ref.index, "size": ref.size}
    return {"type": ref.buffer.value, "index": ref.index, "size": ref.size}


def _op_json(op: Operation) -> dict:
    entry: dict = {"name": op.name.value}
    if op.iter_context_present:
        entry["iter_context"] = {"unit_size": op.unit_size, "num_chunks": op.num_chunks}
    if op.name is OpName.PIPELINE:
        entry["ops"] = [_op_json(inner) for inner in op.ops]
    if op.src is not None:
        entry["src_buff"] = [_ref_json(ref) for ref in op.src]
    if op.dst is not None:
        entry["dst_buff"] = [_ref_json(ref) for ref in op.dst]
    if op.channel_ids is not None:
        entry["channel_ids"] = list(op.channel_ids)
    if op.channel_type is not None:
        entry["channel_type"] = op.channel_type.value
    if op.reduce_op is not None:
        entry["reduce_op"] = op.reduce_op
    if op.tbg is not None:
        entry["tbg_info"] = {"tb_id": op.tbg.tb_id, "tbg_size": op.tbg.tbg_size}
    if op.barrier_id is not None:
        entry["barrier_id"] = op.barrier_id
    if op.num_threadblocks is not None:
        entry["num_threadblocks"] = op.num_threadblocks
    if op.semaphore_ids is not None:
        entry["semaphore_ids"] = list(op.semaphore_ids)
    return entry
