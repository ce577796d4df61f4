"""In-place variants: the schedule a collective runs when the caller's buffers alias.

MSCCL and NCCL call a collective in place when one buffer serves both ends: AllReduce and
AlltoAll with ``sendbuff == recvbuff``; AllGather with the rank's input already inside the output
at block ``rank``; ReduceScatter with the output inside the input at block ``rank``. An
out-of-place schedule run on such buffers reads and writes the same memory under two names,
so it stays correct only if no step overwrites data another step still has to read.

``inplace_variant`` rewrites every buffer reference the way the aliasing maps it (AllGather's
``i[k]`` becomes ``o[rank·C/N + k]``, ReduceScatter's ``o[k]`` becomes ``i[rank·C/N + k]``,
AllReduce's and AlltoAll's ``o[k]`` becomes ``i[k]``) and drops the copies that now copy a chunk
onto itself (what waited for such a copy waits for what the copy waited for). The result is an
``inplace=True`` Algorithm as msccl-tools writes in-place files (AllGather on ``o`` alone, the
others on ``i``); the caller verifies it (``taccl_py.verify``), which decides whether the
aliasing is safe.
"""

from __future__ import annotations

from dataclasses import replace

from taccl_py.ir.algorithm import Algorithm, OpType, RankProgram, Step, Threadblock, aliased_slot
from taccl_py.ir.collectives import Collective

__all__ = ["BOTH_PLACES_KEY", "DERIVED_FROM_KEY", "inplace_variant", "serves_both_placements"]

# Metadata key of a variant: the name of the out-of-place schedule it was derived from.
DERIVED_FROM_KEY = "inplace_of"
# Metadata key of an out-of-place schedule that is safe in place too: its MSCCL file says inplace="1" outofplace="1".
BOTH_PLACES_KEY = "msccl_inplace_and_outofplace"


def _aliased_step(algorithm: Algorithm, rank: int, step: Step) -> Step | None:
    """Return ``step`` on aliased buffers; None for a copy of a chunk onto itself (nothing to do)."""
    src = (step.src_buffer, step.src_offset)
    dst = (step.dst_buffer, step.dst_offset)
    if step.src_buffer is not None:
        src = aliased_slot(algorithm, rank, step.src_buffer, step.src_offset)
    if step.dst_buffer is not None:
        dst = aliased_slot(algorithm, rank, step.dst_buffer, step.dst_offset)
    if step.op is OpType.COPY and src == dst:
        return None
    return replace(step, src_buffer=src[0], src_offset=src[1], dst_buffer=dst[0], dst_offset=dst[1])


def _aliased_threadblocks(algorithm: Algorithm, prog: RankProgram) -> tuple[Threadblock, ...]:
    """Return the threadblocks of ``prog`` on aliased buffers, without self-copies and with dependencies remapped.

    A dependency on a dropped step becomes what that step waited for: its own dependencies and
    the step before it in its threadblock (itself resolved). Threadblocks left empty are dropped.
    """
    aliased = {tb.id: [_aliased_step(algorithm, prog.rank, step) for step in tb.steps] for tb in prog.threadblocks}
    new_index: dict[tuple[int, int], int] = {}
    for tb_id, steps in aliased.items():
        kept = 0
        for index, step in enumerate(steps):
            if step is not None:
                new_index[(tb_id, index)] = kept
                kept += 1
    originals = {tb.id: tb.steps for tb in prog.threadblocks}

    def resolve(dep: tuple[int, int]) -> set[tuple[int, int]]:
        if dep in new_index:
            return {(dep[0], new_index[dep])}
        tb_id, index = dep
        if index >= len(originals.get(tb_id, ())):
            return set()  # a wait for no step: verification reports it on the original
        # a dropped step finished after its waits and after the step before it in program order
        before = resolve((tb_id, index - 1)) if index > 0 else set()
        return before.union(*(resolve(d) for d in originals[tb_id][index].depends))

    return tuple(
        replace(
            tb,
            steps=tuple(
                replace(step, depends=tuple(sorted(set().union(*(resolve(d) for d in step.depends)))))
                for step in aliased[tb.id]
                if step is not None
            ),
        )
        for tb in prog.threadblocks
        if any(step is not None for step in aliased[tb.id])
    )


def inplace_variant(algorithm: Algorithm) -> Algorithm:
    """Return ``algorithm`` rewritten for in-place buffers (``algorithm`` itself when already in place).

    The variant is not verified here: ``verify_algorithm`` on it says whether the schedule is
    safe in place. Copies of a chunk onto itself are dropped, and threadblocks left empty.
    """
    if algorithm.inplace:
        return algorithm
    keeps_input = algorithm.collective is not Collective.ALLGATHER
    ranks = tuple(
        RankProgram(
            prog.rank,
            _aliased_threadblocks(algorithm, prog),
            prog.input_chunks if keeps_input else 0,
            0 if keeps_input else prog.output_chunks,
            prog.scratch_chunks,
        )
        for prog in algorithm.ranks
    )
    return replace(algorithm, ranks=ranks, inplace=True).with_metadata(**{DERIVED_FROM_KEY: algorithm.name})


def serves_both_placements(algorithm: Algorithm, variant: Algorithm) -> bool:
    """Return True when the out-of-place ``algorithm``, run on aliased buffers, performs ``variant`` step for step.

    Then one MSCCL file with ``inplace="1" outofplace="1"`` is safe for both call forms (given
    that ``variant`` verifies); otherwise the in-place call needs the variant's own file (the
    variant dropped self-copies the original would still run).
    """
    return sum(len(tb.steps) for prog in algorithm.ranks for tb in prog.threadblocks) == sum(
        len(tb.steps) for prog in variant.ranks for tb in prog.threadblocks
    )
