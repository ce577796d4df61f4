"""Explain where the shipped algorithms miss the bound: tree-routing ceiling, bandwidth schedule and α.

For every AllGather, ReduceScatter and AllReduce library (machine x nodes x collective) and every
size >= 16 MB that it was built for, the band's algorithm is simulated twice: as it is (T) and
with every route's latency α set to zero (T0, the same routes and steps, so the same links). With
B the cut lower bound (bandwidth term) and P the bandwidth-optimal time of tree routes on the
sketch's logical links (spanning-tree packing's LP optimum; ReduceScatter on the reversed graph;
AllReduce the two summed),

    B / T  =  B / P  x  P / T0  x  T0 / T
    (of bound) (ceiling) (bandwidth schedule) (α)

* ``ceiling`` < 1: no routing of whole chunks along trees of the sketch's links reaches the cut
  bound (the cut counts links, e.g. PCIe, that the sketch leaves out, or links that trees cannot
  all fill at once);
* ``bandwidth schedule`` < 1: the chosen algorithm's routes and order leave capacity idle even
  without latency (integral tree counts, contention, pipeline fill and drain);
* ``α`` < 1: the time spent in per-send latency.

A factor above 1 means the algorithm beats the ceiling's model (e.g. a baseline using links
the sketch leaves out). Rows go to ``scripts/data/gap.csv``; BENCHMARKS.md keeps the instances
that miss 0.95 of the bound at some size >= 16 MB, with their smallest and largest sizes.

    python scripts/bench_gap.py                                  # the shipped libraries
    python scripts/bench_gap.py --algorithms /tmp/clone/algorithms --nodes 8 --no-write
    python scripts/bench_gap.py --algorithms algorithms --algorithms /tmp/clone/algorithms   # shipped and built
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

from bench_harness import (
    COLLECTIVES,
    DATA_DIR,
    add_no_write_argument,
    add_nodes_argument,
    add_topologies_argument,
    argument_parser,
    collective_order,
    command_line,
    csv_output,
    csv_pointer,
    doc_prose,
    group_records,
    log,
    print_table,
    split_names,
    update_benchmarks_section,
)

from taccl_py.bounds import lower_bounds
from taccl_py.ir.library import read_library
from taccl_py.simulate import simulate_plan
from taccl_py.simulate.plan import prepare_simulation
from taccl_py.stages.logical import build_logical_graph
from taccl_py.stages.sketch import auto_sketch
from taccl_py.stages.tree_packing import pack_trees
from taccl_py.topology import load_topology
from taccl_py.units import format_size

REPO = Path(__file__).resolve().parents[1]
GAP_CSV = DATA_DIR / "gap.csv"
LARGE_BYTES = 16 * 10**6  # the ">= 16 MB" target
TARGET = 0.95
# The size the ceiling is computed at: large enough that the latency floor never binds.
CEILING_BYTES = 10**9
HEADER = (
    "topology",
    "nodes",
    "collective",
    "size",
    "size_bytes",
    "chosen",
    "of_bound",
    "ceiling",
    "bandwidth_schedule",
    "alpha",
    "time_us",
    "time_no_alpha_us",
    "bound_us",
)
FACTORS = {"ceiling": "tree ceiling", "bandwidth_schedule": "bandwidth schedule", "alpha": "α"}
USAGE = "    python scripts/bench_gap.py"


@cache
def phase_ceilings(topology_name: str, nodes: int) -> dict[str, float]:
    """Return, per collective, the cut bound's bandwidth time over tree packing's optimal time (<= 1)."""
    topology = load_topology(topology_name, nodes=nodes)
    graph = build_logical_graph(topology, auto_sketch(topology))
    packing_us = {
        phase: pack_trees(phase_graph).load_us_per_byte * CEILING_BYTES / graph.num_ranks
        for phase, phase_graph in (("allgather", graph), ("reducescatter", graph.reverse()))
    }
    packing_us["allreduce"] = packing_us["allgather"] + packing_us["reducescatter"]
    return {
        collective: lower_bounds(topology, collective, [CEILING_BYTES])[0].bandwidth_time_us / packing_us[collective]
        for collective in packing_us
    }


def library_rows(path: Path) -> list[tuple]:
    """Return one ``HEADER`` row per size >= 16 MB of the library at ``path``."""
    library = read_library(path)
    topology_name, nodes, collective = library.topology, library.nodes, library.collective.value
    topology = load_topology(topology_name, nodes=nodes)
    sizes = [s for s in library.provenance.sizes if s >= LARGE_BYTES] if library.provenance else []
    ceiling = phase_ceilings(topology_name, nodes)[collective]
    rows = []
    for size, bound in zip(sizes, lower_bounds(topology, collective, sizes)):
        algorithm = library.select(size)
        plan = prepare_simulation(algorithm, topology)
        time_us = simulate_plan(plan, size, bound_time_us=bound.time_us).time_us
        no_alpha = replace(plan, route_alpha_us=(0.0,) * len(plan.route_alpha_us))
        time_no_alpha_us = simulate_plan(no_alpha, size, bound_time_us=bound.time_us).time_us
        packing_us = bound.bandwidth_time_us / ceiling
        rows.append(
            (
                topology_name,
                nodes,
                collective,
                format_size(size),
                size,
                algorithm.name,
                bound.time_us / time_us,
                ceiling,
                packing_us / time_no_alpha_us,
                time_no_alpha_us / time_us,
                time_us,
                time_no_alpha_us,
                bound.time_us,
            )
        )
    return rows


def _libraries(root: Path, topologies: set[str] | None, nodes: set[int] | None) -> list[Path]:
    paths = []
    for path in sorted(root.glob("*/n*/*.library.json")):
        topology, node_dir = path.parent.parent.name, path.parent.name
        # The ceiling is tree packing's; AlltoAll routes blocks, not trees, and has none.
        if path.name.removesuffix(".library.json") not in COLLECTIVES:
            continue
        if (topologies is None or topology in topologies) and (nodes is None or int(node_dir[1:]) in nodes):
            paths.append(path)
    return paths


def _largest_loss(record: dict) -> str:
    name = min(FACTORS, key=lambda factor: record[factor])
    return FACTORS[name]


def miss_table(records: list[dict]) -> list[tuple]:
    """Return one row per instance missing ``TARGET`` at some size >= 16 MB: its smallest and largest sizes."""
    rows = []
    for (topology, nodes, collective), group in group_records(records, "topology", "nodes", "collective").items():
        if min(r["of_bound"] for r in group) >= TARGET:
            continue
        group.sort(key=lambda r: r["size_bytes"])
        small, large = group[0], group[-1]
        rows.append(
            (
                f"{topology} x{nodes}",
                collective,
                f"{small['of_bound']:.3f} / {large['of_bound']:.3f}",
                f"{small['ceiling']:.3f}",
                f"{small['bandwidth_schedule']:.3f} / {large['bandwidth_schedule']:.3f}",
                f"{small['alpha']:.3f} / {large['alpha']:.3f}",
                f"{_largest_loss(small)} / {_largest_loss(large)}",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--algorithms",
        type=Path,
        action="append",
        help="a tree of libraries, repeatable (default: the shipped ones, algorithms/)",
    )
    add_topologies_argument(parser, unset="every library")
    add_nodes_argument(parser, None, unset="every library")
    add_no_write_argument(parser)
    args = parser.parse_args(argv)
    topologies = set(split_names(args.topologies)) or None
    nodes = {int(n) for n in split_names(args.nodes)} or None
    roots = args.algorithms or [REPO / "algorithms"]
    # An instance in two trees is taken from the first that has it.
    by_instance: dict[tuple[str, ...], Path] = {}
    for root in roots:
        for path in _libraries(root, topologies, nodes):
            by_instance.setdefault(path.parts[-3:], path)
    paths = list(by_instance.values())
    rows = []
    for index, path in enumerate(paths, 1):
        log(f"[{index}/{len(paths)}] {path}")
        rows.extend(library_rows(path))

    def key(row):
        return (row[0], row[1], *collective_order(row[2]), row[4])

    records = csv_output(GAP_CSV, HEADER, rows, key, write=not args.no_write)
    headers = (
        "instance",
        "collective",
        "of bound (16 MB / 1 GB)",
        "tree ceiling",
        "bandwidth schedule (16 MB / 1 GB)",
        "α (16 MB / 1 GB)",
        "largest loss (16 MB / 1 GB)",
    )
    misses = miss_table(records)
    table = print_table(headers, misses, markdown=True)
    if not args.no_write:
        instances = len({(r["topology"], r["nodes"], r["collective"]) for r in records})
        body = (
            f"{doc_prose(__doc__, USAGE)}\n\n"
            f"{len(misses)} of {instances} instances miss {TARGET} of the bound at some size >= 16 MB:\n\n"
            f"{table}\n\n{csv_pointer(GAP_CSV, len(records), 'Every size')}\n"
        )
        update_benchmarks_section("gap", "Where the bound is missed, and why", command_line(__file__, argv), body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
