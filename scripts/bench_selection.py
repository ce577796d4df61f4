"""Which shipped bands an MSCCL runtime would select: the calls PyTorch makes, 1 MiB to 1 GiB, per machine.

For every built-in machine and node count with shipped libraries, export the libraries as
``taccl export-msccl`` does (every band and placement, in-place forms verified, the sizes where
NCCL's own algorithm is modelled faster left to it) and apply MSCCL's selection rule
(``taccl_py.msccl.selection``) to the calls PyTorch users make: in-place ``all_reduce`` (always in
place), ``all_gather_into_tensor`` in place (FSDP2) and out of place, ``reduce_scatter_tensor`` out
of place and in place, ``all_to_all_single`` out of place; at every power-of-two size in bf16 and
fp32. A call no file serves falls back to NCCL's own collective. Each served call's file is
simulated (MSCCL's loop, its protocol) against NCCL's best there (``nccl_best_times``, same model).

    python scripts/bench_selection.py                 # every built-in machine at 1, 2 and 4 nodes
    python scripts/bench_selection.py --topologies ndv2 --nodes 1 --no-write
    python scripts/bench_selection.py --previous /tmp/old/algorithms   # and what changed against an older checkout
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench_harness import (
    DATA_DIR,
    add_no_write_argument,
    add_nodes_argument,
    add_topologies_argument,
    argument_parser,
    command_line,
    csv_output,
    csv_pointer,
    log,
    machine_cases,
    markdown_table,
    update_benchmarks_section,
)

from taccl_py.baselines.nccl import nccl_best_times
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import read_library, shipped_library_paths
from taccl_py.msccl import generate_library_xml, parse_msccl_xml
from taccl_py.msccl.selection import power_of_two_sizes, selectable_for_powers_of_two, selection_report
from taccl_py.simulate import simulate
from taccl_py.topology import load_topology

CSV_PATH = DATA_DIR / "selection.csv"
CSV_HEADER = (
    "topology",
    "nodes",
    "collective",
    "placement",
    "dtype_bytes",
    "size_bytes",
    "selected",
    "matches",
    "vs_nccl",
)
# (collective, in place) in the order of the table's columns
CALLS = (
    (Collective.ALLREDUCE, True),
    (Collective.ALLGATHER, True),
    (Collective.ALLGATHER, False),
    (Collective.REDUCESCATTER, False),
    (Collective.REDUCESCATTER, True),
    (Collective.ALLTOALL, False),
)
SIZES = power_of_two_sizes(1 << 20, 1 << 30)


def instance_rows(name: str, nodes: int) -> list[tuple]:
    """Return one CSV row per call of one machine and node count.

    The file selected (or ``NCCL``), how many matched, and NCCL's best time over the file's there
    (above 1: the file is faster; empty where NCCL runs).
    """
    rows = []
    topology = load_topology(name, nodes)
    for path in shipped_library_paths(name, nodes):
        library = read_library(path)
        export = generate_library_xml(library, leave_to_nccl=nccl_best_times)
        texts = dict(export.files)
        nccl = {choice.size_bytes: choice.time_us for choice in nccl_best_times(topology, library.collective, SIZES)}
        placements = tuple(inplace for collective, inplace in CALLS if collective is library.collective)
        ratios: dict[tuple[str, int], float] = {}
        for selection in selection_report(export.keys, SIZES, {library.collective: placements}):
            call = selection.call
            placement = "in place" if call.inplace else "out of place"
            chosen = selection.chosen or "NCCL"
            ratio = ""
            if selection.chosen is not None:
                key = (selection.chosen, call.size_bytes)
                if key not in ratios:
                    algorithm = parse_msccl_xml(texts[selection.chosen + ".xml"], selection.chosen)
                    ratios[key] = nccl[call.size_bytes] / simulate(algorithm, topology, call.size_bytes).time_us
                ratio = f"{ratios[key]:.3f}"
            row = (name, nodes, call.collective.value, placement, call.dtype_size, call.size_bytes, chosen)
            rows.append((*row, len(selection.matches), ratio))
    return rows


def summary_table(records: Sequence[dict]) -> str:
    """Return one row per machine and node count: selected calls of each kind over all calls of that kind."""
    header = ["machine", "nodes"] + [f"{c.value} {'in' if i else 'out of'} place" for c, i in CALLS]
    rows = []
    for name, nodes in dict.fromkeys((r["topology"], r["nodes"]) for r in records):
        cells = [name, str(nodes)]
        for collective, inplace in CALLS:
            key = (name, nodes, collective.value, "in place" if inplace else "out of place")
            calls = [r for r in records if (r["topology"], r["nodes"], r["collective"], r["placement"]) == key]
            cells.append(_cell(calls))
        rows.append(cells)
    return markdown_table(header, rows)


def _cell(calls: Sequence[dict]) -> str:
    """Return ``served/all (worst vs NCCL)`` for one kind of call, ``-`` where the machine has none."""
    if not calls:
        return "-"
    served = [float(r["vs_nccl"]) for r in calls if r["selected"] != "NCCL"]
    worst = f" ({min(served):.2f}x)" if served else ""
    return f"{len(served)}/{len(calls)}{worst}"


COMPARED_SIZES = (1 << 20, 1 << 24, 1 << 28, 1 << 30)


def previous_rows(previous: Path, cases: Sequence[tuple[str, int]]) -> list[list[str]]:
    """Return, per library that differs from its copy in ``previous`` (an older ``algorithms/``), old/new time ratios.

    Each cell is the previous library's simulated time over the current one's at one size (below
    1: the current band is slower), starred where the previous band's chunk loop MSCCL never selects.
    """
    rows = []
    for name, nodes in cases:
        topology = load_topology(name, nodes)
        for path in shipped_library_paths(name, nodes):
            old_path = previous / name / f"n{nodes}" / path.name
            if not old_path.is_file() or old_path.read_text() == path.read_text():
                continue
            old, new = read_library(old_path), read_library(path)
            cells = [f"{name} x{nodes} {new.collective.value}"]
            for size in COMPARED_SIZES:
                before, after = old.select(size), new.select(size)
                ratio = simulate(before, topology, size).time_us / simulate(after, topology, size).time_us
                star = "" if selectable_for_powers_of_two(before) else "*"
                cells.append(f"{ratio:.3f}{star}")
            rows.append(cells)
    return rows


def render(records: Sequence[dict], elapsed_s: float, previous: list[list[str]] | None = None) -> str:
    """Return the BENCHMARKS.md body: what is counted, the table and the pointer to the CSV."""
    selected = sum(r["selected"] != "NCCL" for r in records)
    ambiguous = sum(int(r["matches"]) > 1 for r in records)
    served = [float(r["vs_nccl"]) for r in records if r["selected"] != "NCCL"]
    worst = f"; the slowest served call runs at {min(served):.3f}x NCCL's best" if served else ""
    return (
        "Calls an MSCCL runtime (msccl-executor-nccl's rule, RCCL's copy of it) serves from our exported files "
        "(`taccl export-msccl`, which leaves to NCCL every size where NCCL's own algorithm is modelled more than "
        "1% faster): every power-of-two size from 1 MiB to 1 GiB, in bf16 and fp32 (so 22 calls per cell); the "
        "rest fall back to NCCL's own collective. In brackets: the slowest served call's speed against NCCL's best "
        "there (NCCL's time over the file's, both simulated under MSCCL's loop, `msccl-net`; below 1: the file is "
        "slower). "
        "In-place calls are the ones PyTorch makes for `all_reduce` and FSDP2's "
        f"all-gather.\n\n{summary_table(records)}\n\n"
        f"{selected} of {len(records)} calls select an exported file{worst}; {ambiguous} match more than one.\n\n"
        f"{csv_pointer(CSV_PATH, len(records), 'Per call')}\n\n{_previous_text(previous)}Runtime: {elapsed_s:.0f} s."
    )


def _previous_text(previous: list[list[str]] | None) -> str:
    if not previous:
        return ""
    header = ["library"] + [f"{size >> 20} MiB" for size in COMPARED_SIZES]
    return (
        "Libraries that differ from `--previous` (rebuilt so that MSCCL can select every band): the previous "
        "library's simulated time over the current one's (below 1: the current band is slower in the model); "
        "`*`: the previous band's chunk loop divides no power-of-two count, so MSCCL never ran it and NCCL "
        f"did.\n\n{markdown_table(header, previous)}\n\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; print the summary; write the CSV and BENCHMARKS.md unless ``--no-write``."""
    parser = argument_parser(__doc__)
    add_topologies_argument(parser)
    add_nodes_argument(parser, "1,2,4")
    add_no_write_argument(parser)
    parser.add_argument(
        "--previous", type=Path, default=None, help="an older algorithms/ folder: compare the libraries that changed"
    )
    args = parser.parse_args(argv)
    cases = machine_cases(args.topologies, args.nodes)
    began = time.perf_counter()
    rows: list[tuple] = []
    for index, (name, nodes) in enumerate(cases, 1):
        log(f"[{index}/{len(cases)}] {name} x{nodes}")
        rows += instance_rows(name, nodes)
    previous = None if args.previous is None else previous_rows(args.previous, cases)
    elapsed = time.perf_counter() - began
    records = csv_output(CSV_PATH, CSV_HEADER, rows, write=not args.no_write)
    body = render(records, elapsed, previous)
    print(body)
    if not args.no_write:
        title = "MSCCL selection of the shipped libraries"
        update_benchmarks_section("selection", title, command_line(__file__, argv), body)
        log("wrote the selection section of BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
