"""The message sizes MSCCL++'s executor accepts for a plan, and the largest size whose offsets it can hold.

Our reading of microsoft/mscclpp @1f5f065d, ``src/core/executor/execution_plan.cc``:

* ``checkMessageSize`` (:299-311), run on every first load of a plan and every new size, throws
  unless the input and output sizes are multiples of ``buffer_alignment`` and
  ``(size / buffer_alignment) % chunks == 0`` for the input and the output; then the message size
  (AllGather: the output, else the input) must lie in ``min_message_size``..``max_message_size``.
  MSCCL++'s NCCL shim selects a plan by size range alone (``matchExecutionPlan``,
  src/ext/nccl/algorithm_selector.cc), so a size the plan refuses is a failed call, not a fallback.
* Offsets and sizes of operations are ``uint32_t`` (``execution_common.hpp``; ``getBufferSize``
  truncates its begin and end offsets, :650-654): a buffer of 2^32 bytes or more wraps silently.
  Scratch is ``scratch_chunks`` chunks of the per-rank chunk, twice that under LL (data and flag)
  and twice again with ``use_double_scratch_buffer`` (``calScratchBufferSize``, :191-216).

``executor_warnings`` says, for ``taccl verify``, where a correct plan would still run otherwise
than it reads: those sizes, and a ``reduce_op`` other than sum, which the parser never reads
(``setupOperation``, :478-599) while the reduce kernels sum (src/core/include/execution_kernel.hpp:753-764).

Sizes are in bytes, in nccl-tests' convention (the whole buffer), as ``min_message_size`` is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from math import lcm

from taccl_py.mscclpp.plan import ExecutionPlan, Operation, Protocol

__all__ = [
    "FRAMEWORK_SIZES",
    "MIN_MESSAGE_SIZE_LIMIT",
    "SHOWN_SIZES",
    "executor_warnings",
    "OFFSET_LIMIT",
    "AcceptanceRule",
    "acceptance_rule",
    "addressable_size",
    "buffer_bytes",
    "executor_accepts",
    "first_accepted_min",
    "framework_sizes",
    "largest_addressable_size",
    "refused_sizes",
    "size_multiple",
]

# One past the largest byte offset an operation can hold (uint32_t).
OFFSET_LIMIT = 2**32
# One past the largest min_message_size the parser reads right: it deduces int
# (``obj.value("min_message_size", 0)``, execution_plan.cc:132, 250), so 2^31 and up refuse every size.
MIN_MESSAGE_SIZE_LIMIT = 2**31
MIB = 2**20
# Sizes frameworks pass besides powers of two: PyTorch DDP's default bucket (25 MiB) and two
# common odd multiples of a MiB.
FRAMEWORK_SIZES = (3 * MIB, 25 * MIB, 100 * MIB)


def buffer_bytes(collective: str, num_ranks: int, message_size: int) -> tuple[int, int]:
    """Return the (input, output) bytes per rank of a call of ``message_size`` bytes (nccl-tests' size)."""
    if collective == "allgather":
        return message_size // num_ranks, message_size
    if collective == "reducescatter":
        return message_size, message_size // num_ranks
    return message_size, message_size


def _divides(size: int, alignment: int, chunks: int) -> bool:
    return size % alignment == 0 and (chunks == 0 or (size // alignment) % chunks == 0)


def executor_accepts(plan: ExecutionPlan, message_size: int) -> bool:
    """Return True when every rank's executor takes ``plan`` at ``message_size`` bytes without throwing.

    The split of the message into per-rank buffers must be exact (AllGather and ReduceScatter
    over N ranks: a multiple of N), then ``checkMessageSize``'s test holds on every GPU.
    """
    num_ranks = len(plan.gpus)
    if plan.collective in ("allgather", "reducescatter") and message_size % num_ranks:
        return False
    if not plan.min_message_size <= message_size <= plan.max_message_size:
        return False
    input_bytes, output_bytes = buffer_bytes(plan.collective, num_ranks, message_size)
    alignment = plan.buffer_alignment
    return all(
        _divides(input_bytes, alignment, gpu.input_chunks) and _divides(output_bytes, alignment, gpu.output_chunks)
        for gpu in plan.gpus
    )


def framework_sizes(low: int, high: int) -> tuple[int, ...]:
    """Return the sizes frameworks pass within ``low``..``high`` bytes (both inclusive), ascending.

    Every power of two there, and ``FRAMEWORK_SIZES``.
    """
    sizes = {1 << bit for bit in range(max(0, low - 1).bit_length(), high.bit_length() + 1) if low <= 1 << bit <= high}
    sizes |= {size for size in FRAMEWORK_SIZES if low <= size <= high}
    return tuple(sorted(sizes))


def refused_sizes(plan: ExecutionPlan, sizes: Iterable[int] | None = None) -> tuple[int, ...]:
    """Return the sizes of ``sizes`` (default: ``framework_sizes`` of the plan's range) the executor refuses.

    An open range is checked up to ``largest_addressable_size``.
    """
    if sizes is None:
        sizes = framework_sizes(plan.min_message_size, _largest_served(plan))
    return tuple(size for size in sizes if not executor_accepts(plan, size))


@dataclass(frozen=True)
class AcceptanceRule:
    """What sizes (bytes) a plan takes: multiples of ``multiple_bytes`` from ``min_bytes`` to ``max_bytes``.

    ``powers_of_two_from``: the least power of two from which every larger power of two in the
    range is taken (None: no power of two is, the multiple having an odd factor).
    """

    multiple_bytes: int
    min_bytes: int
    max_bytes: int
    powers_of_two_from: int | None

    def describe(self) -> str:
        """Return the rule as one phrase, e.g. ``'multiples of 768 B (no power of two)'``."""
        powers = (
            "no power of two"
            if self.powers_of_two_from is None
            else f"every power of two from {self.powers_of_two_from} B"
        )
        return f"multiples of {self.multiple_bytes} B ({powers})"


def acceptance_rule(plan: ExecutionPlan) -> AcceptanceRule:
    """Return the least message-size multiple ``plan`` takes on every rank, and where powers of two start."""
    chunks = ((gpu.input_chunks, gpu.output_chunks) for gpu in plan.gpus)
    multiple = size_multiple(plan.collective, len(plan.gpus), plan.buffer_alignment, chunks)
    high = _largest_served(plan)
    start = None
    if multiple & (multiple - 1) == 0:  # no odd factor: every power of two from the multiple on
        start = max(multiple, 1 << max(0, plan.min_message_size - 1).bit_length())
        start = start if start <= high else None
    return AcceptanceRule(multiple, plan.min_message_size, high, start)


def size_multiple(collective: str, num_ranks: int, alignment: int, chunk_counts: Iterable[tuple[int, int]]) -> int:
    """Return the least message size (bytes) every rank's (input, output) chunk counts split into aligned units."""
    multiple = 1
    for input_chunks, output_chunks in chunk_counts:
        for chunks, share in (
            (input_chunks, _input_share(collective, num_ranks)),
            (output_chunks, _output_share(collective, num_ranks)),
        ):
            multiple = lcm(multiple, alignment * max(chunks, 1) * share)
    return multiple


def first_accepted_min(plan: ExecutionPlan) -> int | None:
    """Return the least ``min_message_size`` from which ``plan`` takes every framework size up to its maximum (bytes).

    The plan's own minimum when it refuses none; else the first framework size above the
    largest it refuses. None: it takes no power of two in its range.
    """
    if acceptance_rule(plan).powers_of_two_from is None:
        return None
    sizes = framework_sizes(plan.min_message_size, _largest_served(plan))
    refused = refused_sizes(plan, sizes)
    if not refused:
        return plan.min_message_size
    later = [size for size in sizes if size > refused[-1]]
    return later[0] if later else None


def _input_share(collective: str, num_ranks: int) -> int:
    """Return how many input buffers make up the message (AllGather: N)."""
    return num_ranks if collective == "allgather" else 1


def _output_share(collective: str, num_ranks: int) -> int:
    """Return how many output buffers make up the message (ReduceScatter: N)."""
    return num_ranks if collective == "reducescatter" else 1


def _largest_served(plan: ExecutionPlan) -> int:
    """Return the largest size (bytes) ``plan`` may serve: its maximum, at most where its offsets still fit."""
    return min(plan.max_message_size, largest_addressable_size(plan))


def largest_addressable_size(plan: ExecutionPlan) -> int:
    """Return the largest message size (bytes) at which every buffer of every rank stays below ``OFFSET_LIMIT``.

    A buffer's bytes grow linearly with the message: input and output as ``buffer_bytes`` says,
    scratch as ``scratch_chunks`` per-rank chunks (x2 under LL, x2 again when double-buffered).
    """
    scratch_factor = (2 if plan.protocol is Protocol.LL else 1) * (2 if plan.use_double_scratch_buffer else 1)
    chunks = ((gpu.input_chunks, gpu.output_chunks, gpu.scratch_chunks) for gpu in plan.gpus)
    return addressable_size(plan.collective, len(plan.gpus), chunks, scratch_factor)


def addressable_size(
    collective: str, num_ranks: int, chunk_counts: Iterable[tuple[int, int, int]], scratch_factor: int = 1
) -> int:
    """Return the largest message size (bytes) whose buffers stay below ``OFFSET_LIMIT`` on every rank.

    ``chunk_counts``: each rank's (input, output, scratch) chunks; ``scratch_factor``: scratch
    bytes per scratch chunk's data bytes (2 under LL, 2 again when double-buffered).
    """
    input_share = _input_share(collective, num_ranks)
    output_share = _output_share(collective, num_ranks)
    largest = OFFSET_LIMIT * num_ranks  # bytes of message at which a 1/N-per-rank buffer would reach the limit
    for input_chunks, output_chunks, scratch_chunks in chunk_counts:
        # (numerator, denominator) of buffer bytes per message byte; scratch counts chunks of the input
        # (of the output where a rank has no input chunks)
        ratios = [(1, input_share), (1, output_share)]
        if scratch_chunks:
            if input_chunks:
                ratios.append((scratch_chunks * scratch_factor, input_chunks * input_share))
            elif output_chunks:
                ratios.append((scratch_chunks * scratch_factor, output_chunks * output_share))
        for numerator, denominator in ratios:
            # buffer = message * numerator / denominator < OFFSET_LIMIT
            largest = min(largest, ((OFFSET_LIMIT * denominator) - 1) // numerator)
    return largest


SHOWN_SIZES = 4  # refused sizes a warning names before "..."
SUMMED = "sum"  # the only reduction MSCCL++'s kernels run


def _operations(ops: tuple[Operation, ...]) -> Iterator[Operation]:
    for op in ops:
        yield op
        yield from _operations(op.ops)


def executor_warnings(plan: ExecutionPlan) -> tuple[str, ...]:
    """Return one line per way MSCCL++'s executor would run ``plan`` otherwise than it reads.

    A reduction other than sum (it sums), framework sizes in the plan's range that it refuses
    (``refused_sizes``: it throws), and a range past ``largest_addressable_size`` (offsets wrap).
    """
    warnings = []
    declared = {
        op.reduce_op
        for gpu in plan.gpus
        for tb in gpu.threadblocks
        for op in _operations(tb.ops)
        if op.reduce_op not in (None, SUMMED)
    }
    if declared:
        names = ", ".join(sorted(declared))
        warnings.append(f"declares reduce_op {names}; MSCCL++ never reads it and sums")
    if refused := refused_sizes(plan):
        shown = ", ".join(str(size) for size in refused[:SHOWN_SIZES]) + (", ..." if len(refused) > SHOWN_SIZES else "")
        rule = acceptance_rule(plan).describe()
        warnings.append(
            f"MSCCL++ refuses {len(refused)} sizes frameworks pass in its range ({shown} bytes): it takes {rule}"
        )
    if plan.min_message_size >= MIN_MESSAGE_SIZE_LIMIT:
        warnings.append(
            f"min_message_size {plan.min_message_size} is 2^31 or more, which MSCCL++ reads as a negative int: "
            "it refuses every size"
        )
    largest = largest_addressable_size(plan)
    if plan.max_message_size > largest:
        warnings.append(
            f"max_message_size {plan.max_message_size} passes {largest} bytes, where a 32-bit offset would wrap"
        )
    return tuple(warnings)
