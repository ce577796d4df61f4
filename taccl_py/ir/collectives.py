"""The collectives and their chunk-level pre- and post-conditions.

Chunk layout follows MSCCL: a collective over ``num_ranks`` ranks is cut into
``chunks_per_loop`` equal chunks of the whole nccl-tests size M. Input and output buffers hold
these many chunks per rank:

=============  =====================  ======================
collective     input chunks           output chunks
=============  =====================  ======================
allgather      C / N                  C
reducescatter  C                      C / N
allreduce      C                      C (in place: same buffer)
alltoall       C                      C
=============  =====================  ======================

A symbolic chunk value is a ``Contribution``: a sorted tuple of (rank, input index) pairs, one per
reduced input (a plain copy holds one pair).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from taccl_py.errors import ArgumentError

__all__ = [
    "Collective",
    "parse_collective",
    "Contribution",
    "ChunkLayout",
    "chunk_layout",
    "initial_value",
    "expected_output",
    "bus_factor",
]

Contribution = tuple[tuple[int, int], ...]


class Collective(str, Enum):
    """A collective; values are our file spelling (MSCCL's current dialect)."""

    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    ALLREDUCE = "allreduce"
    ALLTOALL = "alltoall"

    @property
    def reduces(self) -> bool:
        """Return True when the collective combines inputs with a reduction operator."""
        return self in (Collective.REDUCESCATTER, Collective.ALLREDUCE)


def parse_collective(collective: Collective | str) -> Collective:
    """Return ``collective`` as a Collective; raise ``ArgumentError`` naming it when it is none."""
    try:
        return Collective(collective)
    except ValueError:
        raise ArgumentError(
            None, "collective", f"unknown collective {collective!r}", "allgather, reducescatter, allreduce or alltoall"
        ) from None


@dataclass(frozen=True)
class ChunkLayout:
    """How many chunks each rank's input and output buffers hold."""

    collective: Collective
    num_ranks: int
    chunks_per_loop: int
    input_chunks: int
    output_chunks: int


def chunk_layout(collective: Collective, num_ranks: int, chunks_per_loop: int) -> ChunkLayout:
    """Return the input/output chunk counts per rank; raise ``ArgumentError`` if they do not divide.

    >>> chunk_layout(Collective.ALLGATHER, 4, 8).input_chunks
    2
    """
    if num_ranks < 1 or chunks_per_loop < 1:
        raise ArgumentError(None, "chunks", f"{num_ranks} ranks and {chunks_per_loop} chunks", "positive counts")
    per_rank, remainder = divmod(chunks_per_loop, num_ranks)
    if collective is not Collective.ALLREDUCE and remainder:
        raise ArgumentError(
            None,
            "nchunksperloop",
            f"{chunks_per_loop} chunks do not split over {num_ranks} ranks",
            "a multiple of the rank count",
        )
    if collective is Collective.ALLGATHER:
        return ChunkLayout(collective, num_ranks, chunks_per_loop, per_rank, chunks_per_loop)
    if collective is Collective.REDUCESCATTER:
        return ChunkLayout(collective, num_ranks, chunks_per_loop, chunks_per_loop, per_rank)
    return ChunkLayout(collective, num_ranks, chunks_per_loop, chunks_per_loop, chunks_per_loop)


def initial_value(rank: int, index: int) -> Contribution:
    """Return the symbolic value of input chunk ``index`` of ``rank`` before the collective."""
    return ((rank, index),)


def expected_output(layout: ChunkLayout, rank: int, index: int) -> Contribution:
    """Return the symbolic value output chunk ``index`` of ``rank`` must hold afterwards.

    >>> layout = chunk_layout(Collective.REDUCESCATTER, 2, 2)
    >>> expected_output(layout, 1, 0)
    ((0, 1), (1, 1))
    """
    n = layout.num_ranks
    if layout.collective is Collective.ALLGATHER:
        source, offset = divmod(index, layout.input_chunks)
        return ((source, offset),)
    if layout.collective is Collective.REDUCESCATTER:
        column = rank * layout.output_chunks + index
        return tuple((q, column) for q in range(n))
    if layout.collective is Collective.ALLREDUCE:
        return tuple((q, index) for q in range(n))
    # alltoall: block q of rank r's output is block r of rank q's input
    block = layout.chunks_per_loop // n
    source, offset = divmod(index, block)
    return ((source, rank * block + offset),)


def bus_factor(collective: Collective, num_ranks: int) -> float:
    """Return busbw / algbw as nccl-tests defines it: (N-1)/N, or 2(N-1)/N for allreduce."""
    if num_ranks <= 1:
        return 0.0
    factor = (num_ranks - 1) / num_ranks
    return 2 * factor if collective is Collective.ALLREDUCE else factor
