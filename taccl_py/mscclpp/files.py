"""MSCCL++ plan files: one algorithm, or every size band of a library, verified twice before anything is written.

The algorithm is verified in our IR (``taccl_py.verify``), and the plan generated from it is read
back and replayed with MSCCL++'s semantics (``taccl_py.mscclpp.replay``), so a fault of the
translation is caught here rather than on a GPU. A library gives one plan per band and placement:
MSCCL++ selects a plan by collective, message size (``min_message_size``..``max_message_size``,
inclusive) and ``inplace``, so a band that is also safe in place gets a second, in-place plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from taccl_py._io import write_text_atomic
from taccl_py.errors import ArgumentError, VerificationError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.library import AlgorithmLibrary
from taccl_py.mscclpp.export import generate_mscclpp_plan
from taccl_py.mscclpp.parse import parse_mscclpp_plan
from taccl_py.mscclpp.replay import verify_mscclpp_plan
from taccl_py.topology.model import Topology
from taccl_py.verify import check_algorithm, exported_inplace_form

__all__ = [
    "LibraryPlans",
    "generate_library_plans",
    "library_plan_name",
    "mscclpp_plan_text",
    "write_library_plans",
    "write_mscclpp_plan",
]


@dataclass(frozen=True)
class LibraryPlans:
    """The plan files of a library as (file name, JSON text), and the placements left out as (band index, why)."""

    files: tuple[tuple[str, str], ...]
    skipped: tuple[tuple[int, str], ...]


def mscclpp_plan_text(algorithm: Algorithm, topology: Topology | None = None) -> str:
    """Return ``algorithm`` as the JSON text of an MSCCL++ plan, both verified.

    Raises ``VerificationError`` when the algorithm, or the plan read back, is wrong, and
    ``ArgumentError`` where the plan would pass MSCCL++'s limits (``generate_mscclpp_plan``).
    """
    text = json.dumps(generate_mscclpp_plan(check_algorithm(algorithm), topology), indent=2) + "\n"
    verify_mscclpp_plan(parse_mscclpp_plan(text, f"{algorithm.name} (exported)"))
    return text


def write_mscclpp_plan(algorithm: Algorithm, path: str | Path, topology: Topology | None = None) -> None:
    """Write ``algorithm`` to ``path`` as a verified MSCCL++ plan; nothing is written when it fails."""
    write_text_atomic(path, mscclpp_plan_text(algorithm, topology))


def library_plan_name(library: AlgorithmLibrary, index: int, inplace: bool = False) -> str:
    """Return the plan file name of band ``index``: unique across machines, node counts, collectives and placements.

    >>> from taccl_py.ir import AlgorithmLibrary, Collective
    >>> library_plan_name(AlgorithmLibrary("ndv2", 2, Collective.ALLGATHER, 16, ()), 3, inplace=True)
    'ndv2-n2-allgather-3-inplace.json'
    """
    suffix = "-inplace" if inplace else ""
    return f"{library.topology}-n{library.nodes}-{library.collective.value}-{index}{suffix}.json"


def generate_library_plans(library: AlgorithmLibrary, topology: Topology | None = None) -> LibraryPlans:
    """Return the verified MSCCL++ plans of every band of ``library``, in and out of place, and what was left out.

    A "native" band gets no plan: where no plan covers a size, MSCCL++'s NCCL-compatible library
    runs its own collective, which is what the band asks for.
    """
    files, skipped = [], []
    for index, band in enumerate(library.bands):
        if band.native:
            continue
        # The band's range is what MSCCL++ selects by, whatever range the algorithm was saved with.
        name = library_plan_name(library, index).removesuffix(".json")
        base = replace(band.algorithm, name=name, min_bytes=band.min_bytes, max_bytes=band.max_bytes)
        # MSCCL++ selects by one inplace flag, so an in-place form is always a plan of its own.
        variant, why_not = exported_inplace_form(base)
        if why_not is not None:
            skipped.append((index, f"no in-place plan: {why_not}"))
        for algorithm in [base] if variant is None else [base, variant]:
            try:
                text = mscclpp_plan_text(algorithm, topology)
            except (ArgumentError, VerificationError) as error:
                placement = "in place" if algorithm.inplace else "out of place"
                skipped.append((index, f"{placement}: {error}"))
            else:
                files.append((library_plan_name(library, index, algorithm.inplace), text))
    return LibraryPlans(tuple(files), tuple(skipped))


def write_library_plans(
    library: AlgorithmLibrary, folder: str | Path, topology: Topology | None = None
) -> LibraryPlans:
    """Write the verified plans of every band of ``library`` into ``folder``; return what was written and left out.

    Every text is generated and verified before the first file is written, each file through a temporary name.
    """
    plans = generate_library_plans(library, topology)
    if plans.files:
        Path(folder).mkdir(exist_ok=True)  # the folder is the output named; its parent must exist
    for name, text in plans.files:
        write_text_atomic(Path(folder) / name, text)
    return plans
