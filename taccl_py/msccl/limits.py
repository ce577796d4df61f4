"""Limits the MSCCL runtimes put on an XML algorithm, named once with their source.

Sources: Azure/msccl-executor-nccl ``src/include/msccl/msccl_struct.h`` (MSCCL_MAX_NUM_STEPS 64,
MSCCL_MAX_NUM_THREAD_BLOCKS 64, MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL 32, MSCCL_MAX_COUNT 72),
NCCL's MAXCHANNELS (32), and RCCL ``src/misc/msccl/msccl_parser.cc``, which rejects a step
whose ``cnt`` is not below MSCCL_MAX_COUNT, a threadblock id at or above the thread-block limit,
a gap in threadblock ids, a peer equal to the GPU itself, and more sending (or receiving)
threadblocks on one channel than the per-channel limit. RCCL's later releases raise the step
limit to 256; we keep the stricter figure so a file loads everywhere.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from taccl_py.errors import ArgumentError

__all__ = [
    "MAX_STEPS_PER_THREADBLOCK",
    "MAX_THREADBLOCKS_PER_GPU",
    "MAX_THREADBLOCKS_PER_CHANNEL",
    "MAX_COUNT",
    "MAX_CHANNELS",
    "check_gpu_limits",
]

MAX_STEPS_PER_THREADBLOCK = 64  # steps (nops included) per <tb>
MAX_THREADBLOCKS_PER_GPU = 64  # <tb> elements per <gpu>
MAX_THREADBLOCKS_PER_CHANNEL = 32  # sending (and, separately, receiving) <tb>s per channel
MAX_COUNT = 72  # a step's cnt must be below this: at most 71 chunks per step
MAX_CHANNELS = 32  # channels 0..31


def check_gpu_limits(
    name: str,
    rank: int,
    threadblocks: Sequence[tuple[int, int | None, int | None, int, int]],
) -> None:
    """Raise ``ArgumentError`` naming the limit, rank and threadblock a GPU's program breaks.

    ``threadblocks`` holds (id, send peer, recv peer, channel, number of steps) per threadblock,
    after dependency nops and count splitting were added. Counts are split before this check.
    """
    if len(threadblocks) > MAX_THREADBLOCKS_PER_GPU:
        raise ArgumentError(
            name,
            f"rank {rank}",
            f"{len(threadblocks)} threadblocks",
            f"at most {MAX_THREADBLOCKS_PER_GPU} threadblocks per GPU (MSCCL_MAX_NUM_THREAD_BLOCKS)",
        )
    for tb_id, send, recv, channel, num_steps in threadblocks:
        where = f"rank {rank} tb {tb_id}"
        if num_steps > MAX_STEPS_PER_THREADBLOCK:
            raise ArgumentError(
                name,
                where,
                f"{num_steps} steps (dependency nops and split counts included)",
                f"at most {MAX_STEPS_PER_THREADBLOCK} steps per threadblock (MSCCL_MAX_NUM_STEPS)",
            )
        if not 0 <= channel < MAX_CHANNELS:
            raise ArgumentError(name, where, f"channel {channel}", f"a channel in 0..{MAX_CHANNELS - 1} (MAXCHANNELS)")
        if rank in (send, recv):
            raise ArgumentError(name, where, f"peer {rank} is the GPU itself", "a peer on another GPU")
    for role, index in (("sending", 1), ("receiving", 2)):
        per_channel = Counter(tb[3] for tb in threadblocks if tb[index] is not None)
        for channel, count in sorted(per_channel.items()):
            if count > MAX_THREADBLOCKS_PER_CHANNEL:
                raise ArgumentError(
                    name,
                    f"rank {rank} channel {channel}",
                    f"{count} {role} threadblocks",
                    f"at most {MAX_THREADBLOCKS_PER_CHANNEL} per channel (MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL)",
                )
