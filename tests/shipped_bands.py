"""Shipped library bands as test parameters: named from each library's JSON alone, read when a test runs.

Reading every band (xz and parse) to name parameters took seconds of collection on every xdist
worker; a test reads only its own band, once a process.
"""

from __future__ import annotations

import functools
import json

from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.algorithm_json import read_algorithm
from taccl_py.ir.library import NATIVE_ALGORITHM, shipped_library_paths


def shipped_bands(machine: str, nodes: int = 1) -> list[tuple[str, int]]:
    """Return (collective, band index) of every band with an algorithm in ``machine``'s shipped libraries."""
    bands = []
    for path in shipped_library_paths(machine, nodes):
        document = json.loads(path.read_text())
        names = [band["algorithm"] for band in document["bands"]]
        bands += [(document["collective"], index) for index, name in enumerate(names) if name != NATIVE_ALGORITHM]
    return bands


@functools.cache
def shipped_band(machine: str, nodes: int, collective: str, index: int) -> Algorithm:
    """Return the algorithm of band ``index`` of ``machine``'s shipped ``collective`` library at ``nodes``."""
    (path,) = (p for p in shipped_library_paths(machine, nodes) if p.name == f"{collective}.library.json")
    return read_algorithm(path.parent / json.loads(path.read_text())["bands"][index]["algorithm"])


def outer_bands(bands: list[tuple[str, int]], left_out: set[tuple[str, int]] = frozenset()) -> set[tuple[str, int]]:
    """Return the first and the last of ``bands`` of each collective, less ``left_out``: a sweep's representatives.

    Band 0 holds a library's smallest sizes; the last kept, its largest schedule.
    """
    by_collective: dict[str, list[tuple[str, int]]] = {}
    for band in bands:
        if band not in left_out:
            by_collective.setdefault(band[0], []).append(band)
    return {band for kept in by_collective.values() for band in (kept[0], kept[-1])}
