"""``taccl export-mscclpp``: a library's bands as verified MSCCL++ execution plans."""

from __future__ import annotations

import argparse
import functools
import sys
from collections import Counter
from pathlib import Path

from taccl_py.baselines import best_baselines_by_band
from taccl_py.baselines.nccl import NcclChoice, nccl_best_times
from taccl_py.cli.algo import add_library_source_arguments, band_label, libraries_to_export
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary
from taccl_py.mscclpp.export import PLAN_PROTOCOLS
from taccl_py.mscclpp.files import LibraryPlans, fits_mscclpp, write_library_plans
from taccl_py.placement.groups import library_topology
from taccl_py.simulate import DEFAULT_MODEL, WHOLE_CHUNKS
from taccl_py.simulate.leave_to_nccl import library_probe_sizes
from taccl_py.topology.builtins import builtin_topology_name, load_topology
from taccl_py.topology.model import Topology

__all__ = ["library_nccl_times", "library_rivals", "register"]


def _library_topology(library: AlgorithmLibrary) -> Topology | None:
    """Return the machines a library runs on, which decide memory or port channels (None: one machine)."""
    name = builtin_topology_name(library.topology)
    if name is not None:
        return library_topology(load_topology(name, nodes=library.nodes), library)
    if library.nodes == 1:
        return None
    raise ArgumentError(
        library.topology,
        "nodes",
        f"{library.nodes} machines of a topology that is not built in",
        "a library of a built-in machine, or of one machine (MSCCL++ channels depend on which ranks share one)",
    )


def library_rivals(library: AlgorithmLibrary, topology: Topology) -> dict[int, tuple[Algorithm, ...]]:
    """Return, per band index of ``library``, the baselines whose plans compete with its own (``faster_rival_plan``).

    The fastest at the band's sample sizes (whole-chunk model) among baselines with a plan within
    MSCCL++'s limits that takes powers of two; a baseline whose chunk counts take none (6 rings on
    NDv2: 48 chunks) competes in its loadable variant (``baselines.choice._loadable_variant``).
    """
    keep = functools.partial(fits_mscclpp, topology=topology, powers_of_two=True)
    return best_baselines_by_band(library, topology, WHOLE_CHUNKS, keep=keep)


def library_nccl_times(library: AlgorithmLibrary, topology: Topology) -> dict[int, NcclChoice]:
    """Return NCCL's best (MSCCL's loop) at every probe size of the bands that get plans, by size (bytes)."""
    bands = [(band.min_bytes, band.max_bytes) for band in library.bands if not band.native]
    best = nccl_best_times(topology, library.collective, library_probe_sizes(bands), model=DEFAULT_MODEL)
    return {choice.size_bytes: choice for choice in best}


def _print_ranges(library: AlgorithmLibrary, plans: LibraryPlans) -> None:
    """Print one line per plan serving less than its band, and one line of the size rules the library's plans follow."""
    for served in plans.ranges:
        if served.narrowed is not None:
            print(
                f"{served.file_name}: {served.narrowed} (it takes multiples of {served.rule.multiple_bytes} B)",
                file=sys.stderr,
            )
    if plans.ranges:
        multiples = Counter(served.rule.multiple_bytes for served in plans.ranges)
        summary = ", ".join(f"{multiple} B ({count})" for multiple, count in sorted(multiples.items()))
        label = f"{library.topology} n{library.nodes} {library.collective.value}"
        print(
            f"{label}: plans take multiples of {summary}, every power of two in their ranges",
            file=sys.stderr,
        )


def _export_mscclpp(args: argparse.Namespace) -> int:
    folder = Path(args.output)  # its parent exists: taccl_py.cli checks every output first
    libraries = libraries_to_export(args.library, args.nodes)
    if args.collective is not None:
        libraries = [library for library in libraries if library.collective is Collective(args.collective)]
        if not libraries:
            raise ArgumentError(args.library, "--collective", f"no {args.collective} library", "a collective it holds")
    written = 0
    for library in libraries:
        if sys.stderr.isatty():  # verifying every plan takes minutes at 32 GPUs and more
            label = f"{library.topology} n{library.nodes} {library.collective.value}"
            print(f"exporting {label}: {len(library.bands)} bands", file=sys.stderr, flush=True)
        protocol = None if args.protocol == "auto" else args.protocol
        topology = _library_topology(library)
        # Never worse than a baseline: where the best baseline's plan simulates faster, it is written instead.
        rivals = None if topology is None or args.no_baselines else library_rivals(library, topology)
        nccl_times = None if topology is None or args.all_sizes else library_nccl_times(library, topology)
        plans = write_library_plans(
            library, folder, topology, protocol, rivals, replace_earlier=True, nccl_times=nccl_times
        )
        written += len(plans.files)
        for name, choice in plans.protocols:
            if choice.protocol != "Simple" and protocol is None:
                print(f"{name}: {choice.why}", file=sys.stderr)
        for name, why in plans.baselines:
            print(f"{name}: {why} than the band's own plan; written instead", file=sys.stderr)
        for index, why in plans.skipped:
            print(f"warning: {band_label(library, index)} has no MSCCL++ plan: {why}", file=sys.stderr)
        for name, run in plans.to_nccl:
            print(f"{name}: sizes {run.sizes.label} left to NCCL: {run.reason}", file=sys.stderr)
        _print_ranges(library, plans)
        if plans.removed:
            names = ", ".join(plans.removed)
            print(f"removed {len(plans.removed)} plans of an earlier export from {folder}: {names}", file=sys.stderr)
    print(f"wrote {written} MSCCL++ execution plans to {folder}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``export-mscclpp`` to ``subparsers``."""
    export = subparsers.add_parser(
        "export-mscclpp",
        description="Write one verified plan per band and placement, min_message_size/max_message_size set to the "
        "band's sizes; where the best baseline's plan simulates faster, it is written instead (and named); a band "
        "beyond MSCCL++'s limits is reported and left out. On a built-in machine, sizes where NCCL's own algorithm "
        "is modelled more than 1%% faster than the plan are left to NCCL (a band may become <band>-part<n> plans). "
        "Every plan takes every power of two and 3, 25 and 100 MiB "
        "in its range (MSCCL++ refuses sizes its buffers do not split into the plan's chunks): a plan refusing the "
        "least sizes of its band serves from the first it takes, one taking no power of two is left out, and ranges "
        "end where an offset would pass 2^32 bytes; the sizes left out go to NCCL. "
        "Plans of an earlier export of the same machine, node "
        "count and collective in DIR (named <machine>-n<nodes>-<collective>-<band>[-inplace].json) that this export "
        "does not overwrite are removed, and named on stderr, once every new plan is written, so that no stale size "
        "range outlives the export. Other files are left alone.",
    )
    add_library_source_arguments(export)
    export.add_argument(
        "--collective",
        choices=[collective.value for collective in Collective],
        default=None,
        help="export only this collective's library (default: all)",
    )
    export.add_argument(
        "--protocol",
        choices=("auto", *PLAN_PROTOCOLS),
        default="auto",
        help="auto (default): per plan, LL (packets) where it simulates faster than Simple, else Simple",
    )
    export.add_argument(
        "--no-baselines",
        action="store_true",
        help="write every band's own plan, even one that simulates slower than the best baseline's "
        "(default: that baseline's plan is written instead)",
    )
    export.add_argument(
        "--all-sizes",
        action="store_true",
        help="keep every size of each band, even where NCCL's own algorithm is modelled faster (to measure the "
        "plans against NCCL there; default: those sizes are left to NCCL)",
    )
    export.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="DIR",
        help="folder to write the plans into (created if missing; an earlier export's plans are replaced)",
    )
    export.set_defaults(func=_export_mscclpp, output_folders=("output",))
