"""``taccl synthesize``: synthesize a verified algorithm (or a library of size bands) for a topology."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from taccl_py.bounds import ALLREDUCE_BOUND_NOTE, IN_NETWORK_BOUND_NOTE, LowerBound, bound_label
from taccl_py.cli._output import format_ratio, format_table
from taccl_py.cli._runtime import add_runtime_argument, xml_target
from taccl_py.cli._topology import add_model_option, add_topology_options, topology_from_args
from taccl_py.errors import ArgumentError
from taccl_py.files import algorithm_format, write_any_algorithm
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.msccl.limits import RuntimeLimits
from taccl_py.placement.parallel import GroupKind, parallel_groups, parse_parallel, parse_ranks, read_placement
from taccl_py.simulate import faster
from taccl_py.simulate.bands import IN_NETWORK_BOUND_LABEL, library_bound_label, library_bounds
from taccl_py.solvers import SOLVERS, BudgetBound
from taccl_py.stages.sketch import read_sketch
from taccl_py.synth import SynthesisResult, synthesize, write_library
from taccl_py.synth.candidates import exportable
from taccl_py.synth.groups import group_folder_name, synthesize_groups
from taccl_py.synth.jobs import available_cores
from taccl_py.topology.model import Topology
from taccl_py.units import SIZE_SUFFIXES_HELP, format_size, parse_size, parse_sizes

__all__ = ["register", "choose_written_algorithm", "format_budget_line", "format_synthesis_table"]

_COLLECTIVES = ("allgather", "reducescatter", "allreduce", "alltoall")
# The sizes of a --parallel library when --sizes is not given: what the shipped libraries cover.
DEFAULT_GROUP_SIZES = "1KB-1GB"
# The chosen algorithm first (its time, fraction of the bound, ratio to the best
# baseline), then the best synthesized candidate (the chosen one, unless a baseline won) and the best baseline.
_HEADERS = (
    "size",
    "chosen",
    "time (us)",
    "of {label}",
    "vs baseline",
    "synth (us)",
    "synth vs baseline",
    "best baseline",
    "baseline (us)",
)


def _stderr(line: str) -> None:
    print(f"synthesize: {line}", file=sys.stderr)


def _shows_progress(args: argparse.Namespace) -> bool:
    """Return whether the stages report as they go: ``--progress``/``--no-progress``, else when stderr is a terminal."""
    return args.progress if args.progress is not None else sys.stderr.isatty()


def format_synthesis_table(
    result: SynthesisResult, *, bounds: Sequence[LowerBound] = (), bound_name: str | None = None
) -> str:
    """Return one row per size: the chosen algorithm against the best baseline, and the best synthesized one.

    ``of bound`` is the lower bound over the chosen algorithm's time (AllReduce: ``of RS+AG bound``,
    the ReduceScatter+AllGather class bound, with a note under the table). ``bounds`` (one per
    size) and ``bound_name`` replace it where another bound holds for every row: on a machine
    whose switch reduces, the in-network reduction bound (``library_bounds``), which switch
    schedules and NCCL's NVLS respect and the class bound does not.
    ``vs baseline`` is the best baseline's time over the chosen algorithm's (above 1: the chosen
    one is faster; 1.00x where the baseline itself is chosen); the best baseline includes NCCL's
    modelled algorithms (NVLS, NVLS-Tree, PAT). ``synth vs baseline`` is the best baseline's time
    over the best synthesized algorithm's, so a synthesis that lost to the baseline shows below 1
    there. ``-`` marks a size without a baseline or a synthesized result.
    """
    label = bound_name or bound_label(result.collective)
    headers = tuple(header.format(label=label) for header in _HEADERS)
    rows = []
    for index, choice in enumerate(result.choices):
        syn, base = choice.synthesized, choice.baseline
        chosen_us = choice.chosen_result.time_us
        of_bound = bounds[index].time_us / chosen_us if bounds else choice.chosen_result.fraction_of_bound
        rows.append(
            (
                format_size(choice.size_bytes),
                choice.chosen.name,
                f"{chosen_us:.2f}",
                f"{of_bound:.3f}",
                "-" if base is None else format_ratio(base.time_us / chosen_us),
                "-" if syn is None else f"{syn.time_us:.2f}",
                "-" if base is None or syn is None else format_ratio(base.time_us / syn.time_us),
                choice.baseline_name or "-",
                "-" if base is None else f"{base.time_us:.2f}",
            )
        )
    table = format_table(headers, rows)
    if result.collective is Collective.ALLREDUCE:
        table += f"\nnote: {IN_NETWORK_BOUND_NOTE if bounds else ALLREDUCE_BOUND_NOTE}"
    return table


def unwritable_baseline_notes(result: SynthesisResult) -> list[str]:
    """Return one note per size where the fastest baseline beats the chosen algorithm but may not be written.

    A library's bands must load in the MSCCL runtimes; a faster baseline that does not (NCCL's own
    rings with a channel count whose chunk loop MSCCL never selects, say) is reported, not written.
    Nor is one of NCCL's modelled algorithms (NVLS, NVLS-Tree, PAT: ``baselines.nccl``), which no
    schedule expresses: its note says so, for one size too.
    """
    notes = []
    for choice in result.choices:
        base, chosen = choice.baseline, choice.chosen_result
        if base is None or not faster(base.time_us, chosen.time_us):
            continue
        unloadable = "but does not load in the MSCCL runtimes"
        modelled = "but is NCCL's own algorithm, modelled, which no schedule can express"
        if choice.native:  # NCCL's own algorithm beats every writable one: a library's band there is native
            why = f"{unloadable if choice.baseline_is_schedule else modelled}; a library leaves this size to NCCL"
        elif choice.baseline_is_schedule:
            why = f"{unloadable}; the band keeps the fastest algorithm that does"
        else:
            why = f"{modelled}; it is not written"
        notes.append(
            f"note: at {format_size(choice.size_bytes)} {choice.baseline_name} ({base.time_us:.2f} us) is "
            f"{format_ratio(chosen.time_us / base.time_us)} faster than {choice.chosen.name} ({chosen.time_us:.2f} us) "
            + why
        )
    return notes


def choose_written_algorithm(
    result: SynthesisResult, *, xml_limits: RuntimeLimits | None = None
) -> tuple[Algorithm, str | None]:
    """Return the algorithm a one-size synthesis writes, and a note when it is not the synthesized one.

    The best baseline is written where it is faster than every synthesized algorithm (as a library
    band would choose it), so a slower synthesis is never written as if it were better; when XML
    is written (``xml_limits``) only if the baseline loads in that runtime, else the synthesis is
    written and the note says the baseline is faster. A switch schedule has no XML: with
    ``xml_limits`` the fastest point-to-point synthesis is written instead, and the note says so.
    """
    choice = result.choices[-1]
    if xml_limits is not None and result.algorithm.uses_switch and result.point_to_point is not None:
        return result.point_to_point, (
            f"note: the fastest schedule ({result.algorithm.name}) goes through the switch, which MSCCL XML "
            f"cannot express; writing the fastest point-to-point one ({result.point_to_point.name}); "
            "taccl export-mscclpp writes the switch schedule"
        )
    if not choice.baseline_chosen or choice.synthesized is None:
        return result.algorithm, None
    # The chosen baseline is the fastest writable one; the fastest of all (NCCL's NVLS, say) may not be.
    slower = (
        f"the synthesized algorithm ({choice.synthesized.time_us:.1f} us) is slower than the baseline "
        f"{choice.chosen.name} ({choice.chosen_result.time_us:.1f} us) at {format_size(choice.size_bytes)}"
    )
    if xml_limits is not None and not exportable(choice.chosen, xml_limits.runtime.value):
        return result.algorithm, f"note: {slower}, which has no MSCCL XML; writing the synthesized algorithm"
    return choice.chosen, f"note: {slower}; writing {choice.chosen.name} instead"


def format_budget_line(result: SynthesisResult, time_limit_s: float | None) -> str:
    """Return one line saying which solver budget stopped a MILP of ``result``, if any."""
    if result.budget_bound is BudgetBound.WALL_CLOCK_CAP:
        cap = "" if time_limit_s is None else f" ({time_limit_s:g} s)"
        return (
            f"note: the wall-clock cap{cap} stopped a MILP; the result is the best verified schedule found in "
            "time and may differ from run to run (raise --time-limit, or lower --node-limit)"
        )
    if result.budget_bound is BudgetBound.NODE_LIMIT:
        return (
            "budget: a MILP stopped at its work budget (node limit; cpsat: deterministic time); the result is the "
            "best verified schedule found within it (the same on every run)"
        )
    return "budget: every MILP finished within its work budget"


def _check_outputs(args: argparse.Namespace) -> RuntimeLimits | None:
    """Return the limits the XML output must meet (None: no XML); raise ``ArgumentError`` before any work.

    Raised for output paths that cannot be written and a ``--runtime`` with no XML output.
    """
    if args.sizes is not None:
        if not str(args.output).endswith(".json"):
            raise ArgumentError(
                args.output, "-o", "a library needs a .json path", "OUT.json (band files are written beside it)"
            )
        if args.xml is not None:
            raise ArgumentError(
                args.xml,
                "--xml",
                "--xml with --sizes",
                "no --xml; then 'taccl export-msccl LIBRARY -o DIR' writes every band's XML",
            )
        if args.runtime is not None:
            raise ArgumentError(
                args.output, "--runtime", "--runtime with --sizes", "no --runtime; 'taccl export-msccl --runtime' then"
            )
        return None
    output_format = algorithm_format(args.output)
    if args.xml is not None and algorithm_format(args.xml) != "xml":
        raise ArgumentError(args.xml, "--xml", "not an .xml path", "OUT.xml")
    xml = args.xml is not None or output_format == "xml"
    limits = xml_target(args.runtime, None, xml=xml, path=args.output)
    return limits if xml else None


def _synthesize(args: argparse.Namespace) -> int:
    if args.parallel is not None or args.ranks is not None:
        return _synthesize_groups(args)
    xml_limits = _check_outputs(args)
    sketch = read_sketch(args.sketch) if args.sketch is not None else None
    nodes = args.nodes if args.nodes is not None else (sketch.nodes if sketch is not None and sketch.nodes else 1)
    topology = topology_from_args(args, nodes=None if args.cluster is not None else nodes)
    # Asked for XML, choose among what that runtime loads (64 threadblocks, its step limits).
    loadable_in = None if xml_limits is None else xml_limits.runtime.value
    result = synthesize(topology, args.collective, sketch=sketch, loadable_in=loadable_in, **_synthesis_options(args))
    _write_result(args, result, xml_limits)
    _stderr(format_budget_line(result, args.time_limit))
    _print_result(result, topology)
    return 0


def _synthesis_options(args: argparse.Namespace) -> dict:
    """Return the keyword arguments of ``synthesize`` the options give (sizes, budgets, solver, model)."""
    return dict(
        size_bytes=parse_size(args.size, "--size") if args.size is not None else None,
        sizes=parse_sizes(args.sizes, "--sizes") if args.sizes is not None else None,
        time_limit_s=args.time_limit,
        solver=args.solver,
        progress=_stderr if _shows_progress(args) else None,
        node_limit=args.node_limit,
        jobs=args.jobs,
        model=args.model,
    )


def _write_result(args: argparse.Namespace, result: SynthesisResult, xml_limits: RuntimeLimits | None) -> None:
    """Write the library, or the algorithm (XML first: a runtime limit then leaves nothing written)."""
    if result.library is not None:
        provenance = replace(result.library.provenance, command=shlex.join(["taccl", *args.argv]))
        write_library(replace(result.library, provenance=provenance), args.output, progress=_stderr)
        for note in unwritable_baseline_notes(result):
            _stderr(note)
        return
    algorithm, note = choose_written_algorithm(result, xml_limits=xml_limits)
    if note is not None:
        _stderr(note)
    for modelled_note in unwritable_baseline_notes(result):  # one size: only a modelled baseline is unwritten
        _stderr(modelled_note)
    provenance = replace(
        result.provenance,
        command=shlex.join(["taccl", *args.argv]),
        note=None if note is None else note.removeprefix("note: "),
    )
    paths = [path for path in (args.output, args.xml) if path is not None]
    for path in sorted(paths, key=lambda p: algorithm_format(p) != "xml"):
        if xml_limits is not None and algorithm_format(path) == "xml":
            write_any_algorithm(algorithm, path, xml_limits.dialect, runtime=xml_limits.runtime)
        else:
            write_any_algorithm(algorithm, path, provenance=provenance)
        _stderr(f"wrote {path}")


def _print_result(result: SynthesisResult, topology: Topology) -> None:
    print(
        f"{result.collective.value} on {result.topology} ({topology.num_ranks} GPUs), sketch {result.sketch.name}, "
        f"model {result.choices[0].chosen_result.model}, {result.wall_s:.1f} s; "
        f"candidates {', '.join(result.candidates)}"
    )
    sizes = [choice.size_bytes for choice in result.choices]
    label = library_bound_label(topology, result.collective)
    holding = library_bounds(topology, result.collective, sizes) if label == IN_NETWORK_BOUND_LABEL else ()
    print(format_synthesis_table(result, bounds=holding, bound_name=label if holding else None))


def _group_kinds(args: argparse.Namespace, topology: Topology) -> tuple[GroupKind, ...]:
    """Return the groups ``--ranks`` or ``--parallel`` ask for over ``topology``'s GPUs."""
    world = topology.num_ranks
    if args.parallel is not None:
        return parallel_groups(parse_parallel(args.parallel), world)
    ranks = parse_ranks(args.ranks)
    if ranks[-1] >= world:
        raise ArgumentError("--ranks", "ranks", f"rank {ranks[-1]}", f"ranks of {topology.name}: 0..{world - 1}")
    if len(ranks) == world:
        raise ArgumentError("--ranks", "ranks", "every rank", "a subset (leave --ranks out for all of them)")
    return (GroupKind("ranks", (ranks,)),)


def _synthesize_groups(args: argparse.Namespace) -> int:
    """``--ranks``: one group, written as ``-o`` says; ``--parallel``: a library per kind and class under ``-o DIR``."""
    if args.parallel is not None:
        if args.ranks is not None:
            raise ArgumentError("--parallel", "ranks", "--ranks with --parallel", "one of them")
        if args.xml is not None or args.output.endswith((".json", ".xml")):
            raise ArgumentError(
                args.output, "-o", "--parallel writes a folder of libraries", "-o DIR (no --xml; then export-msccl)"
            )
        args.sizes = args.sizes or DEFAULT_GROUP_SIZES
        xml_limits = None
    else:
        xml_limits = _check_outputs(args)
    if args.sketch is not None:
        raise ArgumentError(args.sketch, "--sketch", "a sketch with process groups", "no --sketch (derived per group)")
    topology = topology_from_args(args, nodes=None if args.cluster is not None else (args.nodes or 1))
    placement = None if args.placement is None else read_placement(args.placement, topology.num_ranks)
    machine = args.topology if args.cluster is None else topology.name
    outcomes = [
        (kind, outcome)
        for kind in _group_kinds(args, topology)
        for outcome in synthesize_groups(
            topology,
            args.collective,
            kind,
            placement=placement,
            machine=machine,
            loadable_in=None if xml_limits is None else xml_limits.runtime.value,
            **_synthesis_options(args),
        )
    ]
    for kind, outcome in outcomes:  # everything is synthesized before the first file is written
        if args.parallel is None:
            _write_result(args, replace(outcome.result, library=outcome.library), xml_limits)
        else:
            folder = Path(args.output) / group_folder_name(outcome.record)
            folder.mkdir(parents=True, exist_ok=True)  # DIR holds every collective's libraries of the groups
            library = replace(
                outcome.library,
                provenance=replace(outcome.library.provenance, command=shlex.join(["taccl", *args.argv])),
            )
            write_library(library, folder / f"{outcome.result.collective.value}.library.json", progress=_stderr)
        _stderr(format_budget_line(outcome.result, args.time_limit))
        print(
            f"{kind.kind} groups of {kind.size}: {len(outcome.record.groups)} alike, members "
            f"{','.join(map(str, outcome.record.members))}, run all at once"
        )
        _print_result(outcome.result, outcome.topology)
    return 0


class _FolderOutput(argparse.Action):
    """``--parallel``: store its value, and make ``-o`` a folder (created if missing) for the output check."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.output_folders = ("output",)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``synthesize`` to ``subparsers``."""
    parser = subparsers.add_parser(
        "synthesize",
        description="Route chunks (MILP), order and schedule them, verify the result and compare it under the "
        "simulator with the lower bound and the best baseline. With --sizes, write a library of size bands "
        "(the library JSON plus one algorithm JSON per band, beside it); 'taccl export-msccl LIBRARY -o DIR' "
        "then writes the bands' MSCCL XML.",
    )
    add_topology_options(parser, nodes_default=None)
    parser.add_argument("--collective", "-c", required=True, choices=_COLLECTIVES)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--size", help=f"the size to synthesize for, e.g. 64MB (default 64MB; {SIZE_SUFFIXES_HELP})")
    group.add_argument(
        "--sizes", help=f"sizes for a library of bands: a list or a range, e.g. 1KB-1GB ({SIZE_SUFFIXES_HELP})"
    )
    parser.add_argument("--sketch", metavar="FILE", help="a sketch: ours (taccl-sketch/1) or TACCL's sketch JSON")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="S",
        help="wall-clock safety cap on all MILPs, seconds (default by GPU count, 10-30 min); the work budget is "
        "--node-limit, so results do not depend on machine load unless this cap binds",
    )
    parser.add_argument(
        "--node-limit",
        type=int,
        default=None,
        metavar="N",
        help="branch-and-bound nodes per MILP (default by model size)",
    )
    parser.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=None,
        metavar="N",
        help=f"worker processes for the candidates (default: the cores this process may use, {available_cores()} "
        "here; 1: no workers); the result is the same for every N",
    )
    parser.add_argument("--solver", choices=SOLVERS, default="highs", help="MILP solver (default highs)")
    parser.add_argument(
        "-o", "--output", required=True, metavar="OUT", help="algorithm .json/.xml, or the library .json with --sizes"
    )
    parser.add_argument("--xml", metavar="OUT.xml", help="also write the algorithm as MSCCL-IR XML")
    groups = parser.add_mutually_exclusive_group()
    groups.add_argument(
        "--ranks",
        metavar="R,R,...",
        help="synthesize for one process group of these global ranks (node-major, as torchrun places them); "
        "the other GPUs stay idle",
    )
    groups.add_argument(
        "--parallel",
        action=_FolderOutput,
        metavar="tp=T,dp=D[,pp=P]",
        help="write into the folder -o a library per kind of Megatron-style group (tp fastest, then dp, pp), each "
        f"synthesized with every group of its kind running at once (sizes default {DEFAULT_GROUP_SIZES})",
    )
    parser.add_argument(
        "--placement",
        metavar="FILE",
        help="a taccl-placement/1 file: the topology GPU of each global rank (default node-major)",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="report each stage on stderr as it goes, every few seconds inside long ones (default: when stderr is "
        "a terminal)",
    )
    add_model_option(parser)
    add_runtime_argument(parser)
    parser.set_defaults(func=_synthesize)
