"""How the commands that run on every rank (``bench``, ``profile``) start: under torchrun, or N local gloo ranks."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from taccl_py.errors import ArgumentError

__all__ = ["TORCHRUN_VARIABLES", "run_on_ranks", "world_size_to_be"]

#: The variables torchrun sets that a rank needs to join its group.
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _under_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def world_size_to_be(command: str, nproc: int | None) -> int:
    """Return the group's size before any rank starts: ``nproc``, else torchrun's WORLD_SIZE.

    Raises ``ArgumentError`` for ``nproc`` below 2, or neither ``nproc`` nor torchrun.
    """
    if nproc is not None:
        if nproc < 2:
            raise ArgumentError(None, "--nproc", f"{nproc}", "2 or more local ranks")
        return nproc
    if not _under_torchrun():
        raise ArgumentError(
            None,
            "launch",
            "not started by torchrun and no --nproc",
            f"torchrun --nproc-per-node N taccl {command} ..., or taccl {command} --nproc N ...",
        )
    return int(os.environ["WORLD_SIZE"])


def run_on_ranks(
    worker: Callable[..., Any], run: Callable[[Any], Any], spec: Any, nproc: int | None, join_timeout_s: float
) -> tuple[bool, Any]:
    """Return (whether this process reports, rank 0's value) of ``spec`` measured on every rank.

    With ``nproc``: ``worker(rank, world_size, spec)`` on that many local gloo ranks, and this
    process reports. Under torchrun: ``run(spec)`` here, and only rank 0 reports.
    """
    if nproc is not None:
        from taccl_py.runtime.launch import run_local

        return True, run_local(worker, nproc, (spec,), timeout_s=join_timeout_s)[0]
    value = run(spec)
    return int(os.environ["RANK"]) == 0, value
