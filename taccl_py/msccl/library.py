"""MSCCL XML for a whole algorithm library: one file per size band, its size range in ``minBytes``/``maxBytes``.

The MSCCL runtimes load every XML file of a folder (msccl-executor-nccl's and RCCL's algorithm
directory) and pick, per call, the algorithm whose collective, rank count and size range fit;
so a library becomes a folder of XML files, one per band. A band whose schedule breaks the
runtime's limits (``taccl_py.msccl.limits``) is left out and reported: our own runtime still
runs it from the library. A "native" band gets no file, silently: where no XML covers a size, MSCCL
runs NCCL's own collective, which is what the band asks for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from taccl_py._io import write_text_atomic
from taccl_py.errors import ArgumentError
from taccl_py.ir.library import AlgorithmLibrary, SizeBand
from taccl_py.msccl.dialect import Dialect, parse_dialect
from taccl_py.msccl.export import generate_msccl_xml
from taccl_py.msccl.limits import DEFAULT_RUNTIME, Runtime

__all__ = ["LibraryXml", "generate_library_xml", "library_xml_name", "write_library_xml"]


@dataclass(frozen=True)
class LibraryXml:
    """The XML files of a library, as (file name, text), and the bands left out as (band index, why)."""

    files: tuple[tuple[str, str], ...]
    skipped: tuple[tuple[int, str], ...]


def library_xml_name(library: AlgorithmLibrary, index: int) -> str:
    """Return the XML file name of band ``index``: unique across machines, node counts and collectives.

    >>> from taccl_py.ir import AlgorithmLibrary, Collective
    >>> library_xml_name(AlgorithmLibrary("ndv2", 2, Collective.ALLGATHER, 16, ()), 3)
    'ndv2-n2-allgather-3.xml'
    """
    return f"{library.topology}-n{library.nodes}-{library.collective.value}-{index}.xml"


def _band_xml(library: AlgorithmLibrary, index: int, band: SizeBand, dialect: Dialect, runtime: Runtime | str) -> str:
    # The band's range is what a runtime selects by, whatever range the algorithm was saved with.
    algorithm = replace(
        band.algorithm,
        name=library_xml_name(library, index).removesuffix(".xml"),
        min_bytes=band.min_bytes,
        max_bytes=band.max_bytes,
    )
    return generate_msccl_xml(algorithm, dialect, runtime=runtime)


def generate_library_xml(
    library: AlgorithmLibrary, dialect: Dialect | str = Dialect.NEW, *, runtime: Runtime | str = DEFAULT_RUNTIME
) -> LibraryXml:
    """Return the MSCCL XML of every band of ``library`` that ``runtime`` (default: every MSCCL runtime) can load.

    The open-ended last band gets ``maxBytes="0"``, which the MSCCL tools write for "no upper end".
    """
    dialect = parse_dialect(dialect)
    files, skipped = [], []
    for index, band in enumerate(library.bands):
        if band.native:  # no XML: MSCCL runs NCCL's own collective wherever no algorithm covers the size
            continue
        try:
            files.append((library_xml_name(library, index), _band_xml(library, index, band, dialect, runtime)))
        except ArgumentError as error:
            skipped.append((index, str(error)))
    return LibraryXml(tuple(files), tuple(skipped))


def write_library_xml(
    library: AlgorithmLibrary,
    folder: str | Path,
    dialect: Dialect | str = Dialect.NEW,
    *,
    runtime: Runtime | str = DEFAULT_RUNTIME,
) -> LibraryXml:
    """Write the XML of every loadable band of ``library`` into ``folder``; return what was written and left out.

    The bands left out are only returned (``LibraryXml.skipped``): the caller reports them.

    Every text is generated before the first file is written, each file through a temporary name.
    """
    export = generate_library_xml(library, dialect, runtime=runtime)
    if export.files:
        Path(folder).mkdir(exist_ok=True)  # the folder is the output named; its parent must exist
    for name, text in export.files:
        write_text_atomic(Path(folder) / name, text)
    return export
