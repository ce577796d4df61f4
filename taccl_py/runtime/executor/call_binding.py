"""A call's binding: where the plan's buffers live and what is copied, once per aliasing form, in index space.

What an executor does with a call's tensors depends on the tensors only through their *aliasing
form* (:class:`CallForm`): whether the call is MSCCL's in-place call of an in-place schedule (one
buffer, no copy), and otherwise whether the input overlaps the output (then the input is copied
in). :func:`bind_index_space` works out, for one form, which flat source each plan storage lives
in (the call's output or input, the executor's scratch, or a padded work buffer), the copies in
and out, and the rounds over element ranges (:func:`~taccl_py.runtime.executor.binding.bind_rounds`);
it allocates the work and staging buffers of that form once. A call then only slices its tensors
(:meth:`IndexBinding.bind`): tens of views, tens of microseconds, where binding in tensor space
took milliseconds, so a caller that allocates fresh tensors every call (FSDP2) pays no bind.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from taccl_py.ir.collectives import Collective
from taccl_py.runtime.executor.binding import (
    BoundRound,
    IndexedRound,
    Range,
    RangeSlots,
    bind_rounds,
    overlaps,
    views_of_rounds,
)
from taccl_py.runtime.executor.graphs import GraphedCalls
from taccl_py.runtime.executor.inplace_calls import is_inplace_call
from taccl_py.runtime.executor.rank_plan import RankPlan, Storage

__all__ = ["BoundCall", "CallForm", "CallLayout", "IndexBinding", "bind_index_space", "call_form"]

logger = logging.getLogger(__name__)

#: Sources of the call's own tensors (flat); the private buffers are sources _PRIVATE_BASE on.
OUTPUT_SOURCE, INPUT_SOURCE = 0, 1
_PRIVATE_STORAGES = (Storage.SCRATCH, Storage.TEMP, Storage.SNAP)
_PRIVATE_BASE = 2


@dataclass(frozen=True)
class CallLayout:
    """An executor's element layout (see :mod:`taccl_py.runtime.executor`): shard length, chunk length, blocks."""

    rank: int
    numel: int  # elements of one block of a user tensor
    chunk_elems: int
    in_blocks: int
    out_blocks: int
    per_block: int  # chunks per block
    padded: bool  # chunk_elems * per_block > numel: the plan runs on padded work buffers
    segment_elems: int | None  # longest message in elements; None: messages go whole
    eager_sends: bool


@dataclass(frozen=True)
class CallForm:
    """How a call's tensors alias: the only thing about them a binding depends on, besides where they are."""

    one_buffer: bool  # MSCCL's in-place call of an in-place schedule: the schedule runs on that buffer
    input_overlaps: bool  # otherwise: the input shares memory with the output


def call_form(plan: RankPlan, layout: CallLayout, output: Any, input: Any) -> CallForm:
    """Return the aliasing form of a call of ``plan`` on ``output`` and ``input``."""
    if plan.inplace and not layout.padded and is_inplace_call(plan.collective, output, input, layout.rank):
        return CallForm(True, False)
    return CallForm(False, overlaps(output, input))


@dataclass
class BoundCall:
    """The plan bound to one pair of user tensors, and the CUDA graphs of its calls.

    It reaches the tensors' memory only through aliases that do not hold the tensors
    (:func:`~taccl_py.runtime.executor.binding_cache.unowned_alias`), so it dies with them.
    """

    copy_in: list[tuple[Any, Any]]
    rounds: list[BoundRound]
    copy_out: list[tuple[Any, Any]]
    final_waits: list[int]
    graphs: GraphedCalls = field(default_factory=GraphedCalls)  # they die with the tensors they name


@dataclass
class IndexBinding:
    """One aliasing form's binding over element ranges; :meth:`bind` puts a call's tensors under it.

    ``buffers`` are the private sources (scratch, temporaries, snapshots, then this form's work
    and staging buffers), ``ranges`` the slots' ranges, copies and rounds refer to slots.
    """

    form: CallForm
    buffers: list[Any]
    ranges: list[Range]
    copy_in: list[tuple[int, int]]
    copy_out: list[tuple[int, int]]
    rounds: list[IndexedRound]
    final_waits: tuple[int, ...]
    _fixed: list[Any] = field(init=False, repr=False)  # per slot: its view when private, else None
    _splits: list[_Split] = field(init=False, repr=False)
    _sliced: list[tuple[int, int, int, int]] = field(init=False, repr=False)  # (slot, source, start, stop)

    def __post_init__(self) -> None:
        self._fixed = [None if s < _PRIVATE_BASE else self.buffers[s - _PRIVATE_BASE][a:b] for s, a, b in self.ranges]
        self._splits, self._sliced = [], []
        for source in (OUTPUT_SOURCE, INPUT_SOURCE):
            split, sliced = _split_of(source, [(slot, rng) for slot, rng in enumerate(self.ranges) if rng[0] == source])
            self._splits += [split] if split.sizes else []
            self._sliced += sliced

    def bind(self, output: Any, input: Any) -> BoundCall:
        """Return the plan over views of ``output`` and ``input`` (contiguous, of this form; pass unowned aliases)."""
        flats = (output.view(-1), input.view(-1))
        views = list(self._fixed)
        for source, start, stop, sizes, owners in self._splits:
            # one C++ call makes every view (a slice each costs several times more host time)
            for slot, view in zip(owners, flats[source][start:stop].split_with_sizes(sizes)):
                if slot is not None:
                    views[slot] = view
        for slot, source, start, stop in self._sliced:
            views[slot] = flats[source][start:stop]
        copy_in = [(views[d], views[s]) for d, s in self.copy_in]
        return BoundCall(
            [(dst, src) for dst, src in copy_in if dst.data_ptr() != src.data_ptr()],
            views_of_rounds(self.rounds, views),
            [(views[d], views[s]) for d, s in self.copy_out],
            list(self.final_waits),
        )


class _Split(NamedTuple):
    """A user source cut at its ranges' boundaries: the pieces' ``sizes`` from ``start`` to ``stop``, their slots."""

    source: int
    start: int
    stop: int
    sizes: list[int]
    owners: list[int | None]  # the slot whose range is exactly the piece, or None


def _split_of(source: int, slots: list[tuple[int, Range]]) -> tuple[_Split, list[tuple[int, int, int, int]]]:
    """Return ``source`` cut at its ranges' boundaries, and (slot, source, start, stop) of ranges across pieces."""
    cuts = sorted({bound for _slot, rng in slots for bound in rng[1:]})
    position = {cut: index for index, cut in enumerate(cuts)}
    owners: list[int | None] = [None] * max(len(cuts) - 1, 0)
    sliced = []
    for slot, (_source, start, stop) in slots:
        if position[stop] == position[start] + 1:
            owners[position[start]] = slot
        else:  # empty, or across a boundary of another range
            sliced.append((slot, source, start, stop))
    sizes = [b - a for a, b in zip(cuts, cuts[1:])]
    return _Split(source, cuts[0] if cuts else 0, cuts[-1] if cuts else 0, sizes, owners), sliced


@dataclass
class _Sources:
    """The flat sources of one form being bound: where each storage lives, and the private buffers made."""

    layout: CallLayout
    dtype: Any
    device: Any
    buffers: list[Any]
    places: dict[Storage, tuple[int, int]] = field(default_factory=dict)  # storage -> (source, elements)

    def work(self, chunks: int) -> int:
        """Return the source of a new zeroed work buffer of ``chunks`` chunks."""
        self.buffers.append(torch.zeros(chunks * self.layout.chunk_elems, dtype=self.dtype, device=self.device))
        return _PRIVATE_BASE + len(self.buffers) - 1

    def user_blocks(self, source: int, blocks: int) -> list[Range]:
        """Return the ranges of the ``blocks`` blocks of a user tensor."""
        numel = self.layout.numel
        return [(source, b * numel, (b + 1) * numel) for b in range(blocks)]

    def work_blocks(self, source: int, blocks: int) -> list[Range]:
        """Return the ranges of the ``blocks`` blocks of a padded work buffer (a block is ``per_block`` chunks)."""
        stride, numel = self.layout.per_block * self.layout.chunk_elems, self.layout.numel
        return [(source, b * stride, b * stride + numel) for b in range(blocks)]

    def place(self, storage: Storage, source: int, chunks: int) -> None:
        """Put ``storage`` (``chunks`` chunks) in ``source``."""
        self.places[storage] = (source, chunks * self.layout.chunk_elems)


def bind_index_space(
    plan: RankPlan, layout: CallLayout, form: CallForm, scratch: Mapping[Storage, Any], dtype: Any, device: Any
) -> IndexBinding:
    """Return ``plan`` bound for calls of aliasing ``form``: copies and rounds over ranges, buffers allocated once."""
    sources = _Sources(layout, dtype, device, [scratch[storage] for storage in _PRIVATE_STORAGES])
    for number, storage in enumerate(_PRIVATE_STORAGES):
        sources.place(storage, _PRIVATE_BASE + number, plan.chunks(storage))
    if form.one_buffer:
        # MSCCL's in-place call: the caller's one buffer is the schedule's, so nothing is copied
        one = Storage.OUTPUT if plan.collective is Collective.ALLGATHER else Storage.INPUT
        source = OUTPUT_SOURCE if one is Storage.OUTPUT else INPUT_SOURCE
        sources.place(one, source, plan.chunks(one))
        copy_in: list[tuple[Range, Range]] = []
        copy_out: list[tuple[Range, Range]] = []
    else:
        copy_in, copy_out = _bind_copies(plan, form, sources)
    slots = RangeSlots(_PRIVATE_BASE + len(sources.buffers))
    rounds = bind_rounds(
        plan.rounds, sources.places, layout.chunk_elems, layout.segment_elems, slots, eager_sends=layout.eager_sends
    )
    buffers = list(sources.buffers)
    if slots.staging_elems:
        buffers.append(torch.empty(slots.staging_elems, dtype=dtype, device=device))
    logger.debug(
        "%s rank %d: bound %s to %s with %d copies in and %d out",
        plan.name,
        layout.rank,
        "an in-place schedule" if plan.inplace else "an out-of-place schedule",
        "the caller's one buffer" if form.one_buffer else "the caller's tensors",
        len(copy_in),
        len(copy_out),
    )
    return IndexBinding(
        form,
        buffers,
        slots.ranges,
        [(slots.slot(d), slots.slot(s)) for d, s in copy_in],
        [(slots.slot(d), slots.slot(s)) for d, s in copy_out],
        rounds,
        plan.final_send_waits,
    )


def _bind_copies(plan: RankPlan, form: CallForm, sources: _Sources) -> tuple[list, list]:
    """Place the user storages of a call not in the plan's in-place form; return its (dst, src) copies in and out."""
    layout = sources.layout
    copy_in: list[tuple[Range, Range]] = []
    copy_out: list[tuple[Range, Range]] = []
    out_whole = (OUTPUT_SOURCE, 0, layout.out_blocks * layout.numel)
    if plan.inplace and plan.collective is not Collective.REDUCESCATTER:
        # one buffer: allgather's input sits in block `rank` of the output; allreduce/alltoall reduce in place
        storage = Storage.OUTPUT if plan.collective is Collective.ALLGATHER else Storage.INPUT
        if layout.padded:
            chunks = max(plan.input_chunks, plan.output_chunks)
            source = sources.work(chunks)
            targets = sources.work_blocks(source, layout.out_blocks)
            copy_out += list(zip(sources.user_blocks(OUTPUT_SOURCE, layout.out_blocks), targets))
        else:
            source, chunks = OUTPUT_SOURCE, plan.chunks(storage)
            targets = sources.user_blocks(OUTPUT_SOURCE, layout.out_blocks)
        sources.place(storage, source, chunks)
        if plan.collective is Collective.ALLGATHER:
            copy_in.append((targets[layout.rank], (INPUT_SOURCE, 0, layout.in_blocks * layout.numel)))
        else:
            copy_in += list(zip(targets, sources.user_blocks(INPUT_SOURCE, layout.in_blocks)))
    elif plan.inplace:  # reducescatter in place: reduce in a copy of the input, the result is block `rank`
        work = sources.work(plan.input_chunks)
        sources.place(Storage.INPUT, work, plan.input_chunks)
        blocks = sources.work_blocks(work, layout.in_blocks)
        copy_in += list(zip(blocks, sources.user_blocks(INPUT_SOURCE, layout.in_blocks)))
        copy_out.append((out_whole, blocks[layout.rank]))
    else:
        if layout.padded or plan.writes_input or form.input_overlaps:
            work = sources.work(plan.input_chunks)
            copy_in += list(
                zip(sources.work_blocks(work, layout.in_blocks), sources.user_blocks(INPUT_SOURCE, layout.in_blocks))
            )
            sources.place(Storage.INPUT, work, plan.input_chunks)
        else:
            sources.place(Storage.INPUT, INPUT_SOURCE, plan.input_chunks)
        if layout.padded:
            work = sources.work(plan.output_chunks)
            copy_out += list(
                zip(sources.user_blocks(OUTPUT_SOURCE, layout.out_blocks), sources.work_blocks(work, layout.out_blocks))
            )
            sources.place(Storage.OUTPUT, work, plan.output_chunks)
        else:
            sources.place(Storage.OUTPUT, OUTPUT_SOURCE, plan.output_chunks)
    return copy_in, copy_out
