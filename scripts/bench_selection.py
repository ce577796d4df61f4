"""Which shipped bands an MSCCL runtime would select: the calls PyTorch makes, 1 MiB to 1 GiB, per machine.

For every built-in machine and node count with shipped libraries, export the libraries as
``taccl export-msccl`` does (every band and placement, in-place forms verified) and apply
MSCCL's selection rule (``taccl_py.msccl.selection``) to the calls PyTorch users make: in-place
``all_reduce`` (always in place), ``all_gather_into_tensor`` in place (FSDP2) and out of place,
``reduce_scatter_tensor`` out of place and in place, ``all_to_all_single`` out of place; at every
power-of-two size in bf16 and fp32. A call no file serves falls back to NCCL's own collective.

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

from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import read_library, shipped_library_paths
from taccl_py.msccl import generate_library_xml
from taccl_py.msccl.selection import power_of_two_sizes, selectable_for_powers_of_two, selection_report
from taccl_py.simulate import simulate
from taccl_py.topology import load_topology

CSV_PATH = DATA_DIR / "selection.csv"
CSV_HEADER = ("topology", "nodes", "collective", "placement", "dtype_bytes", "size_bytes", "selected", "matches")
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
    """Return one CSV row per call of one machine and node count: the file selected (or ``NCCL``), how many matched."""
    rows = []
    for path in shipped_library_paths(name, nodes):
        library = read_library(path)
        export = generate_library_xml(library)
        placements = tuple(inplace for collective, inplace in CALLS if collective is library.collective)
        for selection in selection_report(export.keys, SIZES, {library.collective: placements}):
            call = selection.call
            placement = "in place" if call.inplace else "out of place"
            chosen = selection.chosen or "NCCL"
            row = (name, nodes, call.collective.value, placement, call.dtype_size, call.size_bytes, chosen)
            rows.append((*row, len(selection.matches)))
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
            cells.append(f"{sum(r['selected'] != 'NCCL' for r in calls)}/{len(calls)}" if calls else "-")
        rows.append(cells)
    return markdown_table(header, rows)


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
    return (
        "Calls an MSCCL runtime (msccl-executor-nccl's rule, RCCL's copy of it) serves from our exported files: "
        "every power-of-two size from 1 MiB to 1 GiB, in bf16 and fp32 (so 22 calls per cell); the rest fall back "
        "to NCCL's own collective. In-place calls are the ones PyTorch makes for `all_reduce` and FSDP2's "
        f"all-gather.\n\n{summary_table(records)}\n\n"
        f"{selected} of {len(records)} calls select an exported file; {ambiguous} match more than one.\n\n"
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
