"""In-place calls: whether a call's tensors alias as MSCCL's in-place calls do, and which schedule such a call runs.

MSCCL's scheduler (``isInPlace`` in msccl-executor-nccl and RCCL) calls a collective in place when
one buffer serves both ends: AllReduce with ``recvbuff == sendbuff`` (``torch.distributed.all_reduce``
always); AllGather with ``sendbuff == recvbuff + rank·count·size``, the input being block ``rank``
of the output (FSDP2's ``all_gather_into_tensor(out, out.chunk(world)[rank])``); ReduceScatter with
``recvbuff == sendbuff + rank·count·size``, the output being block ``rank`` of the input.
:func:`is_inplace_call` applies the same pointer tests to torch tensors, on one storage, for the
collectives that run in-place schedules here.

Such a call runs the in-place form of its algorithm (:class:`InplaceForms`): the algorithm itself
when it is ``inplace``, else its :func:`~taccl_py.ir.inplace.inplace_variant` when that verifies
(derived and verified once per algorithm), else the out-of-place algorithm, which the executor runs
on a copy of the aliased buffer. AlltoAll is left to the copy: MSCCL's test for it is AllReduce's,
but a direct exchange overwrites blocks before sending them, so its variant would not verify.
ReduceScatter is left to the copy too: an in-place schedule reduces into the caller's input, while
torch's backends leave the input's other blocks as they were, and callers may rely on that.
"""

from __future__ import annotations

import logging
from typing import Any

from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.inplace import DERIVED_FROM_KEY, inplace_variant

__all__ = ["INPLACE_COLLECTIVES", "InplaceForms", "describe_form", "is_inplace_call"]

logger = logging.getLogger(__name__)

#: The collectives whose aliased calls run an in-place schedule (see the module docstring for the others).
INPLACE_COLLECTIVES = frozenset({Collective.ALLREDUCE, Collective.ALLGATHER})


def is_inplace_call(collective: Collective, output: Any, input: Any, rank: int) -> bool:
    """Return True when ``output`` and ``input`` alias as MSCCL's in-place call of ``collective`` on ``rank``.

    AllReduce: ``output`` starts where ``input`` does; AllGather: ``input`` starts at element
    ``rank · input.numel()`` of ``output``; in each case on the same storage. False for the
    collectives outside ``INPLACE_COLLECTIVES``, whose aliased calls the executor copies.

    >>> import torch
    >>> out = torch.zeros(8)
    >>> is_inplace_call(Collective.ALLGATHER, out, out[4:6], 2), is_inplace_call(Collective.ALLGATHER, out, out[:2], 2)
    (True, False)
    """
    if collective not in INPLACE_COLLECTIVES:
        return False
    if output.untyped_storage().data_ptr() != input.untyped_storage().data_ptr():
        return False
    if collective is Collective.ALLGATHER:
        return input.data_ptr() == output.data_ptr() + rank * input.numel() * input.element_size()
    return output.data_ptr() == input.data_ptr()


def describe_form(algorithm: Algorithm, inplace_call: bool) -> str:
    """Return which form of ``algorithm`` a call runs, in words: ``in-place variant of NAME``, ``NAME (in place)``…

    >>> from taccl_py.ir.lowering import lower_plan
    >>> describe_form(lower_plan("empty", Collective.ALLREDUCE, 2, 2, []), True)
    'empty (out of place, on a copy of the aliased buffer)'
    """
    derived_from = algorithm.meta(DERIVED_FROM_KEY)
    if derived_from:
        return f"in-place variant of {derived_from}"
    if algorithm.inplace:
        return f"{algorithm.name} (in place)"
    return f"{algorithm.name} (out of place{', on a copy of the aliased buffer' if inplace_call else ''})"


class InplaceForms:
    """The schedule each algorithm runs for in-place calls, derived and verified once per algorithm.

    Held by one Communicator; keyed by the algorithm's identity (the algorithm is kept, so its id
    stays its own). Verification runs on the first in-place call of an algorithm, whatever the
    Communicator's ``verify``: it is what decides whether the aliasing is safe.
    """

    __slots__ = ("_forms",)

    def __init__(self) -> None:
        self._forms: dict[int, tuple[Algorithm, Algorithm | None]] = {}

    def __getstate__(self) -> None:
        raise TypeError("InplaceForms belongs to one Communicator and cannot be pickled")

    def form(self, algorithm: Algorithm) -> Algorithm | None:
        """Return the in-place schedule of ``algorithm``: itself when in place, its verified variant, or None.

        None: the variant does not verify; the call runs ``algorithm`` on a copy.
        """
        if algorithm.inplace:
            return algorithm
        entry = self._forms.get(id(algorithm))
        if entry is None:
            entry = self._forms[id(algorithm)] = (algorithm, _verified_variant(algorithm))
        return entry[1]


def _verified_variant(algorithm: Algorithm) -> Algorithm | None:
    """Return ``inplace_variant(algorithm)`` when it verifies, else None (logged once, here)."""
    from taccl_py.verify import verify_algorithm

    variant = inplace_variant(algorithm)
    report = verify_algorithm(variant)
    if report.ok:
        logger.debug("%s: its in-place variant verifies; in-place calls run it", algorithm.name)
        return variant
    # every rank reaches the same verdict: DEBUG, not one line per rank
    logger.debug("%s: its in-place variant does not verify (%s); in-place calls copy", algorithm.name, report.summary())
    return None
