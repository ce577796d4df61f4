"""MSCCL XML for a whole algorithm library: one file per size band, its size range in ``minBytes``/``maxBytes``.

The MSCCL runtimes load every XML file of a folder (msccl-executor-nccl's and RCCL's algorithm
directory) and pick, per call, the algorithm whose collective, rank count, size range, chunk loop
and placement fit (``taccl_py.msccl.selection``); so a library becomes a folder of XML files, one
per band and placement. Band edges are disjoint under MSCCL's inclusive test (``maxBytes`` is the
band's exclusive upper end less one byte). A band whose schedule breaks the
runtime's limits (``taccl_py.msccl.limits``) is left out and reported: our own runtime still
runs it from the library. A "native" band gets no file, silently: where no XML covers a size, MSCCL
runs NCCL's own collective, which is what the band asks for. A band whose chunk loop MSCCL never
selects at the power-of-two element counts users pass, where another loop would be selected
(``selectable_for_powers_of_two``), gets no file either, and says so: its sizes stay with NCCL;
so does a band whose algorithm has switch steps (NVLink SHARP: MSCCL-IR has no in-network op).

Sizes where NCCL's own algorithm is modelled faster than the band's file under MSCCL's loop, in
its protocol (``taccl_py.simulate.leave_to_nccl``), are left to NCCL too: a band's file covers only
the runs of sizes it keeps, one file per run (``<band>``, then ``<band>-part2``...), and each run left
is reported with its reason. Only a library of a built-in machine can be simulated; others keep
their bands whole, with a note.

Writing into a folder that holds an earlier export of the same library, ``write_library_xml``
removes that export's files this one does not overwrite (``replace_earlier``), so that no stale
band's size range overlaps a new one; ``folder_selection_keys`` reads what MSCCL would load there.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from taccl_py._io import read_text
from taccl_py.errors import ArgumentError, FormatError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.inplace import BOTH_PLACES_KEY, DERIVED_FROM_KEY, serves_both_placements
from taccl_py.ir.library import AlgorithmLibrary, SizeBand, band_part_name, export_stem, write_band_files
from taccl_py.msccl.dialect import DIALECTS, Dialect, parse_dialect
from taccl_py.msccl.export import generate_msccl_xml
from taccl_py.msccl.limits import DEFAULT_RUNTIME, Runtime, protocol_limits
from taccl_py.msccl.parse import parse_msccl_selection_key
from taccl_py.msccl.protocol import band_protocols
from taccl_py.msccl.selection import (
    ExportedFallback,
    SelectionKey,
    loop_divides_powers_of_two,
    selectable_for_powers_of_two,
    selection_key,
    size_multiplier,
)
from taccl_py.placement.groups import library_topology
from taccl_py.simulate.leave_to_nccl import (
    LeftToNccl,
    NcclTimes,
    NcclVerdict,
    SizeRange,
    compare_with_nccl,
    library_probe_sizes,
)
from taccl_py.simulate.model import DEFAULT_MODEL
from taccl_py.simulate.protocol import PROTOCOL_COST_TABLES
from taccl_py.topology.builtins import builtin_topology_name, load_topology
from taccl_py.verify import exported_inplace_form

logger = logging.getLogger(__name__)

__all__ = [
    "LibraryXml",
    "folder_selection_keys",
    "generate_library_xml",
    "library_xml_name",
    "unwritten_placements",
    "write_library_xml",
]


@dataclass(frozen=True)
class LibraryXml:
    """The XML files of a library, as (file name, text), and the bands left out as (band index, why).

    ``keys`` holds each file's selection fields, in the order of ``files``; ``notes`` the warnings
    per band (band index, text): a placement without a file, a chunk loop MSCCL selects only at
    counts users rarely pass. ``to_nccl`` holds (band index, why and which sizes) for each band, or
    run of a band's sizes, left to NCCL: MSCCL would never select its file, it has switch steps, or
    NCCL is modelled faster there; ``fallbacks`` the same runs as ``ExportedFallback`` records (for
    ``--check-selection``); ``removed`` the files of an earlier export that writing removed;
    ``unchecked`` why the bands were not compared with NCCL (None: they were, or had nothing to compare).
    """

    files: tuple[tuple[str, str], ...]
    skipped: tuple[tuple[int, str], ...]
    keys: tuple[SelectionKey, ...] = ()
    notes: tuple[tuple[int, str], ...] = ()
    to_nccl: tuple[tuple[int, str], ...] = ()
    removed: tuple[str, ...] = ()
    fallbacks: tuple[ExportedFallback, ...] = ()
    unchecked: str | None = None


def library_xml_name(library: AlgorithmLibrary, index: int, inplace: bool = False) -> str:
    """Return the XML file name of band ``index``: unique across machines, node counts, collectives and placements.

    >>> from taccl_py.ir import AlgorithmLibrary, Collective
    >>> library_xml_name(AlgorithmLibrary("ndv2", 2, Collective.ALLGATHER, 16, ()), 3)
    'ndv2-n2-allgather-3.xml'
    >>> library_xml_name(AlgorithmLibrary("ndv2", 2, Collective.ALLGATHER, 16, ()), 3, inplace=True)
    'ndv2-n2-allgather-3-inplace.xml'
    """
    suffix = "-inplace" if inplace else ""
    return f"{export_stem(library)}-{index}{suffix}.xml"


def _placements(algorithm: Algorithm) -> tuple[list[Algorithm], str | None]:
    """Return the algorithms a band exports, one per file, and why in place has no file.

    One file with both flags (``BOTH_PLACES_KEY``) when the out-of-place schedule is also right on
    aliased buffers, else a second, in-place file; AlltoAll (rarely called in place) exports out
    of place only.
    """
    variant, why_not = exported_inplace_form(algorithm)
    if variant is None:
        return [algorithm], None if why_not is None else f"no in-place file: {why_not}"
    if serves_both_placements(algorithm, variant):
        return [algorithm.with_metadata(**{BOTH_PLACES_KEY: "1"})], None
    return [algorithm, variant], None


def _band_files(
    library: AlgorithmLibrary,
    index: int,
    band: SizeBand,
    dialect: Dialect,
    runtime: Runtime | str,
    protocol: str,
    ranges: tuple[SizeRange, ...] | None = None,
) -> tuple[list[tuple[str, str, SelectionKey]], list[str]]:
    """Return the (file name, text, selection key) of each placement of band ``index``, and its notes.

    ``ranges``: the runs of the band's sizes to write, one file per run and placement (None: the
    whole band); every placement gets the same runs.
    """
    # The band's range is what a runtime selects by, whatever range the algorithm was saved with.
    base = replace(
        band.algorithm,
        name=library_xml_name(library, index).removesuffix(".xml"),
        min_bytes=band.min_bytes,
        max_bytes=band.max_bytes,
        protocol=protocol,
    )
    notes = []
    if not loop_divides_powers_of_two(base.collective, base.num_ranks, base.chunks_per_loop):
        # no loop divides power-of-two counts here (an AllReduce over 6 ranks), so the file stays for the rest
        multiple = base.chunks_per_loop // math.gcd(
            base.chunks_per_loop, size_multiplier(base.collective, base.num_ranks)
        )
        notes.append(
            f"{base.chunks_per_loop} chunks per loop divide no power-of-two element count: MSCCL selects it "
            f"only for counts that are multiples of {multiple}, and leaves the others to NCCL"
        )
    # only the new dialect says which placements a file serves (outofplace="..."); the old one gets one file
    algorithms, why_not = _placements(base) if DIALECTS[dialect].size_band else ([base], None)
    if why_not is not None:
        notes.append(why_not)
    files = []
    for part, sizes in enumerate((SizeRange(band.min_bytes, band.max_bytes),) if ranges is None else ranges):
        for algorithm in algorithms:
            name = band_part_name(library_xml_name(library, index, inplace=algorithm.inplace), part)
            piece = replace(
                algorithm, name=name.removesuffix(".xml"), min_bytes=sizes.min_bytes, max_bytes=sizes.max_bytes
            )
            if part and piece.meta(DERIVED_FROM_KEY) is not None:
                piece = piece.with_metadata(
                    **{DERIVED_FROM_KEY: band_part_name(library_xml_name(library, index), part)[:-4]}
                )
            files.append((name, generate_msccl_xml(piece, dialect, runtime=runtime), selection_key(piece)))
    return files, notes


def generate_library_xml(
    library: AlgorithmLibrary,
    dialect: Dialect | str = Dialect.NEW,
    *,
    runtime: Runtime | str = DEFAULT_RUNTIME,
    rccl_gpu_arch: str | None = None,
    leave_to_nccl: NcclTimes | None = None,
) -> LibraryXml:
    """Return the MSCCL XML of every band of ``library`` that ``runtime`` (default: every MSCCL runtime) can load.

    Each band gets its out-of-place file and, in the new dialect, its in-place form (the same file
    with both flags where that is safe, else a ``-inplace`` file); in-place forms are verified here.
    Each band's ``proto`` is the protocol the simulator finds fastest there among those ``runtime``
    runs (``taccl_py.msccl.protocol.band_protocols``; ``rccl_gpu_arch`` names the AMD GPU RCCL
    runs LL128 on, e.g. ``"gfx942"``). The open-ended last band gets ``maxBytes="0"``, which the
    MSCCL tools write for "no upper end". A band whose chunk loop MSCCL never selects at
    power-of-two counts, where another loop would be, or that has switch steps (no MSCCL-IR
    form), gets no file (``LibraryXml.to_nccl``). Given ``leave_to_nccl`` (what times NCCL's own
    algorithms: ``taccl_py.baselines.nccl.nccl_best_times``, as ``taccl export-msccl`` passes it)
    and a library of a built-in machine, sizes where NCCL is modelled faster under MSCCL's loop are
    left to it too (``taccl_py.simulate.leave_to_nccl``): a band may become several files, or none.
    """
    dialect = parse_dialect(dialect)
    protocols = band_protocols(library, runtime, rccl_gpu_arch=rccl_gpu_arch)
    compare, unchecked = (
        _nccl_comparison(library, runtime, rccl_gpu_arch, leave_to_nccl) if leave_to_nccl else (None, None)
    )
    files, keys, skipped, notes, to_nccl, fallbacks = [], [], [], [], [], []
    for index, band in enumerate(library.bands):
        if band.native:  # no XML: MSCCL runs NCCL's own collective wherever no algorithm covers the size
            continue
        if band.algorithm.uses_switch:  # in-network steps: MSCCL-IR has no form for them
            to_nccl.append((index, _switch_band(library, index, band)))
            fallbacks.append(_fallback(library, band.min_bytes, band.max_bytes, "switch steps have no MSCCL-IR form"))
            continue
        selectable = selectable_for_powers_of_two(band.algorithm)
        verdict = compare(band, protocols[index]) if compare is not None and selectable else None
        left = () if verdict is None else verdict.left
        if verdict is not None and not verdict.kept:  # NCCL is faster at every size: no file to check or write
            band_files, band_notes = [], []
        else:
            try:
                band_files, band_notes = _band_files(
                    library, index, band, dialect, runtime, protocols[index], None if verdict is None else verdict.kept
                )
            except ArgumentError as error:
                skipped.append((index, str(error)))
                continue
        if not selectable:  # a band beyond the limits says that first
            to_nccl.append((index, _never_selected(library, index, band)))
            loop = f"{band.algorithm.chunks_per_loop} chunks per loop divide no power-of-two element count"
            fallbacks.append(_fallback(library, band.min_bytes, band.max_bytes, loop))
            continue
        files += [(name, text) for name, text, _key in band_files]
        keys += [key for _name, _text, key in band_files]
        notes += [(index, note) for note in band_notes]
        for run in left:
            to_nccl.append((index, _slower_run(library, index, run)))
            fallbacks.append(_fallback(library, run.sizes.min_bytes, run.sizes.max_bytes, run.reason))
    return LibraryXml(
        tuple(files),
        tuple(skipped),
        tuple(keys),
        tuple(notes),
        tuple(to_nccl),
        fallbacks=tuple(fallbacks),
        unchecked=unchecked,
    )


def _nccl_comparison(
    library: AlgorithmLibrary, runtime: Runtime | str, rccl_gpu_arch: str | None, nccl_times: NcclTimes
) -> tuple[Callable[[SizeBand, str], NcclVerdict] | None, str | None]:
    """Return (compare, None): ``compare(band, protocol)`` gives a band's ``NcclVerdict``; (None, why) if none.

    NCCL's best times (under MSCCL's loop) are simulated once, at every probe size of the bands
    that may get a file.
    """
    if builtin_topology_name(library.topology) is None:
        why = (
            f"{library.topology} n{library.nodes} {library.collective.value}: not compared with NCCL's own algorithms: "
            f"{library.topology!r} is not a built-in machine, so its bands keep every size"
        )
        logger.info("%s", why)
        return None, why
    topology = library_topology(load_topology(library.topology, library.nodes), library)
    bands = [(b.min_bytes, b.max_bytes) for b in library.bands if not b.native and not b.algorithm.uses_switch]
    if not bands:
        return None, None
    best = nccl_times(topology, library.collective, library_probe_sizes(bands), model=DEFAULT_MODEL)
    times = {choice.size_bytes: choice for choice in best}
    costs = PROTOCOL_COST_TABLES[protocol_limits(runtime, rccl_gpu_arch=rccl_gpu_arch).cost_table]

    def compare(band: SizeBand, protocol: str) -> NcclVerdict:
        algorithm = replace(band.algorithm, protocol=protocol)
        return compare_with_nccl(
            algorithm, band.min_bytes, band.max_bytes, topology, times, model=DEFAULT_MODEL, protocol_costs=costs
        )

    return compare, None


def _fallback(library: AlgorithmLibrary, min_bytes: int, max_bytes: int | None, reason: str) -> ExportedFallback:
    return ExportedFallback(library.collective, library.num_ranks, min_bytes, max_bytes, reason)


def _slower_run(library: AlgorithmLibrary, index: int, run: LeftToNccl) -> str:
    """Return the line saying which sizes of band ``index`` are left to NCCL, being faster there."""
    name = library_xml_name(library, index).removesuffix(".xml")
    return f"{name}: sizes {run.sizes.label} left to NCCL: {run.reason}"


def _band_sizes(band: SizeBand) -> str:
    return SizeRange(band.min_bytes, band.max_bytes).label


def _switch_band(library: AlgorithmLibrary, index: int, band: SizeBand) -> str:
    """Return the line saying band ``index`` gets no file: its switch steps have no MSCCL-IR form."""
    name = library_xml_name(library, index).removesuffix(".xml")
    return f"{name}: band {index} ({_band_sizes(band)}) uses switch steps: no MSCCL-IR form; left to NCCL"


def _never_selected(library: AlgorithmLibrary, index: int, band: SizeBand) -> str:
    """Return the line saying why band ``index`` gets no file, and which sizes stay with NCCL."""
    name = library_xml_name(library, index).removesuffix(".xml")
    return (
        f"{name}: {band.algorithm.chunks_per_loop} chunks per loop divide no power-of-two element count, "
        f"so MSCCL never selects it; sizes {_band_sizes(band)} stay with NCCL"
    )


def unwritten_placements(dialect: Dialect | str) -> str | None:
    """Return why ``dialect`` gets no in-place files (None: it gets them where a band needs one)."""
    if DIALECTS[parse_dialect(dialect)].size_band:
        return None
    return (
        "no in-place files: the old dialect (microsoft/msccl) names no placement (no outofplace attribute), "
        "so each band gets its out-of-place file only"
    )


def write_library_xml(
    library: AlgorithmLibrary,
    folder: str | Path,
    dialect: Dialect | str = Dialect.NEW,
    *,
    runtime: Runtime | str = DEFAULT_RUNTIME,
    rccl_gpu_arch: str | None = None,
    replace_earlier: bool = False,
    leave_to_nccl: NcclTimes | None = None,
) -> LibraryXml:
    """Write the XML of every loadable band of ``library`` into ``folder``; return what was written and left out.

    The bands left out are only returned (``LibraryXml.skipped``, ``to_nccl``): the caller reports them.
    ``replace_earlier``: remove the files of an earlier export of ``library`` (its machine, node
    count and collective, by our file names) that this one does not overwrite; MSCCL would load them
    too. Their names are returned (``LibraryXml.removed``).

    Every text is generated before the first file is written, each file through a temporary name,
    and earlier files are removed only once every new one is written.
    """
    export = generate_library_xml(
        library, dialect, runtime=runtime, rccl_gpu_arch=rccl_gpu_arch, leave_to_nccl=leave_to_nccl
    )
    removed = write_band_files(library, folder, export.files, ".xml", replace_earlier)
    return replace(export, removed=removed)


def folder_selection_keys(folder: str | Path) -> tuple[tuple[SelectionKey, ...], tuple[tuple[str, str], ...]]:
    """Return the selection fields of every file an MSCCL runtime loads from ``folder``, and the files it cannot.

    The runtimes load every regular file and link of their algorithm folder, whatever its name
    (msccl-executor-nccl ``mscclInternalSchedulerInit``); each key is named by its file's name. The
    second tuple holds (file name, why) for each file that is no MSCCL-IR XML: one of those fails
    the runtime's start.
    """
    keys, unreadable = [], []
    for path in sorted(Path(folder).iterdir(), key=lambda path: path.name):
        if path.is_dir():
            continue
        try:
            keys.append(parse_msccl_selection_key(read_text(path), path.name))
        except FormatError as error:
            unreadable.append((path.name, str(error)))
    return tuple(keys), tuple(unreadable)
