"""Check that every reference of a parsed MSCCL++ plan names something that exists.

A peer or rank must be another GPU of the plan; a threadblock's channel ids must name the GPU's
channels of that type (memory and port channels are numbered over the peers of all
``connected_to`` lists, switch channels over all rank groups, as ``execution_plan.cc`` flattens
them); an op's ``channel_ids`` must name the threadblock's channels of its type; a remote
``buffer_id`` must name one of the threadblock's remote buffers for the op's channel type; chunk
ranges must lie inside their buffer (a remote buffer's size is that of its GPU); semaphore ids
and barrier sizes must exist. Each fault is one ``FormatError`` line.
"""

from __future__ import annotations

from taccl_py.errors import FormatError
from taccl_py.mscclpp.plan import BufferKind, BufferRef, ChannelKind, ExecutionPlan, Gpu, Operation, Threadblock

__all__ = ["check_references", "switch_channels", "threadblock_channels", "threadblock_remote_buffers"]


def check_references(plan: ExecutionPlan, source: str) -> None:
    """Raise ``FormatError`` at the first reference to a GPU, channel, buffer or chunk that does not exist."""
    for gpu in plan.gpus:
        here = f"gpus[{gpu.id}]"
        counts = _channel_counts(gpu)
        for i, channel in enumerate(gpu.channels):
            peers = channel.connected_to + tuple(r for g in channel.rank_groups for r in g.ranks)
            if channel.channel_type is not ChannelKind.SWITCH and gpu.id in peers:
                raise FormatError(source, f"{here}.channels[{i}].connected_to", f"GPU {gpu.id} itself", "other GPUs")
        for i, remote in enumerate(gpu.remote_buffers):
            if remote.rank == gpu.id:
                raise FormatError(source, f"{here}.remote_buffers[{i}].rank", f"GPU {gpu.id} itself", "another GPU")
        for tb in gpu.threadblocks:
            _check_threadblock(plan, gpu, tb, counts, source)


def _channel_counts(gpu: Gpu) -> dict[ChannelKind, int]:
    counts = {kind: 0 for kind in ChannelKind}
    for channel in gpu.channels:
        extra = len(channel.rank_groups) if channel.channel_type is ChannelKind.SWITCH else len(channel.connected_to)
        counts[channel.channel_type] += extra
    return counts


def _check_threadblock(plan: ExecutionPlan, gpu: Gpu, tb: Threadblock, counts: dict, source: str) -> None:
    where = f"gpus[{gpu.id}].threadblocks[{tb.id}]"
    for i, entry in enumerate(tb.channels):
        for channel_id in entry.channel_ids:
            if channel_id >= counts[entry.channel_type]:
                raise FormatError(
                    source,
                    f"{where}.channels[{i}].channel_ids",
                    f"{entry.channel_type.value} channel {channel_id}",
                    f"one of the GPU's {counts[entry.channel_type]} {entry.channel_type.value} channels",
                )
    for i, entry in enumerate(tb.remote_buffer_refs):
        for buffer_id in entry.remote_buffer_ids:
            ok = buffer_id < len(gpu.remote_buffers)
            if not ok or entry.access_channel_type not in gpu.remote_buffers[buffer_id].access_channel_types:
                raise FormatError(
                    source,
                    f"{where}.remote_buffer_refs[{i}].remote_buffer_ids",
                    f"remote buffer {buffer_id}",
                    f"one of the GPU's {len(gpu.remote_buffers)} remote buffers open to "
                    f"{entry.access_channel_type.value} channels",
                )
    for i, op in enumerate(tb.ops):
        _check_op(plan, gpu, tb, op, f"{where}.ops[{i}]", source)
        for j, inner in enumerate(op.ops):
            _check_op(plan, gpu, tb, inner, f"{where}.ops[{i}].ops[{j}]", source)


def threadblock_channels(tb: Threadblock, kind: ChannelKind | None) -> tuple[int, ...]:
    """Return the GPU-level ids of the threadblock's channels of ``kind``, in the order its ops number them."""
    return tuple(c for entry in tb.channels if entry.channel_type is kind for c in entry.channel_ids)


def threadblock_remote_buffers(tb: Threadblock, kind: ChannelKind | None) -> tuple[int, ...]:
    """Return the GPU-level ids of the remote buffers the threadblock reaches through ``kind``, in op order."""
    return tuple(
        b for entry in tb.remote_buffer_refs if entry.access_channel_type is kind for b in entry.remote_buffer_ids
    )


def _check_op(plan: ExecutionPlan, gpu: Gpu, tb: Threadblock, op: Operation, where: str, source: str) -> None:
    kind = op.channel_type
    if op.channel_ids is not None:
        available = len(threadblock_channels(tb, kind))
        for channel_id in op.channel_ids:
            if channel_id >= available:
                name = kind.value if kind is not None else "untyped"
                raise FormatError(
                    source,
                    f"{where}.channel_ids",
                    f"{name} channel {channel_id}",
                    f"one of the threadblock's {available} {name} channels",
                )
    for semaphore in op.semaphore_ids or ():
        if semaphore >= len(gpu.semaphores):
            raise FormatError(
                source,
                f"{where}.semaphore_ids",
                f"semaphore {semaphore}",
                f"one of the GPU's {len(gpu.semaphores)} semaphores",
            )
    if op.num_threadblocks is not None and not 1 <= op.num_threadblocks <= len(gpu.threadblocks):
        raise FormatError(
            source,
            f"{where}.num_threadblocks",
            f"{op.num_threadblocks} threadblocks",
            f"1..{len(gpu.threadblocks)} (the GPU's threadblocks)",
        )
    for side, refs in (("src_buff", op.src or ()), ("dst_buff", op.dst or ())):
        for i, ref in enumerate(refs):
            _check_ref(plan, gpu, tb, op, ref, f"{where}.{side}[{i}]", source)


def _check_ref(
    plan: ExecutionPlan, gpu: Gpu, tb: Threadblock, op: Operation, ref: BufferRef, where: str, source: str
) -> None:
    owner, buffer = gpu, ref.buffer
    if ref.buffer_id is not None:
        ids = threadblock_remote_buffers(tb, op.channel_type)
        if ref.buffer_id >= len(ids):
            raise FormatError(
                source,
                f"{where}.buffer_id",
                f"remote buffer {ref.buffer_id}",
                f"one of the threadblock's {len(ids)} remote buffers for this channel type",
            )
        remote = gpu.remote_buffers[ids[ref.buffer_id]]
        owner, buffer = plan.gpus[remote.rank], remote.buffer
    elif ref.switch_channel_id is not None:
        ids = threadblock_channels(tb, ChannelKind.SWITCH)
        if op.channel_type is not ChannelKind.SWITCH or ref.switch_channel_id >= len(ids):
            raise FormatError(
                source,
                f"{where}.switch_channel_id",
                f"switch channel {ref.switch_channel_id}",
                f"one of the threadblock's {len(ids)} switch channels, on a switch op",
            )
        buffer = switch_channels(gpu)[ids[ref.switch_channel_id]][0]
    limit = owner.chunks(buffer)
    if ref.index + ref.size > limit:
        raise FormatError(
            source,
            f"{where}.index",
            f"chunks {ref.index}..{ref.index + ref.size - 1}",
            f"chunks inside GPU {owner.id}'s {buffer.value} buffer of {limit}",
        )


def switch_channels(gpu: Gpu) -> tuple[tuple[BufferKind, tuple[int, ...]], ...]:
    """Return the GPU's switch channels as the executor numbers them: (buffer, ranks) per rank group."""
    return tuple(
        (channel.buffer, group.ranks)
        for channel in gpu.channels
        if channel.channel_type is ChannelKind.SWITCH
        for group in channel.rank_groups
    )
