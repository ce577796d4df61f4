"""The MSCCL-IR XML vocabulary and the one table of differences between its two dialects.

Two runtimes read MSCCL-IR: the original microsoft/msccl ("old" dialect, written by
microsoft/msccl-tools) and the current Azure/msccl-executor-nccl and RCCL ("new" dialect, written
by Azure/msccl-tools). They differ only in what ``DIALECTS`` lists: the spelling of the
reduce-scatter collective and whether ``<algo>`` carries ``outofplace``, ``minBytes`` and
``maxBytes`` (RCCL's ``mscclGetAlgoFromXmlFile`` requires them). Step types and buffer names are
``taccl_py.ir.algorithm.OpType`` and ``Buffer``, whose values are the on-disk strings.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Mapping

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import OpType, Threadblock
from taccl_py.ir.collectives import Collective

__all__ = [
    "Dialect",
    "parse_dialect",
    "Protocol",
    "DialectSpec",
    "DIALECTS",
    "COLLECTIVE_SPELLINGS",
    "NO_PEER",
    "NO_DEPENDENCY",
    "NOP_OFFSET",
    "STEP_OPERANDS",
    "StepKey",
    "pair_transfers",
]


class Dialect(str, Enum):
    """Which MSCCL runtime a file is written for."""

    NEW = "new"
    OLD = "old"


def parse_dialect(dialect: Dialect | str) -> Dialect:
    """Return the ``Dialect`` that ``dialect`` names; raise ``ArgumentError`` for any other value."""
    try:
        return Dialect(dialect)
    except ValueError:
        raise ArgumentError(
            None, "dialect", f"{dialect!r}", "'new' (msccl-executor-nccl, RCCL) or 'old' (microsoft/msccl)"
        ) from None


class Protocol(str, Enum):
    """NCCL's wire protocols, spelled as the ``proto`` attribute."""

    SIMPLE = "Simple"
    LL = "LL"
    LL128 = "LL128"


@dataclass(frozen=True)
class DialectSpec:
    """What one dialect writes: collective spellings and whether the size band is present."""

    collective_names: Mapping[Collective, str]
    size_band: bool
    runtime: str


_CURRENT_NAMES = MappingProxyType({c: c.value for c in Collective})

# The one table of dialect differences (sources: microsoft/msccl-tools ncclize and Azure/msccl-tools
# ir.py emit these spellings; RCCL src/misc/msccl/msccl_parser.cc reads the new one).
DIALECTS: Mapping[Dialect, DialectSpec] = MappingProxyType(
    {
        Dialect.NEW: DialectSpec(_CURRENT_NAMES, True, "Azure/msccl-executor-nccl, RCCL"),
        Dialect.OLD: DialectSpec(
            MappingProxyType({**_CURRENT_NAMES, Collective.REDUCESCATTER: "reduce_scatter"}),
            False,
            "microsoft/msccl",
        ),
    }
)

# Every spelling either dialect uses, for reading.
COLLECTIVE_SPELLINGS: Mapping[str, Collective] = MappingProxyType(
    {name: collective for spec in DIALECTS.values() for collective, name in spec.collective_names.items()}
)

NO_PEER = -1  # send/recv attribute of a threadblock without that peer
NO_DEPENDENCY = -1  # depid/deps of a step that waits for nothing
NOP_OFFSET = -1  # srcoff/dstoff msccl-tools writes for a nop step (RCCL accepts offset -1)

# Which of (srcbuf/srcoff, dstbuf/dstoff) each step type uses; the runtime ignores the other pair
# (msccl-tools writes the peer's location there). Source: the interpreter in RCCL's
# msccl_kernel_impl.h: send(src), recv(dst), recvCopySend(dst), recvReduceSend(src),
# recvReduceCopy(src, dst), recvReduceCopySend(src, dst), localCopy(src, dst), reduce(src into dst).
STEP_OPERANDS: Mapping[OpType, tuple[bool, bool]] = MappingProxyType(
    {
        OpType.SEND: (True, False),
        OpType.RECV: (False, True),
        OpType.RECV_COPY_SEND: (False, True),
        OpType.RECV_REDUCE_SEND: (True, False),
        OpType.RECV_REDUCE_COPY: (True, True),
        OpType.RECV_REDUCE_COPY_SEND: (True, True),
        OpType.COPY: (True, True),
        OpType.REDUCE: (True, True),
        OpType.NOP: (False, False),
    }
)

StepKey = tuple[int, int, int]  # (rank, threadblock id, step index) of a written step


def pair_transfers(steps: Iterable[tuple[int, Threadblock, int, OpType]]) -> dict[StepKey, StepKey]:
    """Return the receiving step each sending step meets, from (rank, threadblock, step index, type) in file order.

    The k-th sending step on (rank, send peer, channel) meets the k-th receiving step of the peer
    on that channel, as the runtime pairs them (and ``taccl_py.ir.dataflow`` does on the IR).
    """
    sends: dict[tuple[int, int, int], list[StepKey]] = defaultdict(list)
    receives: dict[tuple[int, int, int], list[StepKey]] = defaultdict(list)
    for rank, tb, index, op in steps:
        if op.sends and tb.send_peer is not None:
            sends[(rank, tb.send_peer, tb.channel)].append((rank, tb.id, index))
        if op.receives and tb.recv_peer is not None:
            receives[(tb.recv_peer, rank, tb.channel)].append((rank, tb.id, index))
    return {send: recv for link, keys in sends.items() for send, recv in zip(keys, receives.get(link, ()))}
