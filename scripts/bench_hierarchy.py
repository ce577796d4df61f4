"""Benchmark hierarchical routes against the routes found on the whole graph, in the same run.

For every instance (built-in machine x nodes), phase (AllGather on the logical graph,
ReduceScatter on the reversed one) and size, each candidate chunking the synthesizer tries is
routed three ways and each routing ordered and scheduled (the list schedule, without the
contiguity MILP):

* ``whole graph``: the whole-graph MILP started from packed trees, with the greedy routes beside
  it: the synthesizer before hierarchical routes;
* ``hierarchical``: one machine's MILP design on every machine, one network hop per machine;
* ``both``: the synthesizer now: all of the above and the whole-graph MILP started from the better
  of packed and hierarchical routes.

Each column is the best over the chunkings, as the fraction of the phase's cut lower bound (bound
time / predicted time); ``hier s`` is the hierarchical routes' own time (local MILP and composition).

    python scripts/bench_hierarchy.py                       # the default instances, writes BENCHMARKS.md
    python scripts/bench_hierarchy.py --instances dgx1:2 --sizes 64MB --no-write
"""

from __future__ import annotations

import time

from bench_harness import (
    add_instances_argument,
    add_no_write_argument,
    add_sizes_argument,
    argument_parser,
    doc_prose,
    format_or_dash,
    log,
    of_bound,
    parse_instances,
    print_table,
    update_benchmarks_section,
)

from taccl_py.bounds import lower_bounds
from taccl_py.solvers import SolverOptions
from taccl_py.stages.hierarchy import hierarchical_routing
from taccl_py.stages.logical import build_logical_graph
from taccl_py.stages.ordering import order_sends
from taccl_py.stages.routing import route_candidates
from taccl_py.stages.scheduling import schedule_sends
from taccl_py.stages.sketch import auto_sketch
from taccl_py.stages.tree_packing import pack_trees, packed_routing
from taccl_py.synth.candidates import candidate_chunkings
from taccl_py.topology import load_topology
from taccl_py.units import format_size, parse_sizes

DEFAULT_INSTANCES = "dgx1:2,dgx1:4,dgx2:2,dgx2:4,ndv2:2,ndv2:4,pcie-8gpu:2,dgx-a100:4,dgx-h100:4,dgx-a100:8"
DEFAULT_SIZES = "16MB,64MB,1GB"
PHASES = ("allgather", "reducescatter")
USAGE = "    python scripts/bench_hierarchy.py"
GAIN_NOTE = "`gain`: the whole graph's best predicted time over the best of both (above 1: hierarchical routes help)."
HEADERS = ("instance", "phase", "size", "whole graph", "hierarchical", "both", "gain", "hier s")


def _makespan_us(routing, pieces: int, piece_bytes: float, options: SolverOptions) -> float:
    return schedule_sends(order_sends(routing, pieces, piece_bytes), options, milp=False).makespan_us


def compare_phase(graph, chunking, options: SolverOptions) -> tuple[float, float | None, float, float]:
    """Return the predicted time (µs) of whole-graph, hierarchical and all routes, and the hierarchical routes' (s)."""
    chunk_bytes = chunking.design_bytes / (graph.num_ranks * chunking.chunkup)
    piece_bytes = chunk_bytes / chunking.pieces
    args = (graph, chunking.chunkup, chunk_bytes, piece_bytes)
    packed = packed_routing(pack_trees(graph), chunking.chunkup, chunk_bytes, piece_bytes)
    whole = route_candidates(*args, options, start=packed)
    began = time.perf_counter()
    hierarchical = hierarchical_routing(*args, options)
    hier_s = time.perf_counter() - began
    times = {id(r): _makespan_us(r, chunking.pieces, piece_bytes, options) for r in (*whole, packed)}
    whole_us = min(times.values())
    if hierarchical is None:
        return whole_us, None, whole_us, hier_s
    hier_us = _makespan_us(hierarchical, chunking.pieces, piece_bytes, options)
    start = min((packed, hierarchical), key=lambda r: r.objective_us)
    both = route_candidates(*args, options, start=start)
    both_us = min([whole_us, hier_us, *(_makespan_us(r, chunking.pieces, piece_bytes, options) for r in both)])
    return whole_us, hier_us, both_us, hier_s


def run(instances: list[tuple[str, int]], sizes: list[int], options: SolverOptions) -> list[tuple]:
    """Return one row per (instance, phase, size): fractions of the bound of each way of routing."""
    rows = []
    for name, nodes in instances:
        topology = load_topology(name, nodes=nodes)
        graph = build_logical_graph(topology, auto_sketch(topology))
        for collective, phase_graph in zip(PHASES, (graph, graph.reverse())):
            for size, bound in zip(sizes, lower_bounds(topology, collective, sizes)):
                log(f"== {name} x{nodes} {collective} {format_size(size)}")
                best = [float("inf"), float("inf"), float("inf")]
                hier_s = 0.0
                for chunking in candidate_chunkings(phase_graph, collective, bound):
                    whole_us, hier_us, both_us, seconds = compare_phase(phase_graph, chunking, options)
                    hier_s += seconds
                    for i, value in enumerate((whole_us, hier_us, both_us)):
                        if value is not None:
                            best[i] = min(best[i], value)
                fractions = [of_bound(bound.time_us, t) for t in best]
                rows.append((f"{name} x{nodes}", collective, format_size(size), *fractions, best[0] / best[2], hier_s))
    return rows


def _format(rows: list[tuple]) -> list[tuple]:
    return [
        (*row[:3], *(format_or_dash(v, ".3f") for v in row[3:6]), f"{row[6]:.3f}x", f"{row[7]:.1f}") for row in rows
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    add_instances_argument(parser, DEFAULT_INSTANCES)
    add_sizes_argument(parser, DEFAULT_SIZES)
    add_no_write_argument(parser, "BENCHMARKS.md")
    args = parser.parse_args(argv)
    sizes = list(parse_sizes(args.sizes))
    rows = _format(run(parse_instances(args.instances), sizes, SolverOptions()))
    table = print_table(HEADERS, rows, markdown=True)
    if not args.no_write:
        command = "python scripts/bench_hierarchy.py" + "".join(
            f" --{name} {value}"
            for name, value, default in (
                ("instances", args.instances, DEFAULT_INSTANCES),
                ("sizes", args.sizes, DEFAULT_SIZES),
            )
            if value != default
        )
        body = f"{doc_prose(__doc__, USAGE)}\n\n{table}\n\n{GAIN_NOTE}\n"
        update_benchmarks_section(
            "hierarchy", "Hierarchical routes against whole-graph routes (predicted)", command, body
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
