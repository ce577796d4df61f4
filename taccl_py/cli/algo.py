"""``taccl verify``, ``taccl convert`` and ``taccl export-msccl``: check, translate and export algorithms."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from taccl_py.cli._output import ALGORITHM_FILE_HELP
from taccl_py.cli._runtime import add_runtime_argument, xml_dialect, xml_target
from taccl_py.errors import ArgumentError
from taccl_py.files import algorithm_format, read_any_algorithm, write_any_algorithm
from taccl_py.ir.library import AlgorithmLibrary, read_library, shipped_library_paths, shipped_node_counts
from taccl_py.msccl import Dialect, write_library_xml
from taccl_py.units import format_size
from taccl_py.verify import VerificationReport, verify_algorithm

__all__ = ["register", "format_report"]

SHOWN_VIOLATIONS = 5  # violations printed by default; --all prints every one


def format_report(
    report: VerificationReport, collective: str, num_ranks: int, limit: int | None = SHOWN_VIOLATIONS
) -> str:
    """Return the human-readable verdict: one ``ok`` line, or the first violations and a count."""
    if report.ok:
        return f"ok: {report.name}: {collective}, {num_ranks} ranks, {report.rounds} rounds"
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
    algorithm = read_any_algorithm(args.file)
    report = verify_algorithm(algorithm)
    collective = algorithm.collective.value
    if args.json:
        print(_report_json(report, collective, algorithm.num_ranks))
    else:
        print(format_report(report, collective, algorithm.num_ranks, None if args.all else SHOWN_VIOLATIONS))
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


def _libraries_to_export(source: str, nodes: int | None) -> list[AlgorithmLibrary]:
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


def _export_msccl(args: argparse.Namespace) -> int:
    folder = Path(args.output)  # its parent exists: taccl_py.cli checks every output first
    limits = xml_target(args.runtime, args.dialect, xml=True, path=args.output)
    libraries = _libraries_to_export(args.library, args.nodes)
    written = 0
    for library in libraries:
        export = write_library_xml(library, folder, xml_dialect(limits, args.dialect), runtime=limits.runtime)
        written += len(export.files)
        for index, why in export.skipped:
            band = library.bands[index]
            low = format_size(band.min_bytes)
            sizes = f"{low} and up" if band.max_bytes is None else f"{low}-{format_size(band.max_bytes)}"
            print(
                f"warning: {library.topology} n{library.nodes} {library.collective.value} band {index} "
                f"({sizes}) has no MSCCL XML: {why}",
                file=sys.stderr,
            )
    print(f"wrote {written} MSCCL XML files to {folder}", file=sys.stderr)
    return 0


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
        help="check that an algorithm file (JSON or MSCCL XML) implements its collective",
        description="Replay the algorithm symbolically; exit 0 if correct, 1 with its violations if not, "
        "2 if the file is malformed.",
    )
    verify.add_argument("file", metavar="FILE", help=ALGORITHM_FILE_HELP)
    verify.add_argument("--all", action="store_true", help="print every violation, not only the first few")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=_verify)

    convert = subparsers.add_parser(
        "convert",
        help="translate an algorithm between taccl JSON and MSCCL-IR XML",
        description="Read IN (JSON or XML), verify it, and write OUT in the format its extension names; "
        "nothing is written on failure.",
    )
    convert.add_argument("input", metavar="IN", help=ALGORITHM_FILE_HELP)
    convert.add_argument(
        "-o", "--output", required=True, metavar="OUT", help="output file: *.json or *.xml ('-' for stdout)"
    )
    _add_dialect_argument(convert)
    add_runtime_argument(convert)
    convert.set_defaults(func=_convert)

    export = subparsers.add_parser(
        "export-msccl",
        help="write every size band of a library as MSCCL-IR XML, for an MSCCL runtime's algorithm folder",
        description="Write one XML file per band with minBytes/maxBytes set to the band's sizes; a band beyond the "
        "MSCCL runtime limits is reported and left out.",
    )
    export.add_argument(
        "library", metavar="LIBRARY", help="a *.library.json file, or a built-in machine name (its shipped libraries)"
    )
    export.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="with a machine name: the node count of the shipped libraries (default 1)",
    )
    export.add_argument(
        "-o", "--output", required=True, metavar="DIR", help="folder to write the XML files into (created if missing)"
    )
    _add_dialect_argument(export)
    add_runtime_argument(export)
    export.set_defaults(func=_export_msccl, output_folders=("output",))
