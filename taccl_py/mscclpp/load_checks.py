"""What a correct MSCCL++ plan may still do wrong under MSCCL++'s executor: warnings for ``taccl verify``.

Our reading of microsoft/mscclpp @1f5f065d: the parser never reads an op's ``reduce_op``
(``ExecutionPlan::Impl::setupOperation``, src/core/executor/execution_plan.cc:478-599) and the
reduce kernels sum (src/core/include/execution_kernel.hpp:753-764), so a plan declaring another
op sums all the same; sizes the executor refuses and 32-bit offsets as ``taccl_py.mscclpp.sizes``.
"""

from __future__ import annotations

from collections.abc import Iterator

from taccl_py.mscclpp.plan import ExecutionPlan, Operation
from taccl_py.mscclpp.sizes import acceptance_rule, largest_addressable_size, refused_sizes

__all__ = ["SHOWN_SIZES", "executor_warnings"]

SHOWN_SIZES = 4  # refused sizes a warning names before "..."
SUMMED = "sum"  # the only reduction MSCCL++'s kernels run


def _operations(ops: tuple[Operation, ...]) -> Iterator[Operation]:
    for op in ops:
        yield op
        yield from _operations(op.ops)


def executor_warnings(plan: ExecutionPlan) -> tuple[str, ...]:
    """Return one line per way MSCCL++'s executor would run ``plan`` otherwise than it reads.

    A reduction other than sum (it sums), framework sizes in the plan's range that it refuses
    (``sizes.refused_sizes``: it throws), and a range past ``sizes.largest_addressable_size`` (offsets wrap).
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
    largest = largest_addressable_size(plan)
    if plan.max_message_size > largest:
        warnings.append(
            f"max_message_size {plan.max_message_size} passes {largest} bytes, where a 32-bit offset would wrap"
        )
    return tuple(warnings)
