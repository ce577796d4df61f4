"""The schedule IR: per rank, threadblocks of ordered steps over chunked buffers (MSCCL-IR).

An ``Algorithm`` says, for every rank, which threadblocks run and which steps each runs in order.
A threadblock has at most one send peer and one receive peer; the k-th sending step on
(src, dst, channel) meets the k-th receiving step there. Buffers are cut into equal chunks (see
``taccl_py.ir.collectives`` for the counts). Everything is a frozen dataclass of tuples; passes
return new objects.

Step semantics (``src`` = ``src_buffer[src_offset : src_offset + count]``, ``dst`` likewise):

======  =========================================================================
s       send ``src`` to the send peer
r       receive from the receive peer into ``dst``
rcs     receive into ``dst`` and forward the same data to the send peer
rrs     receive, add the local ``src``, send the sum on (nothing stored)
rrc     receive, add the local ``src``, store the sum at ``dst``
rrcs    as rrc, then send the sum to the send peer
cpy     copy ``src`` to ``dst``
re      ``dst`` <- ``dst`` + ``src`` (local reduction)
nop     nothing; carries a dependency
mrs     switch reduce-store: ``dst`` on every member of the threadblock's switch group
        <- the sum of ``src`` over every member (NVLink SHARP ``multimem.ld_reduce`` then
        ``multimem.st``; MSCCL++'s ``glres``)
ms      switch store: ``dst`` on every member of the switch group <- the local ``src``
        (``multimem.st``; MSCCL++'s ``gstore``)
======  =========================================================================

Switch steps are collective over the group, as NCCL's NVLS kernels run them: the k-th switch
step of the threadblocks with one ``(switch_group, channel)`` on every member forms one *group
step*. No member's switch step of a group step starts before every member has finished what
precedes its own (a barrier), and what follows a member's switch step waits for every member's
(a second barrier): so a member's own ``src`` must hold its operand when it reaches the step,
and a member may read what others stored once its step is done. Inside one group step the
members' steps run concurrently: their accesses must not conflict (the race check says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

from taccl_py.ir.collectives import ChunkLayout, Collective, chunk_layout

__all__ = [
    "Buffer",
    "OpType",
    "Step",
    "Threadblock",
    "RankProgram",
    "Algorithm",
    "aliased_slot",
    "input_slot",
    "output_slot",
]


class Buffer(str, Enum):
    """A per-rank buffer; values are MSCCL-IR's spelling."""

    INPUT = "i"
    OUTPUT = "o"
    SCRATCH = "s"


class OpType(str, Enum):
    """A step's operation; values are MSCCL-IR's spelling."""

    SEND = "s"
    RECV = "r"
    RECV_COPY_SEND = "rcs"
    RECV_REDUCE_SEND = "rrs"
    RECV_REDUCE_COPY = "rrc"
    RECV_REDUCE_COPY_SEND = "rrcs"
    COPY = "cpy"
    REDUCE = "re"
    NOP = "nop"
    SWITCH_REDUCE_STORE = "mrs"
    SWITCH_STORE = "ms"

    @property
    def switches(self) -> bool:
        """Return True for a step that goes through the threadblock's switch group (multimem)."""
        return self in _SWITCHING

    @property
    def sends(self) -> bool:
        """Return True when the step sends to the threadblock's send peer."""
        return self in _SENDING

    @property
    def receives(self) -> bool:
        """Return True when the step receives from the threadblock's receive peer."""
        return self in _RECEIVING

    @property
    def reduces(self) -> bool:
        """Return True when the step adds a received or local operand."""
        return self in _REDUCING

    @property
    def uses_src(self) -> bool:
        """Return True when the step has a ``src`` operand (the table in the module docstring)."""
        return self in _USING_SRC

    @property
    def uses_dst(self) -> bool:
        """Return True when the step has a ``dst`` operand (the table in the module docstring)."""
        return self in _USING_DST


_SENDING = frozenset({OpType.SEND, OpType.RECV_COPY_SEND, OpType.RECV_REDUCE_SEND, OpType.RECV_REDUCE_COPY_SEND})
_RECEIVING = frozenset(
    {OpType.RECV, OpType.RECV_COPY_SEND, OpType.RECV_REDUCE_SEND, OpType.RECV_REDUCE_COPY, OpType.RECV_REDUCE_COPY_SEND}
)
_REDUCING = frozenset(
    {
        OpType.RECV_REDUCE_SEND,
        OpType.RECV_REDUCE_COPY,
        OpType.RECV_REDUCE_COPY_SEND,
        OpType.REDUCE,
        OpType.SWITCH_REDUCE_STORE,
    }
)
_SWITCHING = frozenset({OpType.SWITCH_REDUCE_STORE, OpType.SWITCH_STORE})
_USING_SRC = frozenset(
    {
        OpType.SEND,
        OpType.RECV_REDUCE_SEND,
        OpType.RECV_REDUCE_COPY,
        OpType.RECV_REDUCE_COPY_SEND,
        OpType.COPY,
        OpType.REDUCE,
        OpType.SWITCH_REDUCE_STORE,
        OpType.SWITCH_STORE,
    }
)
_USING_DST = frozenset(
    {
        OpType.RECV,
        OpType.RECV_COPY_SEND,
        OpType.RECV_REDUCE_COPY,
        OpType.RECV_REDUCE_COPY_SEND,
        OpType.COPY,
        OpType.REDUCE,
        OpType.SWITCH_REDUCE_STORE,
        OpType.SWITCH_STORE,
    }
)


@dataclass(frozen=True, slots=True)
class Step:
    """One operation of a threadblock over ``count`` chunks.

    ``depends`` lists (threadblock id, step index) pairs on the same rank that must finish first.
    Buffers a step does not use are None.
    """

    op: OpType
    src_buffer: Buffer | None = None
    src_offset: int = 0
    dst_buffer: Buffer | None = None
    dst_offset: int = 0
    count: int = 1
    depends: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Threadblock:
    """An ordered program with at most one send peer and one receive peer on one channel.

    ``switch_group`` lists, in increasing order and including the threadblock's own rank, the
    ranks its switch steps (``mrs``, ``ms``) reach through their NVSwitch; () when it has none.
    """

    id: int
    steps: tuple[Step, ...]
    send_peer: int | None = None
    recv_peer: int | None = None
    channel: int = 0
    switch_group: tuple[int, ...] = ()


@dataclass(frozen=True)
class RankProgram:
    """The threadblocks one rank runs, with its buffer sizes in chunks."""

    rank: int
    threadblocks: tuple[Threadblock, ...]
    input_chunks: int
    output_chunks: int
    scratch_chunks: int = 0

    def chunks(self, buffer: Buffer) -> int:
        """Return how many chunks ``buffer`` holds on this rank."""
        return {
            Buffer.INPUT: self.input_chunks,
            Buffer.OUTPUT: self.output_chunks,
            Buffer.SCRATCH: self.scratch_chunks,
        }[buffer]


@dataclass(frozen=True)
class Algorithm:
    """A collective schedule over ``num_ranks`` ranks, cut into ``chunks_per_loop`` chunks.

    ``min_bytes``/``max_bytes`` give the size band (bytes; ``max_bytes`` None = unbounded) the
    algorithm is meant for; ``metadata`` holds free-form provenance (topology, synthesizer
    settings) as sorted (key, value) string pairs.
    """

    name: str
    collective: Collective
    num_ranks: int
    chunks_per_loop: int
    ranks: tuple[RankProgram, ...]
    inplace: bool = False
    protocol: str = "Simple"
    min_bytes: int = 0
    max_bytes: int | None = None
    metadata: tuple[tuple[str, str], ...] = field(default=())

    @property
    def layout(self) -> ChunkLayout:
        """Return the collective's chunk layout for this rank count and chunking."""
        return chunk_layout(self.collective, self.num_ranks, self.chunks_per_loop)

    @property
    def num_channels(self) -> int:
        """Return the number of channels used (highest channel + 1)."""
        return 1 + max((tb.channel for prog in self.ranks for tb in prog.threadblocks), default=0)

    @property
    def uses_switch(self) -> bool:
        """Return True when some step goes through a switch (``mrs``, ``ms``): in-network, no MSCCL-IR form."""
        return any(step.op.switches for prog in self.ranks for tb in prog.threadblocks for step in tb.steps)

    @property
    def reduces_in_switch(self) -> bool:
        """Return True when some step sums in the switch (``mrs``): the class bound RS + AG no longer holds."""
        return any(
            step.op is OpType.SWITCH_REDUCE_STORE
            for prog in self.ranks
            for tb in prog.threadblocks
            for step in tb.steps
        )

    def with_metadata(self, **items: str) -> Algorithm:
        """Return a copy with ``items`` merged into ``metadata``."""
        merged = dict(self.metadata)
        merged.update({key: str(value) for key, value in items.items()})
        return replace(self, metadata=tuple(sorted(merged.items())))

    def meta(self, key: str, default: str | None = None) -> str | None:
        """Return the metadata value under ``key``."""
        return dict(self.metadata).get(key, default)


def aliased_slot(algorithm: Algorithm, rank: int, buffer: Buffer, offset: int) -> tuple[Buffer, int]:
    """Return where chunk ``offset`` of ``buffer`` lives on ``rank`` when the call is in place.

    One buffer serves both ends: AllGather's input is block ``rank`` of its output, ReduceScatter's
    output block ``rank`` of its input, AllReduce's and AlltoAll's output is their input.
    """
    layout = algorithm.layout
    collective = algorithm.collective
    if collective is Collective.ALLGATHER and buffer is Buffer.INPUT:
        return Buffer.OUTPUT, rank * layout.input_chunks + offset
    if collective is Collective.REDUCESCATTER and buffer is Buffer.OUTPUT:
        return Buffer.INPUT, rank * layout.output_chunks + offset
    if collective in (Collective.ALLREDUCE, Collective.ALLTOALL) and buffer is Buffer.OUTPUT:
        return Buffer.INPUT, offset
    return buffer, offset


def input_slot(algorithm: Algorithm, rank: int, index: int) -> tuple[Buffer, int]:
    """Return where input chunk ``index`` of ``rank`` lives (in-place collectives alias buffers)."""
    return aliased_slot(algorithm, rank, Buffer.INPUT, index) if algorithm.inplace else (Buffer.INPUT, index)


def output_slot(algorithm: Algorithm, rank: int, index: int) -> tuple[Buffer, int]:
    """Return where output chunk ``index`` of ``rank`` must end up."""
    return aliased_slot(algorithm, rank, Buffer.OUTPUT, index) if algorithm.inplace else (Buffer.OUTPUT, index)
