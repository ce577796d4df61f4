"""The level of a line every rank of a group logs alike: a WARNING on rank 0, DEBUG on the others.

A fall-back the Communicator takes on one rank it takes on every rank (the choice depends only on
the library, the collective, the size and the cluster, which the ranks share), so a job of N ranks
would print the same warning N times. Rank 0 of the group speaks for it; the others keep the line
at DEBUG, where ``-vv`` or a DEBUG handler still shows it.
"""

from __future__ import annotations

import logging

__all__ = ["REPORTING_RANK", "group_warning_level"]

#: The rank of a group whose log carries the group's warnings (torchrun's rank 0, the one users read).
REPORTING_RANK = 0


def group_warning_level(rank: int) -> int:
    """Return ``logging.WARNING`` for rank ``REPORTING_RANK`` of the group and ``logging.DEBUG`` for the others.

    >>> group_warning_level(0) == logging.WARNING, group_warning_level(3) == logging.DEBUG
    (True, True)
    """
    return logging.WARNING if rank == REPORTING_RANK else logging.DEBUG
