"""Rarer full garbage collections for the processes that synthesize, build and verify.

Synthesis keeps millions of small objects alive at once (topology graphs, dataflows, the simulator's
transfers) and makes few reference cycles, yet CPython walks every live object in each full
collection, by default after every tenth middle one. Ten times rarer: a DGX-H100 x16 AllGather in
67.2 CPU-s instead of 76.3, the same bytes, peak 358 MB against 348 (BENCHMARKS.md, "Rarer full
garbage collections").

Only the ``taccl`` command and the worker processes it starts (builds, ``--jobs``) call it: an API
call inside a user's program leaves that program's collector as it was.
"""

from __future__ import annotations

import gc

__all__ = ["FULL_COLLECTION_EVERY", "collect_cycles_rarely"]

#: Middle-generation collections between two full ones (CPython's default: 10).
FULL_COLLECTION_EVERY = 100


def collect_cycles_rarely() -> None:
    """Make full collections ``FULL_COLLECTION_EVERY / 10`` times rarer in this process; young ones stay as set."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)
