"""Limits the MSCCL runtimes put on an XML algorithm, per runtime, named once with their source.

Each runtime we export for compiles fixed-size tables into its kernels (``msccl_struct.h`` or
``msccl.h``); a file beyond them is refused when the runtime loads it:

=====================  ========  ===========  ==================  ========  =====  ===========
runtime                steps/tb  tbs per GPU  tbs per channel      channels  cnt <  dialect
=====================  ========  ===========  ==================  ========  =====  ===========
msccl-executor-nccl    64        1024         32                  32        72     new
msccl (microsoft)      256       216          32                  32        72     old
rccl                   64        64           32                  32        72     new
portable (default)     64        64           32                  32        72     new
=====================  ========  ===========  ==================  ========  =====  ===========

Sources (``MSCCL_MAX_NUM_STEPS``, ``MSCCL_MAX_NUM_THREAD_BLOCKS``,
``MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL``, ``MSCCL_MAX_COUNT``, ``MAXCHANNELS``):

* Azure/msccl-executor-nccl ``src/include/msccl/msccl_struct.h`` @206e0c49: 64 steps, thread
  blocks ``32 * MAXCHANNELS`` = 1024, 32 per channel, count 72; NCCL's ``MAXCHANNELS`` 32
  (``src/include/devcomm.h``).
* microsoft/msccl ``src/include/msccl.h`` @01cc7cfe: 256 steps, ``108*2`` = 216 thread blocks
  (two per A100 SM), 32 per channel, count 72; ``MAXCHANNELS`` 32.
* ROCm/rccl ``src/include/msccl/msccl_struct.h`` @b463f536: 64 steps, 64 thread blocks, 32 per
  channel, count 72; RCCL's ``msccl_parser.cc`` also rejects a threadblock id at or above the
  thread-block limit, a gap in ids and a peer equal to the GPU itself. ``MAXCHANNELS`` 32 in its
  ``devcomm.h`` (later releases allow more; 32 loads everywhere).
* portable: the strictest figure of each column, so a file loads in every runtime above. It is
  what export checked before runtimes could be named, and stays the default.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from taccl_py.errors import ArgumentError
from taccl_py.msccl.dialect import Dialect

__all__ = [
    "MAX_STEPS_PER_THREADBLOCK",
    "MAX_THREADBLOCKS_PER_GPU",
    "MAX_THREADBLOCKS_PER_CHANNEL",
    "MAX_COUNT",
    "MAX_CHANNELS",
    "DEFAULT_RUNTIME",
    "Runtime",
    "RuntimeLimits",
    "parse_runtime",
    "runtime_limits",
    "check_gpu_limits",
    "check_steps_per_threadblock",
]

# The portable limits (the strictest of every runtime below), read at each check.
MAX_STEPS_PER_THREADBLOCK = 64  # steps (nops included) per <tb>
MAX_THREADBLOCKS_PER_GPU = 64  # <tb> elements per <gpu>
MAX_THREADBLOCKS_PER_CHANNEL = 32  # sending (and, separately, receiving) <tb>s per channel
MAX_COUNT = 72  # a step's cnt must be below this: at most 71 chunks per step
MAX_CHANNELS = 32  # channels 0..31


class Runtime(str, Enum):
    """An MSCCL runtime an XML file is written for; values are the ``--runtime`` spellings."""

    PORTABLE = "portable"
    EXECUTOR = "msccl-executor-nccl"
    MSCCL = "msccl"
    RCCL = "rccl"


DEFAULT_RUNTIME = Runtime.PORTABLE


@dataclass(frozen=True)
class RuntimeLimits:
    """What one runtime accepts: steps per threadblock, threadblocks per GPU and per channel, channels, count."""

    runtime: Runtime
    max_steps_per_threadblock: int
    max_threadblocks_per_gpu: int
    max_threadblocks_per_channel: int
    max_channels: int
    max_count: int
    dialect: Dialect


_RUNTIME_LIMITS = {
    Runtime.EXECUTOR: RuntimeLimits(Runtime.EXECUTOR, 64, 32 * 32, 32, 32, 72, Dialect.NEW),
    Runtime.MSCCL: RuntimeLimits(Runtime.MSCCL, 256, 108 * 2, 32, 32, 72, Dialect.OLD),
    Runtime.RCCL: RuntimeLimits(Runtime.RCCL, 64, 64, 32, 32, 72, Dialect.NEW),
}


def parse_runtime(runtime: Runtime | str) -> Runtime:
    """Return the ``Runtime`` that ``runtime`` names; raise ``ArgumentError`` for any other value."""
    try:
        return Runtime(runtime)
    except ValueError:
        raise ArgumentError(None, "runtime", f"{runtime!r}", "one of " + ", ".join(r.value for r in Runtime)) from None


def runtime_limits(runtime: Runtime | str = DEFAULT_RUNTIME) -> RuntimeLimits:
    """Return the limits of ``runtime`` (portable: this module's ``MAX_*`` figures, read now).

    >>> runtime_limits("msccl").max_steps_per_threadblock, runtime_limits().max_threadblocks_per_gpu
    (256, 64)
    """
    runtime = parse_runtime(runtime)
    if runtime is not Runtime.PORTABLE:
        return _RUNTIME_LIMITS[runtime]
    return RuntimeLimits(
        Runtime.PORTABLE,
        MAX_STEPS_PER_THREADBLOCK,
        MAX_THREADBLOCKS_PER_GPU,
        MAX_THREADBLOCKS_PER_CHANNEL,
        MAX_CHANNELS,
        MAX_COUNT,
        Dialect.NEW,
    )


def _runtime_label(limits: RuntimeLimits) -> str:
    """Return how a message names the runtime: ``runtime rccl`` or ``every MSCCL runtime (runtime portable)``."""
    if limits.runtime is Runtime.PORTABLE:
        return "every MSCCL runtime (runtime portable)"
    return f"runtime {limits.runtime.value}"


def check_steps_per_threadblock(
    name: str | None, where: str, num_steps: int, fault: str, limits: RuntimeLimits
) -> None:
    """Raise ``ArgumentError`` when ``num_steps`` steps on one threadblock are more than ``limits`` allow.

    ``fault`` says what the count is (``"127 steps"``, ``"at least 504 steps"``).
    """
    if num_steps > limits.max_steps_per_threadblock:
        raise ArgumentError(
            name,
            where,
            fault,
            f"at most {limits.max_steps_per_threadblock} steps per threadblock for {_runtime_label(limits)} "
            "(MSCCL_MAX_NUM_STEPS)",
        )


def check_gpu_limits(
    name: str,
    rank: int,
    threadblocks: Sequence[tuple[int, int | None, int | None, int, int]],
    limits: RuntimeLimits | None = None,
) -> None:
    """Raise ``ArgumentError`` naming the limit, rank and threadblock a GPU's program breaks.

    ``threadblocks`` holds (id, send peer, recv peer, channel, number of steps) per threadblock,
    after dependency nops and count splitting were added. Counts are split before this check.
    ``limits`` default to the portable ones.
    """
    limits = runtime_limits() if limits is None else limits
    runtime = _runtime_label(limits)
    if len(threadblocks) > limits.max_threadblocks_per_gpu:
        raise ArgumentError(
            name,
            f"rank {rank}",
            f"{len(threadblocks)} threadblocks",
            f"at most {limits.max_threadblocks_per_gpu} threadblocks per GPU for {runtime} "
            "(MSCCL_MAX_NUM_THREAD_BLOCKS)",
        )
    for tb_id, send, recv, channel, num_steps in threadblocks:
        where = f"rank {rank} tb {tb_id}"
        check_steps_per_threadblock(
            name, where, num_steps, f"{num_steps} steps (dependency nops and split counts included)", limits
        )
        if not 0 <= channel < limits.max_channels:
            raise ArgumentError(
                name, where, f"channel {channel}", f"a channel in 0..{limits.max_channels - 1} (MAXCHANNELS)"
            )
        if rank in (send, recv):
            raise ArgumentError(name, where, f"peer {rank} is the GPU itself", "a peer on another GPU")
    for role, index in (("sending", 1), ("receiving", 2)):
        per_channel = Counter(tb[3] for tb in threadblocks if tb[index] is not None)
        for channel, count in sorted(per_channel.items()):
            if count > limits.max_threadblocks_per_channel:
                raise ArgumentError(
                    name,
                    f"rank {rank} channel {channel}",
                    f"{count} {role} threadblocks",
                    f"at most {limits.max_threadblocks_per_channel} per channel for {runtime} "
                    "(MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL)",
                )
