"""Which MSCCL XML file a runtime picks for a call: the selection rule, and a report over sizes.

An MSCCL runtime (msccl-executor-nccl's internal scheduler, ``mscclInternalSchedulerSelectAlgo``
in ``src/misc/msccl/msccl_lifecycle.cc`` at c6f6b36; RCCL's copy of it) runs, for a collective
call, the first loaded file that has

* the call's collective and ``ngpus`` equal to the rank count;
* ``count × sizeMultiplier`` divisible by ``nchunksperloop``, where ``count`` is the call's element
  count per rank (NCCL's API) and ``sizeMultiplier`` is ``ngpus`` for allgather, reducescatter and
  alltoall and 1 for allreduce (``msccl_parser.cc``);
* ``minBytes ≤ count × element size × sizeMultiplier`` and (``maxBytes`` = 0 or ``≤ maxBytes``),
  both ends inclusive;
* ``inplace="1"`` for an in-place call, ``outofplace="1"`` otherwise.

Otherwise NCCL's own collective runs, silently. Reduction ops ``avg`` and later are never
scheduled; every call here is a sum. Files are loaded in directory order, so two files that
both match a call make the choice depend on the file system: ``selection_report`` flags that.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.inplace import BOTH_PLACES_KEY
from taccl_py.msccl.export import msccl_max_bytes

__all__ = [
    "DTYPE_SIZES",
    "MscclCall",
    "SelectionKey",
    "ExportedFallback",
    "exported_fallback",
    "Selection",
    "selection_key",
    "size_multiplier",
    "selects",
    "loop_divides_powers_of_two",
    "selectable_for_powers_of_two",
    "power_of_two_sizes",
    "select_file",
    "why_not_selected",
    "selection_report",
]

#: The element sizes users pass (bytes) and the dtype names a report uses for them.
DTYPE_SIZES = {2: "bf16", 4: "fp32"}


@dataclass(frozen=True)
class SelectionKey:
    """What the selection rule reads from one XML file's ``<algo>`` element (bytes; ``max_bytes`` 0: no end)."""

    name: str
    collective: Collective
    num_ranks: int
    chunks_per_loop: int
    min_bytes: int
    max_bytes: int
    inplace: bool
    outofplace: bool


@dataclass(frozen=True)
class ExportedFallback:
    """Sizes [min_bytes, max_bytes) of a collective an export left to NCCL on purpose, and why (None: no end)."""

    collective: Collective
    num_ranks: int
    min_bytes: int
    max_bytes: int | None
    reason: str


@dataclass(frozen=True)
class MscclCall:
    """One collective call as the runtime sees it: ``size_bytes`` is nccl-tests' size (the whole buffer)."""

    collective: Collective
    num_ranks: int
    size_bytes: int
    dtype_size: int
    inplace: bool

    @property
    def count(self) -> int:
        """Return NCCL's per-call element count (per rank for allgather, reducescatter and alltoall)."""
        return self.size_bytes // (self.dtype_size * size_multiplier(self.collective, self.num_ranks))

    @property
    def nbytes(self) -> int:
        """Return the size the runtime compares with ``minBytes``/``maxBytes``: count × element size × multiplier."""
        return self.count * self.dtype_size * size_multiplier(self.collective, self.num_ranks)


@dataclass(frozen=True)
class Selection:
    """The file a call selects (None: NCCL's own collective runs), and every file that matched."""

    call: MscclCall
    chosen: str | None
    matches: tuple[str, ...]

    @property
    def ambiguous(self) -> bool:
        """Return True when more than one file matches, so the file system's order decides."""
        return len(self.matches) > 1


def size_multiplier(collective: Collective, num_ranks: int) -> int:
    """Return MSCCL's ``sizeMultiplier``: how many counts make up the nccl-tests size."""
    return num_ranks if collective in (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLTOALL) else 1


def selection_key(algorithm: Algorithm) -> SelectionKey:
    """Return the selection fields the export of ``algorithm`` writes (``max_bytes`` as the file says it).

    An out-of-place schedule marked ``BOTH_PLACES_KEY`` serves in-place calls too.
    """
    both_placements = algorithm.meta(BOTH_PLACES_KEY) == "1"
    return SelectionKey(
        algorithm.name,
        algorithm.collective,
        algorithm.num_ranks,
        algorithm.chunks_per_loop,
        algorithm.min_bytes,
        msccl_max_bytes(algorithm),
        algorithm.inplace or both_placements,
        not algorithm.inplace or both_placements,
    )


def selects(key: SelectionKey, call: MscclCall) -> bool:
    """Return True when the runtime's rule picks the file ``key`` describes for ``call``."""
    count = call.count
    return (
        key.collective is call.collective
        and key.num_ranks == call.num_ranks
        and count > 0
        and (count * size_multiplier(call.collective, call.num_ranks)) % key.chunks_per_loop == 0
        and _covers(key, call.nbytes)
        and (key.inplace if call.inplace else key.outofplace)
    )


def _covers(key: SelectionKey, nbytes: int) -> bool:
    """Return True when the file's size range holds ``nbytes`` (both ends inclusive; ``max_bytes`` 0: no end)."""
    return key.min_bytes <= nbytes and (key.max_bytes == 0 or nbytes <= key.max_bytes)


def loop_divides_powers_of_two(collective: Collective, num_ranks: int, chunks_per_loop: int) -> bool:
    """Return True when ``chunks_per_loop`` divides ``count × sizeMultiplier`` for every large power-of-two count.

    Element counts users pass are powers of two; a loop with an odd factor the multiplier does
    not cancel (an NDv2 ring of 6 channels: 48 chunks) never divides them, and MSCCL falls back
    to NCCL at every size.
    """
    rest = chunks_per_loop // math.gcd(chunks_per_loop, size_multiplier(collective, num_ranks))
    return rest & (rest - 1) == 0


def selectable_for_powers_of_two(algorithm: Algorithm) -> bool:
    """Return True unless MSCCL never selects ``algorithm`` for power-of-two counts where another loop would be.

    Where no loop can divide them (an AllReduce over a rank count that is not a power of two
    needs a multiple of it), every algorithm is as selectable as any other: True.
    """
    collective, num_ranks = algorithm.collective, algorithm.num_ranks
    if not loop_divides_powers_of_two(collective, num_ranks, num_ranks):
        return True
    return loop_divides_powers_of_two(collective, num_ranks, algorithm.chunks_per_loop)


def power_of_two_sizes(low: int, high: int) -> tuple[int, ...]:
    """Return the powers of two from ``low`` to ``high`` bytes, both included where they are powers."""
    size = 1 << max(0, (low - 1).bit_length())
    out = []
    while size <= high:
        out.append(size)
        size <<= 1
    return tuple(out)


def exported_fallback(fallbacks: Sequence[ExportedFallback], call: MscclCall) -> ExportedFallback | None:
    """Return the run of sizes an export left to NCCL that holds ``call`` (its ``nbytes``), if any."""
    for fallback in fallbacks:
        if (
            fallback.collective is call.collective
            and fallback.num_ranks == call.num_ranks
            and fallback.min_bytes <= call.nbytes
            and (fallback.max_bytes is None or call.nbytes < fallback.max_bytes)
        ):
            return fallback
    return None


def select_file(keys: Sequence[SelectionKey], call: MscclCall) -> Selection:
    """Return which of ``keys`` the runtime selects for ``call``; files in name order, as a sorted folder lists them."""
    matches = tuple(key.name for key in sorted(keys, key=lambda key: key.name) if selects(key, call))
    return Selection(call, matches[0] if matches else None, matches)


def why_not_selected(keys: Sequence[SelectionKey], call: MscclCall) -> str:
    """Return why no file of ``keys`` serves ``call``, naming the first test every candidate fails."""
    same = [key for key in keys if key.collective is call.collective and key.num_ranks == call.num_ranks]
    if not same:
        return f"no {call.collective.value} file for {call.num_ranks} ranks"
    placed = [key for key in same if (key.inplace if call.inplace else key.outofplace)]
    if not placed:
        return f"no {'in-place' if call.inplace else 'out-of-place'} file"
    covering = [key for key in placed if _covers(key, call.nbytes)]
    if not covering:
        return "no file's size range covers it"
    loops = sorted({key.chunks_per_loop for key in covering})
    return f"nchunksperloop {', '.join(map(str, loops))} does not divide the element count"


def selection_report(
    keys: Sequence[SelectionKey],
    sizes: Iterable[int],
    placements: dict[Collective, tuple[bool, ...]],
    dtype_sizes: Iterable[int] = tuple(DTYPE_SIZES),
) -> tuple[Selection, ...]:
    """Return the selection of every (collective, placement, dtype, size) call the files could serve.

    ``placements`` maps each collective to the placements checked (True: in place); the rank count
    is each collective's files' own.
    """
    sizes, dtype_sizes = tuple(sizes), tuple(dtype_sizes)
    out = []
    for collective, inplaces in placements.items():
        ranks = sorted({key.num_ranks for key in keys if key.collective is collective})
        for num_ranks in ranks:
            for inplace in inplaces:
                for dtype_size in dtype_sizes:
                    for size in sizes:
                        out.append(select_file(keys, MscclCall(collective, num_ranks, size, dtype_size, inplace)))
    return tuple(out)
