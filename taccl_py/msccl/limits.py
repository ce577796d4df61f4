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

msccl-executor-nccl's XML reader (and so portable) also caps each rank's parse tree
(``src/include/msccl/msccl_parser.h`` @c6f6b36d:22-23, ``MAX_SUBS`` 1024, ``MAX_NODES`` 4096). Each
rank parses the whole file (``mscclAlgoXmlLoad``) but keeps only the elements it handles: the
``<algo>``, every ``<gpu>`` and the ``<tb>`` and ``<step>`` elements of its own GPU; comments and other
GPUs' elements take no node. The reader fails once 4096 nodes are kept and it reads on (it always
does: closing tags follow), so a rank may hold at most 4095: 1 + GPUs + its threadblocks + its steps
(``mscclXmlLoadSub``, msccl_parser.cc:166-206). A node's children go into a 1024-entry array with no
bound check, so at most 1024 GPUs, threadblocks per GPU and steps per threadblock.

Protocols (``proto``): every runtime runs Simple, LL and LL128 kernels for an MSCCL algorithm, with
two exceptions in RCCL, which depend on the GPU (``rccl_gpu_arch``): LL128 exists only on gfx90a,
gfx942 and gfx950 (and in builds with ``ENABLE_LL128``), LL not on gfx12. Each pass of the MSCCL
kernel moves at most one FIFO step of the protocol's buffer per chunk; a chunk larger than that is
cut into several passes, each running the whole program again. The simulator runs the program
once, so LL and LL128 are only offered where every chunk fits one pass:

=====================  ======================  ==============  ================  ==========
runtime                protocols               LL bytes/pass   LL128 bytes/pass  LL128 line
=====================  ======================  ==============  ================  ==========
msccl-executor-nccl    Simple, LL, LL128       32768           576000            120/128
msccl (microsoft)      Simple, LL, LL128       32768           576000            120/128
rccl                   Simple, LL (, LL128)    16384           50176             56/64
portable (default)     those all three run     16384           50176             56/64
=====================  ======================  ==============  ================  ==========

Sources: the buffers are NCCL's ``DEFAULT_LL_BUFFSIZE`` = ``NCCL_LL_LINES_PER_THREAD`` (8) x
``NCCL_LL_MAX_NTHREADS`` x ``NCCL_STEPS`` (8) x 16 bytes and ``DEFAULT_LL128_BUFFSIZE`` =
``NCCL_LL128_ELEMS_PER_THREAD`` x ``NCCL_LL128_MAX_NTHREADS`` x ``NCCL_STEPS`` x 8 bytes
(NVIDIA/nccl ``src/init.cc`` @b6475625); a pass moves ``buffer / NCCL_STEPS`` bytes, half of it data
for LL and ``DATAELEMS / LINEELEMS`` for LL128 (RCCL ``src/misc/msccl/msccl_setup.cc``
``mscclSetupCount`` @9e22c79d; msccl-executor-nccl ``src/device/msccl_kernel.cu`` ``chunkSize``).
msccl-executor-nccl ``src/include/device.h`` @8959f0e5 and microsoft/msccl ``src/include/devcomm.h``
@0696e990: 512 LL threads, 640 LL128 threads x 120 elements, 128-byte LL128 lines (524288 and
4915200 bytes). ROCm/rccl ``src/include/device.h`` @0123763f: 256 threads, 28 LL128 elements,
64-byte lines (262144 and 458752 bytes). RCCL's LL128 and LL rules: ``src/graph/tuning.cc``
@9e22c79d (LL128 enabled only for gfx90a, gfx942, gfx950 with ``ENABLE_LL128``; LL off on gfx12)
and ``src/device/generate.py`` (LL128 kernels built only for those architectures).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from taccl_py.errors import ArgumentError
from taccl_py.msccl.dialect import Dialect, Protocol

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
    "check_parse_tree",
    "MAX_PARSE_NODES",
    "MAX_PARSE_CHILDREN",
    "NCCL_STEPS",
    "RCCL_LL128_GPU_ARCHS",
    "ProtocolLimits",
    "protocol_limits",
    "protocol_refusal",
    "check_protocol",
]

# The portable limits (the strictest of every runtime below), read at each check.
MAX_STEPS_PER_THREADBLOCK = 64  # steps (nops included) per <tb>
MAX_THREADBLOCKS_PER_GPU = 64  # <tb> elements per <gpu>
MAX_THREADBLOCKS_PER_CHANNEL = 32  # sending (and, separately, receiving) <tb>s per channel
MAX_COUNT = 72  # a step's cnt must be below this: at most 71 chunks per step
MAX_CHANNELS = 32  # channels 0..31
# msccl-executor-nccl's XML reader, per rank: MAX_NODES 4096 (it fails on reaching it) and MAX_SUBS 1024
MAX_PARSE_NODES = 4096 - 1
MAX_PARSE_CHILDREN = 1024


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
    max_parse_nodes: int | None = None  # elements one rank's XML reader keeps (None: no such limit)
    max_parse_children: int | None = None  # children of one element


_RUNTIME_LIMITS = {
    Runtime.EXECUTOR: RuntimeLimits(
        Runtime.EXECUTOR, 64, 32 * 32, 32, 32, 72, Dialect.NEW, MAX_PARSE_NODES, MAX_PARSE_CHILDREN
    ),
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
        MAX_PARSE_NODES,
        MAX_PARSE_CHILDREN,
    )


def _runtime_label(limits: RuntimeLimits | ProtocolLimits) -> str:
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
    num_gpus: int | None = None,
) -> None:
    """Raise ``ArgumentError`` naming the limit, rank and threadblock a GPU's program breaks.

    ``threadblocks`` holds (id, send peer, recv peer, channel, number of steps) per threadblock,
    after dependency nops and count splitting were added. Counts are split before this check.
    ``limits`` default to the portable ones; ``num_gpus`` (the file's ``<gpu>`` count) also checks
    the XML reader's parse tree (``check_parse_tree``).
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
    if num_gpus is not None:
        check_parse_tree(name, rank, num_gpus, [tb[4] for tb in threadblocks], limits)


def check_parse_tree(name: str, rank: int, num_gpus: int, steps: Sequence[int], limits: RuntimeLimits) -> None:
    """Raise ``ArgumentError`` when rank ``rank``'s parse tree of the file is past ``limits``' XML reader.

    ``steps`` holds the ``<step>`` count of each of the rank's threadblocks (nops included); the
    tree holds ``<algo>``, ``num_gpus`` ``<gpu>`` elements, the rank's ``<tb>`` and its ``<step>``s.
    """
    if limits.max_parse_nodes is not None:
        nodes = 1 + num_gpus + len(steps) + sum(steps)
        if nodes > limits.max_parse_nodes:
            raise ArgumentError(
                name,
                f"rank {rank}",
                f"{nodes} XML elements (1 algo, {num_gpus} gpu, {len(steps)} tb, {sum(steps)} step)",
                f"at most {limits.max_parse_nodes} per rank for {_runtime_label(limits)} "
                "(MAX_NODES 4096 in msccl_parser.h, reached is refused)",
            )
    if limits.max_parse_children is not None:
        counts = (
            ("gpu elements", num_gpus),
            ("threadblocks", len(steps)),
            ("steps in a threadblock", max(steps, default=0)),
        )
        for what, count in counts:
            if count > limits.max_parse_children:
                raise ArgumentError(
                    name,
                    f"rank {rank}",
                    f"{count} {what}",
                    f"at most {limits.max_parse_children} children per XML element for {_runtime_label(limits)} "
                    "(MAX_SUBS in msccl_parser.h)",
                )


# -- protocols ------------------------------------------------------------------------------------
NCCL_STEPS = 8  # FIFO steps per connection buffer (NCCL_STEPS in NCCL's and RCCL's device.h)
_LL_LINE_BYTES = 16  # sizeof(union ncclLLFifoLine): 8 data bytes, 8 flag bytes
_NCCL_LL_BUFFER_BYTES = 8 * 512 * NCCL_STEPS * _LL_LINE_BYTES  # 524288: 8 lines x 512 LL threads
_NCCL_LL128_BUFFER_BYTES = 120 * 640 * NCCL_STEPS * 8  # 4915200: 120 words x 640 LL128 threads
_NCCL_LL128_LINE_WORDS = 16  # 128-byte lines, one flag word
_RCCL_LL_BUFFER_BYTES = 8 * 256 * NCCL_STEPS * _LL_LINE_BYTES  # 262144: RCCL's 256 threads
_RCCL_LL128_BUFFER_BYTES = 28 * 256 * NCCL_STEPS * 8  # 458752: 28 words x 256 threads
_RCCL_LL128_LINE_WORDS = 8  # 64-byte lines, one flag word
#: The GPUs RCCL runs LL128 on (ROCm/rccl src/graph/tuning.cc @9e22c79d, src/device/generate.py).
RCCL_LL128_GPU_ARCHS = ("gfx90a", "gfx942", "gfx950")
_RCCL_NO_LL_ARCH_PREFIX = "gfx12"  # tuning.cc: "Disable LL protocol on gfx12xx"


def _ll_pass_bytes(buffer_bytes: int) -> int:
    return buffer_bytes // NCCL_STEPS // 2


def _ll128_pass_bytes(buffer_bytes: int, line_words: int) -> int:
    return buffer_bytes // NCCL_STEPS // line_words * (line_words - 1)


@dataclass(frozen=True)
class ProtocolLimits:
    """Which protocols a runtime runs, the data bytes per chunk one LL or LL128 pass moves, and its cost table.

    ``cost_table`` names the table of ``taccl_py.simulate.protocol.PROTOCOL_COST_TABLES`` that
    prices the runtime's protocols (``"nccl"``, or ``"rccl"`` for RCCL's 64-byte LL128 lines).
    """

    runtime: Runtime
    protocols: tuple[str, ...]
    ll_pass_bytes: int
    ll128_pass_bytes: int
    cost_table: str

    def pass_bytes(self, protocol: str) -> int | None:
        """Return the bytes one chunk may hold for ``protocol`` to run in one pass (None: Simple, no limit here)."""
        return {Protocol.LL.value: self.ll_pass_bytes, Protocol.LL128.value: self.ll128_pass_bytes}.get(protocol)


def _rccl_protocols(rccl_gpu_arch: str | None) -> tuple[str, ...]:
    protocols = [Protocol.SIMPLE.value]
    if rccl_gpu_arch is None or not rccl_gpu_arch.startswith(_RCCL_NO_LL_ARCH_PREFIX):
        protocols.append(Protocol.LL.value)
    if rccl_gpu_arch in RCCL_LL128_GPU_ARCHS:
        protocols.append(Protocol.LL128.value)
    return tuple(protocols)


def _concrete_protocol_limits(runtime: Runtime, rccl_gpu_arch: str | None) -> ProtocolLimits:
    if runtime is Runtime.RCCL:
        return ProtocolLimits(
            runtime,
            _rccl_protocols(rccl_gpu_arch),
            _ll_pass_bytes(_RCCL_LL_BUFFER_BYTES),
            _ll128_pass_bytes(_RCCL_LL128_BUFFER_BYTES, _RCCL_LL128_LINE_WORDS),
            "rccl",
        )
    return ProtocolLimits(
        runtime,
        tuple(p.value for p in Protocol),
        _ll_pass_bytes(_NCCL_LL_BUFFER_BYTES),
        _ll128_pass_bytes(_NCCL_LL128_BUFFER_BYTES, _NCCL_LL128_LINE_WORDS),
        "nccl",
    )


def protocol_limits(runtime: Runtime | str = DEFAULT_RUNTIME, *, rccl_gpu_arch: str | None = None) -> ProtocolLimits:
    """Return the protocols ``runtime`` runs and its LL and LL128 bytes per chunk and pass.

    ``rccl_gpu_arch`` is the AMD GPU an RCCL (or portable) file is meant for (``"gfx942"``):
    RCCL runs LL128 only on ``RCCL_LL128_GPU_ARCHS`` and no LL on gfx12; None (unknown) allows
    LL and not LL128. Portable is the strictest of every runtime: the protocols all of them run
    and the smallest passes, priced with RCCL's LL128 lines.

    >>> limits = protocol_limits("rccl", rccl_gpu_arch="gfx942")
    >>> limits.protocols, limits.ll_pass_bytes, limits.ll128_pass_bytes
    (('Simple', 'LL', 'LL128'), 16384, 50176)
    >>> protocol_limits().protocols
    ('Simple', 'LL')
    """
    runtime = parse_runtime(runtime)
    if runtime is not Runtime.PORTABLE:
        return _concrete_protocol_limits(runtime, rccl_gpu_arch)
    every = [_concrete_protocol_limits(r, rccl_gpu_arch) for r in Runtime if r is not Runtime.PORTABLE]
    return ProtocolLimits(
        Runtime.PORTABLE,
        tuple(p for p in every[0].protocols if all(p in limits.protocols for limits in every)),
        min(limits.ll_pass_bytes for limits in every),
        min(limits.ll128_pass_bytes for limits in every),
        "rccl",
    )


def _refusal(protocol: str, limits: ProtocolLimits, chunk_bytes: float | None) -> tuple[str, str] | None:
    """Return (fault, expected) when ``limits``' runtime may not run ``protocol`` with such chunks, else None."""
    runtime = _runtime_label(limits)
    if protocol not in limits.protocols:
        return f"{protocol} is not run by {runtime}", "one of " + ", ".join(limits.protocols)
    most = limits.pass_bytes(protocol)
    if most is None or chunk_bytes is not None and chunk_bytes <= most:
        return None
    expected = f"chunks of at most {most} bytes, one {protocol} pass of {runtime}"
    if chunk_bytes is None:
        return f"{protocol} for sizes without an upper end", expected
    return f"{protocol} with chunks of up to {chunk_bytes:.0f} bytes", expected


def protocol_refusal(protocol: str, limits: ProtocolLimits, chunk_bytes: float | None) -> str | None:
    """Return why ``limits``' runtime may not run ``protocol`` with chunks of up to ``chunk_bytes`` (None: it may).

    ``chunk_bytes`` None means no upper end (an open-ended size band): LL and LL128 are refused,
    their chunks would not fit one pass.

    >>> protocol_refusal("LL", protocol_limits("msccl"), 40_000)
    'LL with chunks of up to 40000 bytes; expected chunks of at most 32768 bytes, one LL pass of runtime msccl'
    """
    refusal = _refusal(protocol, limits, chunk_bytes)
    return None if refusal is None else f"{refusal[0]}; expected {refusal[1]}"


def check_protocol(name: str | None, protocol: str, limits: ProtocolLimits, chunk_bytes: float | None = 0.0) -> None:
    """Raise ``ArgumentError`` when ``limits``' runtime may not run ``protocol`` with chunks of ``chunk_bytes``.

    The default ``chunk_bytes`` (0) checks only that the runtime runs the protocol.

    >>> check_protocol("ring", "LL128", protocol_limits("rccl"))
    Traceback (most recent call last):
    ...
    taccl_py.errors.ArgumentError: ring: protocol: LL128 is not run by runtime rccl; expected one of Simple, LL
    """
    refusal = _refusal(protocol, limits, chunk_bytes)
    if refusal is not None:
        raise ArgumentError(name, "protocol", *refusal)
