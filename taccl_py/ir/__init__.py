"""The schedule IR: collectives and their chunk layouts, the Algorithm and its JSON, size-band
libraries, the dataflow of primitive actions, and lowering of transfer plans to an Algorithm.

Every other stage stands on this package; it imports nothing above it.
"""

from __future__ import annotations

from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.algorithm_json import (
    ALGORITHM_SCHEMA,
    generate_algorithm_json,
    parse_algorithm_json,
    read_algorithm,
    write_algorithm,
)
from taccl_py.ir.collectives import Collective, chunk_layout
from taccl_py.ir.library import AlgorithmLibrary, SizeBand, read_library

__all__ = [
    "ALGORITHM_SCHEMA",
    "Algorithm",
    "AlgorithmLibrary",
    "Buffer",
    "Collective",
    "OpType",
    "RankProgram",
    "SizeBand",
    "Step",
    "Threadblock",
    "chunk_layout",
    "generate_algorithm_json",
    "parse_algorithm_json",
    "read_algorithm",
    "read_library",
    "write_algorithm",
]
