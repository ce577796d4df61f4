"""Schedules that reduce and multicast in the switch (NVLink SHARP), alone or beside point-to-point ones.

On a machine whose NVSwitch reduces, three designs join the synthesized candidates:

* ``switch_allreduce``: NCCL's NVLS as a schedule. Rank r owns slice r of the buffer and
  reduce-stores it over the machine (``mrs``: every GPU's slice summed in the switch, the sum
  stored to every GPU at once), spread over ``channels`` threadblocks so that one's α overlaps
  another's bytes. Per GPU port M (1 + 1/G) bytes each way at the switch's NVLS rate.
* ``split_allreduce``: the buffer cut in two, the first part through the switch, the rest by a
  point-to-point AllReduce running at the same time. The switch part is held to the NVLS rate
  (the ports' multimem twins, ``taccl_py.simulate.switch``) while the ports carry more, so the
  point-to-point part uses what the switch part leaves: on DGX-H100 about 12% of the buffer
  point-to-point moves the whole about 1.13x faster than NVLS alone, in the model.
* ``multicast_allgather``: each rank stores its block to every GPU at once (``ms``): one α
  whatever the GPU count, where a ring pays G - 1. Every GPU also receives its own block, and
  the store runs at the NVLS rate, so at large sizes point-to-point AllGathers win; the band
  choice decides.

ReduceScatter has no design here: the switch's only reduction (``mrs``, MSCCL++'s ``glres``)
stores its sum to every member, so each port would take the whole buffer in where a
ReduceScatter needs (G - 1)/G of it out and 1/G in. Across machines, the MSCCL++ operations
(``glres``, ``gstore``) cannot keep a machine's sum local either (NCCL's NVLS-Tree does, with
``multimem.ld_reduce``, which MSCCL++'s executor has no operation for): a switch phase would
take the buffer in twice, at the NVLS rate, so the multi-machine bands stay point-to-point, or
leave the size to NCCL where its NVLS-Tree is faster (``synth.outcome``).
"""

from __future__ import annotations

from dataclasses import replace

from taccl_py.bounds.reduction import reducing_switches
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective
from taccl_py.topology.model import Topology

__all__ = ["has_switch_designs", "multicast_allgather", "split_allreduce", "switch_allreduce"]


def has_switch_designs(topology: Topology, collective: Collective) -> bool:
    """Return True where this module has designs: AllReduce or AllGather on one machine whose switch reduces."""
    return (
        topology.nodes == 1
        and topology.num_ranks > 1
        and collective in (Collective.ALLREDUCE, Collective.ALLGATHER)
        and bool(reducing_switches(topology))
    )


def _machine(topology: Topology, what: str) -> tuple[int, ...]:
    """Return the ranks of the one machine, or raise where the designs do not apply."""
    if topology.nodes != 1 or not reducing_switches(topology):
        raise ArgumentError(
            topology.name, "topology", f"{topology.nodes} machines for {what}", "one machine whose NVSwitch reduces"
        )
    return tuple(range(topology.num_ranks))


def switch_allreduce(
    topology: Topology,
    *,
    slice_chunks: int = 1,
    channels: int = 1,
    inplace: bool = False,
    first_channel: int = 0,
    name: str | None = None,
) -> Algorithm:
    """Return NVLS as a schedule: rank r reduce-stores its ``slice_chunks`` chunks on ``channels`` threadblocks.

    ``chunks_per_loop`` is G · ``slice_chunks``; the threadblocks split the slice as evenly as
    chunks allow and take channels from ``first_channel`` on.
    """
    group = _machine(topology, "a switch AllReduce")
    if not 1 <= channels <= slice_chunks:
        raise ArgumentError(
            name, "channels", f"{channels} channels for {slice_chunks} chunks", "1 to the slice's chunks"
        )
    chunks = len(group) * slice_chunks
    dst = Buffer.INPUT if inplace else Buffer.OUTPUT
    parts = [slice_chunks // channels + (c < slice_chunks % channels) for c in range(channels)]
    starts = [sum(parts[:c]) for c in range(channels)]
    programs = []
    for rank in group:
        threadblocks = tuple(
            Threadblock(
                c,
                (
                    Step(
                        OpType.SWITCH_REDUCE_STORE,
                        Buffer.INPUT,
                        rank * slice_chunks + start,
                        dst,
                        rank * slice_chunks + start,
                        part,
                    ),
                ),
                channel=first_channel + c,
                switch_group=group,
            )
            for c, (start, part) in enumerate(zip(starts, parts))
        )
        programs.append(RankProgram(rank, threadblocks, chunks, chunks))
    label = name or f"switch-allreduce-{topology.name}-s{slice_chunks}c{channels}"
    return Algorithm(label, Collective.ALLREDUCE, len(group), chunks, tuple(programs), inplace=inplace)


def multicast_allgather(topology: Topology, *, channels: int = 1, name: str | None = None) -> Algorithm:
    """Return an AllGather in which each rank stores its block to every GPU, in ``channels`` pieces at once."""
    group = _machine(topology, "a multicast AllGather")
    if channels < 1:
        raise ArgumentError(name, "channels", f"{channels} channels", "at least 1")
    programs = tuple(
        RankProgram(
            rank,
            tuple(
                Threadblock(
                    c,
                    (Step(OpType.SWITCH_STORE, Buffer.INPUT, c, Buffer.OUTPUT, rank * channels + c),),
                    channel=c,
                    switch_group=group,
                )
                for c in range(channels)
            ),
            channels,
            len(group) * channels,
        )
        for rank in group
    )
    label = name or f"multicast-allgather-{topology.name}-c{channels}"
    return Algorithm(label, Collective.ALLGATHER, len(group), len(group) * channels, programs)


def split_allreduce(switch_part: Algorithm, p2p_part: Algorithm, name: str) -> Algorithm:
    """Return one AllReduce running ``switch_part`` on the first chunks and ``p2p_part`` on the rest, at once.

    Both must be AllReduces over the same ranks and placement; the point-to-point part's chunks,
    scratch, threadblock ids and dependencies are shifted past the switch part's, so each still
    implements the AllReduce of its own chunks and nothing orders one part after the other.
    """
    if (switch_part.collective, switch_part.num_ranks, switch_part.inplace) != (
        p2p_part.collective,
        p2p_part.num_ranks,
        p2p_part.inplace,
    ) or switch_part.collective is not Collective.ALLREDUCE:
        raise ArgumentError(
            name, "parts", f"{switch_part.name} and {p2p_part.name}", "two AllReduces over the same ranks and placement"
        )
    shift = switch_part.chunks_per_loop
    programs = []
    for mine, theirs in zip(switch_part.ranks, p2p_part.ranks):
        first_tb = 1 + max((tb.id for tb in mine.threadblocks), default=-1)
        moved = tuple(_shifted(tb, first_tb, shift, mine.scratch_chunks) for tb in theirs.threadblocks)
        programs.append(
            RankProgram(
                mine.rank,
                mine.threadblocks + moved,
                mine.input_chunks + theirs.input_chunks,
                mine.output_chunks + theirs.output_chunks,
                mine.scratch_chunks + theirs.scratch_chunks,
            )
        )
    return Algorithm(
        name,
        Collective.ALLREDUCE,
        switch_part.num_ranks,
        shift + p2p_part.chunks_per_loop,
        tuple(programs),
        inplace=switch_part.inplace,
        protocol=p2p_part.protocol,
    )


def _shifted(tb: Threadblock, first_tb: int, chunks: int, scratch: int) -> Threadblock:
    """Return ``tb`` renumbered from ``first_tb`` with its buffer offsets moved past another part's."""

    def moved(buffer: Buffer | None, offset: int) -> int:
        return offset + (scratch if buffer is Buffer.SCRATCH else chunks if buffer is not None else 0)

    steps = tuple(
        replace(
            step,
            src_offset=moved(step.src_buffer, step.src_offset),
            dst_offset=moved(step.dst_buffer, step.dst_offset),
            depends=tuple((first_tb + dep_tb, dep_step) for dep_tb, dep_step in step.depends),
        )
        for step in tb.steps
    )
    return replace(tb, id=first_tb + tb.id, steps=steps)
