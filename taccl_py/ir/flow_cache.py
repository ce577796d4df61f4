"""The last algorithm's dataflow, kept while that algorithm lives: verifying then simulating it builds it once.

Every baseline and candidate is verified (``taccl_py.verify``) and then simulated
(``taccl_py.simulate.prepare_simulation``), and both start from ``build_dataflow``. At 256 GPUs the
doubling AllReduce has 529K steps and its dataflow takes 17 CPU-s to build. ``Algorithm`` is
immutable, so the same object always has the same dataflow: one entry, found by identity, dropped
when the algorithm is collected or before the next one is built (never two dataflows held at once).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import replace

from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.dataflow import Dataflow, build_dataflow

__all__ = ["dataflow_of"]

_lock = threading.RLock()  # re-entrant: a collection inside the lock may run _forget
# (weak reference to the algorithm, its dataflow without the algorithm): a strong one would keep it alive.
_last: list[tuple[weakref.ref[Algorithm], Dataflow]] = []


def dataflow_of(algorithm: Algorithm) -> Dataflow:
    """Return ``build_dataflow(algorithm)``, built once for the algorithm last asked about."""
    with _lock:
        if _last and _last[0][0]() is algorithm:
            return replace(_last[0][1], algorithm=algorithm)
        _last.clear()  # free the previous dataflow before building this one
    flow = build_dataflow(algorithm)
    with _lock:
        _last[:] = [(weakref.ref(algorithm, _forget), replace(flow, algorithm=None))]
    return flow


def _forget(reference: weakref.ref[Algorithm]) -> None:
    """Drop the entry of a collected algorithm (its dataflow can be large)."""
    with _lock:
        if _last and _last[0][0] is reference:
            _last.clear()
