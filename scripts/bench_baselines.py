"""Simulate every baseline on every built-in machine and report its time and fraction of the bound.

For each built-in topology x nodes x collective x size, computes one row with each applicable
baseline's simulated time (µs) and the fraction of the lower bound it reaches, writes the rows to
``scripts/data/baselines_simulated.csv`` and a summary (per topology and collective, the best
baseline's fraction of the bound at each size over the machine counts) to the ``baselines`` section
of BENCHMARKS.md.

    python scripts/bench_baselines.py                       # everything (a few minutes)
    python scripts/bench_baselines.py --topologies ndv2 --nodes 2 --no-write
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from bench_harness import (
    DATA_DIR,
    add_collectives_argument,
    add_no_write_argument,
    add_nodes_argument,
    add_sizes_argument,
    add_topologies_argument,
    argument_parser,
    collective_order,
    command_line,
    csv_output,
    csv_pointer,
    group_records,
    log,
    machine_cases,
    markdown_table,
    split_names,
    update_benchmarks_section,
    value_span,
)

from taccl_py.baselines import BaselineKind, applicable_kinds, build_baseline, size_groups
from taccl_py.bounds import lower_bounds
from taccl_py.simulate import SimulationResult, prepare_simulation, simulate_plan
from taccl_py.topology import load_topology
from taccl_py.topology.model import Topology
from taccl_py.units import format_size, parse_sizes

DEFAULT_SIZES = "1KB,32KB,1MB,32MB,1GB"
DEFAULT_NODES = "1,2,4"
KINDS = tuple(kind.value for kind in BaselineKind)
CSV_PATH = DATA_DIR / "baselines_simulated.csv"
#: One CSV row per machine x collective x size; ``<kind>_us`` and ``<kind>_of_bound`` are empty
#: where the kind does not apply. ``bound_us`` is the α-aware bound of issue 30 (AllReduce: the
#: ReduceScatter+AllGather class bound); ``old_bound_us`` and ``best_of_old_bound`` keep the cut-only
#: bound before it, for one release.
CSV_HEADER = (
    "machine",
    "topology",
    "nodes",
    "collective",
    "size",
    "size_bytes",
    "bound_us",
    *[f"{kind}_{what}" for kind in KINDS for what in ("us", "of_bound")],
    "best",
    "best_of_bound",
    "old_bound_us",
    "best_of_old_bound",
)


def bench_case(
    topology: Topology, collective: str, sizes: Sequence[int]
) -> dict[str, dict[int, tuple[str, SimulationResult]]]:
    """Return kind -> size -> (algorithm name, result) for every applicable baseline."""
    bounds = {b.size_bytes: b.time_us for b in lower_bounds(topology, collective, sizes)}
    out: dict[str, dict[int, tuple[str, SimulationResult]]] = {}
    for kind in applicable_kinds(topology, collective):
        out[kind.value] = {}
        channels, groups = size_groups(kind, topology, collective, sizes)
        for chunks, group in groups.items():
            began = time.perf_counter()
            algorithm = build_baseline(kind, topology, collective, chunks, channels=channels, size_bytes=group[-1])
            built = time.perf_counter()
            plan = prepare_simulation(algorithm, topology)
            for size in group:
                out[kind.value][size] = (algorithm.name, simulate_plan(plan, size, bound_time_us=bounds[size]))
            log(
                f"  {topology.name} {collective} {algorithm.name}: {plan.num_transfers} transfers, "
                f"built+verified {built - began:.1f}s, simulated {len(group)} sizes {time.perf_counter() - built:.1f}s"
            )
    return out


def table_rows(
    name: str, nodes: int, topology: Topology, collective: str, sizes: Sequence[int], found: dict
) -> list[tuple]:
    """Return the CSV rows (``CSV_HEADER``) of one case of built-in ``name`` on ``nodes`` machines: one per size,
    unformatted numbers, None where a kind does not apply."""
    old_bounds = {b.size_bytes: b.cut_only_time_us for b in lower_bounds(topology, collective, sizes)}
    rows = []
    for size in sizes:
        entries = {kind: found.get(kind, {}).get(size) for kind in KINDS}
        present = {kind: entry for kind, entry in entries.items() if entry is not None}
        best_name, best = min(present.values(), key=lambda entry: entry[1].time_us)
        cells = []
        for kind in KINDS:
            result = None if entries[kind] is None else entries[kind][1]
            cells += [None, None] if result is None else [result.time_us, result.fraction_of_bound]
        rows.append(
            (
                topology.name,
                name,
                nodes,
                collective,
                format_size(size),
                size,
                best.bound_time_us,
                *cells,
                best_name,
                best.fraction_of_bound,
                old_bounds[size],
                old_bounds[size] / best.time_us,
            )
        )
    return rows


def _row_key(row: Sequence) -> tuple:
    """CSV order: topology, nodes, collective (allgather, reducescatter, allreduce), size."""
    collective = row[3]
    return (
        row[1],
        row[2],
        *collective_order(collective),
        row[5],
    )


def summary_table(records: Sequence[dict]) -> str:
    """Return the markdown summary of CSV records (``read_csv`` of ``CSV_PATH``): one row per topology x collective.

    Each size column is the best baseline's fraction of the bound, worst-best over the machine counts;
    ``best baseline`` counts which kind is fastest over all machine counts and sizes.
    """
    sizes = sorted({(r["size_bytes"], r["size"]) for r in records})
    rows = []
    for (topology, collective), group in group_records(records, "topology", "collective").items():
        nodes = sorted({r["nodes"] for r in group})
        cells = []
        for size_bytes, _label in sizes:
            at_size = [r["best_of_bound"] for r in group if r["size_bytes"] == size_bytes]
            cells.append(value_span(at_size, 2) if at_size else "-")
        wins = {kind: sum(1 for r in group if str(r["best"]).split("-")[0] == kind) for kind in KINDS}
        rows.append(
            (
                topology,
                ",".join(str(n) for n in nodes),
                collective,
                *cells,
                ", ".join(f"{kind} {count}" for kind, count in wins.items() if count),
            )
        )
    headers = ("topology", "machines", "collective", *[label for _size, label in sizes], "best baseline (cases)")
    return markdown_table(headers, rows)


def render(records: Sequence[dict], elapsed_s: float) -> str:
    """Return the BENCHMARKS.md body: prose, the summary of ``records`` and the pointer to the CSV."""
    return (
        "Simulated with `taccl_py.simulate` (α-β links shared max-min fairly, computes free; see "
        "`taccl_py/simulate/engine.py`). Rings and hierarchical use one piece per channel; double binary trees "
        "(`tree`, allreduce only) and packed spanning trees (`trees`) tune their pipeline depth to the size; "
        "hierarchical only across machines.\n\n"
        "Summary: for each topology and collective, the fastest baseline's fraction of the lower bound "
        "(bound time / its time; 1.00 = optimal) at each size, worst-best over the machine counts, and how often "
        "each kind is the fastest. The bound adds the α of the cheapest route across the binding cut (issue 30); "
        "AllReduce's is the ReduceScatter+AllGather class bound, which in-network reduction (NVLS) can beat.\n\n"
        f"{summary_table(records)}\n\n"
        f"{csv_pointer(CSV_PATH, len(records), 'Every machine, collective and size')} Columns: machine, topology, "
        "nodes, collective, size, size_bytes, bound_us, then `<kind>_us` and `<kind>_of_bound` per baseline kind "
        "(empty: the kind does not apply), best, best_of_bound, and the cut-only bound before issue 30: old_bound_us, "
        "best_of_old_bound.\n\n"
        f"Runtime: {elapsed_s:.0f} s."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the summary; write the CSV and BENCHMARKS.md unless ``--no-write``."""
    parser = argument_parser(__doc__)
    add_topologies_argument(parser)
    add_nodes_argument(parser, DEFAULT_NODES)
    add_collectives_argument(parser)
    add_sizes_argument(parser, DEFAULT_SIZES)
    add_no_write_argument(parser, f"BENCHMARKS.md and {CSV_PATH.name}")
    args = parser.parse_args(argv)
    sizes = parse_sizes(args.sizes)
    began = time.perf_counter()
    rows: list[tuple] = []
    cases = [
        (name, nodes, c)
        for name, nodes in machine_cases(args.topologies, args.nodes)
        for c in split_names(args.collectives)
    ]
    for index, (name, nodes, collective) in enumerate(cases, 1):
        topology = load_topology(name, nodes=nodes)
        log(f"[{index}/{len(cases)}] {topology.name} ({topology.num_ranks} ranks) {collective}")
        rows += table_rows(name, nodes, topology, collective, sizes, bench_case(topology, collective, sizes))
    elapsed = time.perf_counter() - began
    records = csv_output(CSV_PATH, CSV_HEADER, rows, key=_row_key, write=not args.no_write)
    if not args.no_write:
        log(f"wrote {CSV_PATH}")
    body = render(records, elapsed)
    print(body)
    if not args.no_write:
        update_benchmarks_section(
            "baselines",
            "Baselines: rings, double binary trees, hierarchical rings, packed trees (simulated)",
            command_line(__file__, argv),
            body,
        )
        log("wrote the baselines section of BENCHMARKS.md")
    log(f"done in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
