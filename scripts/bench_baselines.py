"""Simulate every baseline on every built-in machine and report its time and fraction of the bound.

For each built-in topology x nodes x collective x size, prints one row with each applicable
baseline's simulated time (µs) and the fraction of the lower bound it reaches, and writes the
table to the ``baselines`` section of BENCHMARKS.md.

    python scripts/bench_baselines.py                       # everything (a few minutes)
    python scripts/bench_baselines.py --topologies ndv2 --nodes 2 --no-write
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmarks_md import update_benchmarks_section  # noqa: E402

from taccl_py.baselines import BaselineKind, applicable_kinds, build_baseline  # noqa: E402
from taccl_py.baselines.tree import default_tree_channels, default_tree_chunks  # noqa: E402
from taccl_py.simulate import SimulationResult, prepare_simulation, simulate_plan  # noqa: E402
from taccl_py.topology import builtin_topology_names, load_topology  # noqa: E402
from taccl_py.topology.bounds import lower_bounds  # noqa: E402
from taccl_py.topology.model import Topology  # noqa: E402
from taccl_py.units import format_size, parse_sizes  # noqa: E402

DEFAULT_SIZES = "1KB,32KB,1MB,32MB,1GB"
DEFAULT_NODES = "1,2,4"
COLLECTIVES = ("allgather", "reducescatter", "allreduce")
KINDS = tuple(kind.value for kind in BaselineKind)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _size_groups(kind: BaselineKind, topology: Topology, sizes: Sequence[int]) -> dict[int | None, list[int]]:
    """Return sizes grouped by the pipeline depth the baseline uses for them (trees tune it)."""
    if kind is not BaselineKind.TREE:
        return {None: list(sizes)}
    groups: dict[int | None, list[int]] = {}
    channels = default_tree_channels(topology)
    for size in sizes:
        groups.setdefault(default_tree_chunks(topology, size, channels), []).append(size)
    return groups


def bench_case(topology: Topology, collective: str, sizes: Sequence[int]) -> dict[str, dict[int, tuple[str, SimulationResult]]]:
    """Return kind -> size -> (algorithm name, result) for every applicable baseline."""
    bounds = {b.size_bytes: b.time_us for b in lower_bounds(topology, collective, sizes)}
    out: dict[str, dict[int, tuple[str, SimulationResult]]] = {}
    for kind in applicable_kinds(topology, collective):
        out[kind.value] = {}
        for chunks, group in _size_groups(kind, topology, sizes).items():
            began = time.perf_counter()
            algorithm = build_baseline(kind, topology, collective, chunks)
            built = time.perf_counter()
            plan = prepare_simulation(algorithm, topology)
            for size in group:
                out[kind.value][size] = (algorithm.name, simulate_plan(plan, size, bound_time_us=bounds[size]))
            _log(
                f"  {topology.name} {collective} {algorithm.name}: {plan.num_transfers} transfers, "
                f"built+verified {built - began:.1f}s, simulated {len(group)} sizes {time.perf_counter() - built:.1f}s"
            )
    return out


def _us(time_us: float) -> str:
    """Return a time in µs with sensible precision (1,234 / 56.7 / 8.90)."""
    if time_us >= 1000:
        return f"{time_us:,.0f}"
    return f"{time_us:.1f}" if time_us >= 10 else f"{time_us:.2f}"


def _cell(entry: tuple[str, SimulationResult] | None) -> str:
    if entry is None:
        return "-"
    result = entry[1]
    return f"{_us(result.time_us)} ({result.fraction_of_bound:.2f})"


def table_rows(topology: Topology, collective: str, sizes: Sequence[int], found: dict) -> list[list[str]]:
    """Return the markdown rows of one case: machine, collective, size, bound, one cell per kind, best."""
    rows = []
    for size in sizes:
        entries = {kind: found.get(kind, {}).get(size) for kind in KINDS}
        present = {kind: entry for kind, entry in entries.items() if entry is not None}
        best_name, best = min(present.values(), key=lambda entry: entry[1].time_us)
        rows.append([
            topology.name, collective, format_size(size), _us(best.bound_time_us),
            *[_cell(entries[kind]) for kind in KINDS], f"{best_name} ({best.fraction_of_bound:.2f})",
        ])
    return rows


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Return a GitHub markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the table; write BENCHMARKS.md unless ``--no-write``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", default=",".join(builtin_topology_names()), help="comma-separated built-in names (default: all)")
    parser.add_argument("--nodes", default=DEFAULT_NODES, help=f"comma-separated machine counts (default {DEFAULT_NODES})")
    parser.add_argument("--collectives", default=",".join(COLLECTIVES), help="comma-separated collectives (default: all three)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"nccl-tests sizes (default {DEFAULT_SIZES})")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    sizes = parse_sizes(args.sizes)
    names = [n for n in args.topologies.split(",") if n]
    node_counts = [int(n) for n in args.nodes.split(",") if n]
    collectives = [c for c in args.collectives.split(",") if c]
    began = time.perf_counter()
    rows: list[list[str]] = []
    cases = [(name, nodes, c) for name in names for nodes in node_counts for c in collectives]
    for index, (name, nodes, collective) in enumerate(cases, 1):
        topology = load_topology(name, nodes=nodes)
        _log(f"[{index}/{len(cases)}] {topology.name} ({topology.num_ranks} ranks) {collective}")
        rows += table_rows(topology, collective, sizes, bench_case(topology, collective, sizes))
    elapsed = time.perf_counter() - began
    headers = ["machine", "collective", "size", "bound (µs)", *[f"{kind} µs (of bound)" for kind in KINDS], "best (of bound)"]
    table = markdown_table(headers, rows)
    print(table)
    if not args.no_write:
        given = list(sys.argv[1:] if argv is None else argv)
        command = " ".join(["python scripts/bench_baselines.py", *given])
        body = (
            "Simulated with `taccl_py.simulate` (α-β links shared max-min fairly, computes free; see "
            "`taccl_py/simulate/engine.py`). Each cell: time in µs and, in parentheses, the lower bound's time over it "
            "(1.00 = optimal). Rings and hierarchical use one piece per channel; trees tune their pipeline depth to the "
            "size. `-`: the baseline does not apply (trees reduce only; hierarchical only across machines).\n\n"
            f"{table}\n\nRuntime: {elapsed:.0f} s."
        )
        update_benchmarks_section("baselines", "Baselines: rings, double binary trees, hierarchical rings (simulated)", command, body)
        _log("wrote the baselines section of BENCHMARKS.md")
    _log(f"done in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
