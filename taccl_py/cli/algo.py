"""``taccl verify``, ``taccl convert`` and ``taccl export-msccl``: check, translate and export algorithms.

``taccl verify`` also reads MSCCL++ execution plans and replays them with MSCCL++'s semantics.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from itertools import groupby
from pathlib import Path

from taccl_py._io import read_text
from taccl_py.cli._output import ALGORITHM_FILE_HELP
from taccl_py.cli._runtime import add_runtime_argument, xml_dialect, xml_target
from taccl_py.errors import ArgumentError
from taccl_py.files import algorithm_format, parse_any_algorithm, read_any_algorithm, write_any_algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary, read_library, shipped_library_paths, shipped_node_counts
from taccl_py.msccl import Dialect, looks_like_msccl_xml, write_library_xml
from taccl_py.msccl.convention import check_send_recv_fields
from taccl_py.msccl.library import folder_selection_keys, unwritten_placements
from taccl_py.msccl.limits import RCCL_LL128_GPU_ARCHS
from taccl_py.msccl.selection import (
    DTYPE_SIZES,
    ExportedFallback,
    Selection,
    SelectionKey,
    exported_fallback,
    power_of_two_sizes,
    selection_report,
    why_not_selected,
)
from taccl_py.mscclpp.parse import looks_like_mscclpp_plan, parse_mscclpp_plan
from taccl_py.mscclpp.replay import mscclpp_report
from taccl_py.mscclpp.sizes import executor_warnings
from taccl_py.units import format_size, parse_size_range
from taccl_py.verify import VerificationReport, verify_algorithm

__all__ = ["register", "format_report", "format_selection"]

SHOWN_VIOLATIONS = 5  # violations printed by default; --all prints every one
DEFAULT_CHECK_SIZES = "1KiB-1GiB"
# The AMD GPUs --rccl-gpu-arch names: those RCCL runs LL128 on, and gfx12 parts, where it runs no LL.
RCCL_GPU_ARCHS = (*RCCL_LL128_GPU_ARCHS, "gfx1200", "gfx1201")


def format_report(
    report: VerificationReport, collective: str, num_ranks: int, limit: int | None = SHOWN_VIOLATIONS
) -> str:
    """Return the human-readable verdict: one ``ok`` line, or the first violations and a count."""
    if report.ok:
        rounds = f", {report.rounds} rounds" if report.rounds else ""  # an MSCCL++ plan has no rounds
        return f"ok: {report.name}: {collective}, {num_ranks} ranks{rounds}"
    count = len(report.violations)
    lines = [f"FAILED: {report.name}: {collective}, {num_ranks} ranks: {count} violation{'s' if count != 1 else ''}"]
    shown = report.violations if limit is None else report.violations[:limit]
    lines += [f"  {violation}" for violation in shown]
    if len(shown) < count:
        lines.append(f"  ... and {count - len(shown)} more (--all shows every one)")
    return "\n".join(lines)


def _report_json(report: VerificationReport, collective: str, num_ranks: int) -> str:
    return json.dumps(
        {
            "name": report.name,
            "collective": collective,
            "num_ranks": num_ranks,
            "ok": report.ok,
            "rounds": report.rounds,
            "violations": [
                {
                    "kind": v.kind,
                    "message": v.message,
                    "rank": v.rank,
                    "threadblock": v.threadblock,
                    "step": v.step,
                    "chunk": v.chunk,
                }
                for v in report.violations
            ],
        },
        indent=2,
    )


def _verify(args: argparse.Namespace) -> int:
    # stdin can be read once, so its text is kept (read_any_algorithm tells stdin's format by content
    # too); a named file is read again for the XML check, so that its format still follows its name
    # (an MSCCL++ plan is JSON: a .json file or stdin is looked at first)
    text = read_text(args.file) if args.file == "-" or str(args.file).endswith(".json") else None
    if text is not None and looks_like_mscclpp_plan(text):
        plan = parse_mscclpp_plan(text, str(args.file))
        report, collective, num_ranks = mscclpp_report(plan), plan.collective, len(plan.gpus)
        for warning in executor_warnings(plan):  # correct as read, yet run otherwise by MSCCL++'s executor
            print(f"warning: {args.file}: {warning}", file=sys.stderr)
    else:
        algorithm = parse_any_algorithm(text, args.file) if args.file == "-" else read_any_algorithm(args.file)
        report = verify_algorithm(algorithm)
        text = read_text(args.file) if text is None else text
        if looks_like_msccl_xml(text):  # only XML names both sides of a transfer
            mismatches = check_send_recv_fields(text, str(args.file))
            report = replace(report, ok=report.ok and not mismatches, violations=report.violations + mismatches)
        collective, num_ranks = algorithm.collective.value, algorithm.num_ranks
    if args.json:
        print(_report_json(report, collective, num_ranks))
    else:
        print(format_report(report, collective, num_ranks, None if args.all else SHOWN_VIOLATIONS))
    return 0 if report.ok else 1


def _convert(args: argparse.Namespace) -> int:
    xml = (args.output == "-" and args.runtime is not None) or algorithm_format(args.output, args.dialect) == "xml"
    limits = xml_target(args.runtime, args.dialect, xml=xml, path=args.output)
    algorithm = read_any_algorithm(args.input)
    dialect = args.dialect if args.runtime is None else xml_dialect(limits, args.dialect)
    write_any_algorithm(algorithm, args.output, dialect, runtime=limits.runtime)
    if args.output != "-":
        print(
            f"wrote {args.output} ({algorithm.name}: {algorithm.collective.value}, {algorithm.num_ranks} ranks)",
            file=sys.stderr,
        )
    return 0


def add_library_source_arguments(parser: argparse.ArgumentParser) -> None:
    """Add LIBRARY and ``--nodes``, which ``libraries_to_export`` reads: a library file, or a machine's shipped ones."""
    parser.add_argument(
        "library", metavar="LIBRARY", help="a *.library.json file, or a built-in machine name (its shipped libraries)"
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="with a machine name: the node count of the shipped libraries (default 1)",
    )


def libraries_to_export(source: str, nodes: int | None) -> list[AlgorithmLibrary]:
    """Return the library in file ``source``, or the shipped libraries of built-in machine ``source``."""
    if Path(source).is_file():
        return [read_library(source)]
    from taccl_py.topology.builtins import builtin_topology_name, builtin_topology_names

    name = builtin_topology_name(source)
    if name is None:
        raise ArgumentError(
            source,
            None,
            "no such library file or built-in machine",
            "a *.library.json file or one of " + ", ".join(builtin_topology_names()),
        )
    paths = shipped_library_paths(name, nodes or 1)
    if not paths:
        shipped = ", ".join(str(count) for count in shipped_node_counts(name))
        raise ArgumentError(source, "--nodes", f"no shipped libraries at {nodes or 1} nodes", f"one of {shipped} nodes")
    return [read_library(path) for path in paths]


def band_label(library: AlgorithmLibrary, index: int) -> str:
    band = library.bands[index]
    low = format_size(band.min_bytes)
    sizes = f"{low} and up" if band.max_bytes is None else f"{low}-{format_size(band.max_bytes)}"
    return f"{library.topology} n{library.nodes} {library.collective.value} band {index} ({sizes})"


def _export_msccl(args: argparse.Namespace) -> int:
    from taccl_py.baselines.nccl import nccl_best_times  # the baselines take a second to import

    folder = Path(args.output)  # its parent exists: taccl_py.cli checks every output first
    limits = xml_target(args.runtime, args.dialect, xml=True, path=args.output)
    check_sizes = None if args.check_selection is None else _check_sizes(args.check_selection)
    libraries = libraries_to_export(args.library, args.nodes)
    dialect = xml_dialect(limits, args.dialect)
    written, fallbacks = 0, []
    for library in libraries:
        if sys.stderr.isatty():  # verifying in-place forms and choosing protocols takes a minute on 64 GPUs
            label = f"{library.topology} n{library.nodes} {library.collective.value}"
            print(f"exporting {label}: {len(library.bands)} bands", file=sys.stderr, flush=True)
        export = write_library_xml(
            library,
            folder,
            dialect,
            runtime=limits.runtime,
            rccl_gpu_arch=args.rccl_gpu_arch,
            replace_earlier=True,
            leave_to_nccl=nccl_best_times,
        )
        written += len(export.files)
        for index, why in export.skipped:
            print(f"warning: {band_label(library, index)} has no MSCCL XML: {why}", file=sys.stderr)
        for index, note in export.notes:
            print(f"warning: {band_label(library, index)}: {note}", file=sys.stderr)
        for _index, line in export.to_nccl:
            print(line, file=sys.stderr)
        fallbacks += export.fallbacks
        if export.removed:
            names = ", ".join(export.removed)
            print(f"removed {len(export.removed)} files of an earlier export from {folder}: {names}", file=sys.stderr)
    why_not_inplace = unwritten_placements(dialect)
    print(f"wrote {written} MSCCL XML files to {folder}", file=sys.stderr)
    if why_not_inplace is not None and written:
        print(f"note: {why_not_inplace}", file=sys.stderr)
    if check_sizes is not None:
        # MSCCL loads every file of the folder, an earlier export's or a user's too, so the check reads them all
        keys, unreadable = folder_selection_keys(folder) if folder.is_dir() else ((), ())
        for _name, why in unreadable:
            print(
                f"warning: {why}; MSCCL loads every file of its folder and fails to start on this one", file=sys.stderr
            )
        print(format_selection(list(keys), check_sizes, fallbacks))
    return 0


def _check_sizes(text: str) -> tuple[int, ...]:
    """Return the powers of two in the range ``text`` (``LOW-HIGH``, e.g. ``1MiB-1GiB``) names."""
    sizes = power_of_two_sizes(*parse_size_range(text, "--check-selection"))
    if not sizes:
        raise ArgumentError(None, "--check-selection", f"{text!r} holds no power of two", "a range like 1MiB-1GiB")
    return sizes


def format_selection(
    keys: list[SelectionKey], sizes: tuple[int, ...], fallbacks: Sequence[ExportedFallback] = ()
) -> str:
    """Return which file MSCCL's rule selects per collective, placement, dtype and run of sizes, and a total.

    ``fallbacks``: the sizes the export left to NCCL on purpose; a call there that selects no file
    says ``NCCL (left to NCCL: <why>)``.
    """
    rows = [("collective", "ranks", "placement", "dtype", "sizes", "selected")]
    calls = selection_report(keys, sizes, _PLACEMENTS_CHECKED)
    chosen = sum(selection.chosen is not None for selection in calls)
    ambiguous = [selection for selection in calls if selection.ambiguous]
    # consecutive sizes of one call form with the same outcome make one row
    for (_form, outcome), run in groupby(
        calls, key=lambda selection: (_call_form(selection), _outcome(keys, selection, fallbacks))
    ):
        run = list(run)
        first, last = run[0].call, run[-1].call
        span = format_size(first.size_bytes) + ("" if first is last else f"-{format_size(last.size_bytes)}")
        placement = "in place" if first.inplace else "out of place"
        dtype = DTYPE_SIZES[first.dtype_size]
        rows.append((first.collective.value, str(first.num_ranks), placement, dtype, span, outcome))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1] for row in rows]
    lines.append(
        f"{chosen} of {len(calls)} calls select a file (MSCCL's rule, powers of two "
        f"{format_size(sizes[0])}-{format_size(sizes[-1])}); {len(ambiguous)} match more than one file"
    )
    return "\n".join(lines)


# The call forms PyTorch users make: all_reduce is always in place; all_to_all_single out of place.
_PLACEMENTS_CHECKED = {
    Collective.ALLREDUCE: (True, False),
    Collective.ALLGATHER: (True, False),
    Collective.REDUCESCATTER: (True, False),
    Collective.ALLTOALL: (False,),
}


def _call_form(selection: Selection) -> tuple:
    call = selection.call
    return (call.collective, call.num_ranks, call.inplace, call.dtype_size)


def _outcome(keys: list[SelectionKey], selection: Selection, fallbacks: Sequence[ExportedFallback] = ()) -> str:
    if selection.chosen is None:
        fallback = exported_fallback(fallbacks, selection.call)
        if fallback is not None:
            return f"NCCL (left to NCCL: {fallback.reason})"
        return f"NCCL ({why_not_selected(keys, selection.call)})"
    more = f" (also {', '.join(selection.matches[1:])})" if selection.ambiguous else ""
    return selection.chosen + more


def _add_dialect_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dialect",
        choices=[d.value for d in Dialect],
        default=None,
        help="MSCCL XML dialect: new (msccl-executor-nccl, RCCL; default) or old (microsoft/msccl)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``verify``, ``convert`` and ``export-msccl`` to ``subparsers``."""
    verify = subparsers.add_parser(
        "verify",
        description="Replay the algorithm symbolically (an MSCCL++ plan with MSCCL++'s signal/wait semantics); "
        "exit 0 if correct, 1 with its violations if not, 2 if the file is malformed.",
    )
    verify.add_argument("file", metavar="FILE", help=ALGORITHM_FILE_HELP + "; or an MSCCL++ execution plan (.json)")
    verify.add_argument("--all", action="store_true", help="print every violation, not only the first few")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=_verify)

    convert = subparsers.add_parser(
        "convert",
        description="Read IN (JSON, XML or an MSCCL++ plan, which is verified and lifted into our IR), verify it, "
        "and write OUT in the format its extension names; nothing is written on failure.",
    )
    convert.add_argument("input", metavar="IN", help=ALGORITHM_FILE_HELP + "; or an MSCCL++ execution plan (.json)")
    convert.add_argument(
        "-o", "--output", required=True, metavar="OUT", help="output file: *.json or *.xml ('-' for stdout)"
    )
    _add_dialect_argument(convert)
    add_runtime_argument(convert)
    convert.set_defaults(func=_convert)

    export = subparsers.add_parser(
        "export-msccl",
        description="Write one XML file per band with minBytes/maxBytes set to the band's sizes; a band beyond the "
        "MSCCL runtime limits is reported and left out, and so is a band whose chunk loop MSCCL never selects at "
        "power-of-two element counts (its sizes stay with NCCL). On a built-in machine, sizes where NCCL's own "
        "algorithm (rings with NCCL's channel count, trees, NVLS, PAT) is modelled more than 1% faster than the band "
        "under MSCCL's loop are left to NCCL too, each run named on stderr with its reason; a band may become several "
        "files (<band>-part<n>). Files of an earlier export of the same machine, node count and collective in DIR "
        "(named <machine>-n<nodes>-<collective>-<band>[-part<n>][-inplace].xml) that this export does not overwrite "
        "are removed, and named on stderr, once every new file is written: MSCCL loads every file of its folder, so a "
        "stale band would overlap the new ones. Other files are left alone.",
    )
    add_library_source_arguments(export)
    export.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="DIR",
        help="folder to write the XML files into (created if missing; an earlier export's files are replaced)",
    )
    export.add_argument(
        "--check-selection",
        nargs="?",
        const=DEFAULT_CHECK_SIZES,
        default=None,
        metavar="LOW-HIGH",
        help="print which file of DIR (every file MSCCL would load from it, not only those written) MSCCL's "
        f"selection rule picks for every power-of-two size in LOW-HIGH (default {DEFAULT_CHECK_SIZES}), in bf16 "
        "and fp32, in place and out of place, and how many sizes more than one file matches; a size this export left "
        "to NCCL says why",
    )
    export.add_argument(
        "--rccl-gpu-arch",
        choices=RCCL_GPU_ARCHS,
        default=None,
        help="the AMD GPU the files are for (MI300X: gfx942): RCCL runs LL128 on gfx90a, gfx942 and gfx950 only, "
        "so LL128 is chosen for rccl and portable only where it is named",
    )
    _add_dialect_argument(export)
    add_runtime_argument(export)
    export.set_defaults(func=_export_msccl, output_folders=("output",))
