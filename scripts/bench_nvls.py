"""Our shipped AllReduce on DGX-H100 against NCCL's NVLS (NVLink SHARP), modelled, and against the bounds.

For 1, 2, 4 and 8 DGX-H100 machines, each size takes the shipped library's band algorithm
(``algorithms/dgx-h100/n*/allreduce.library.json``, what the runtime runs there) and simulates it
(``taccl_py.simulate``). NCCL's NVLS (one machine) or NVLS-Tree (several) is modelled in the same
run (``taccl_py.baselines.nvls``: in-switch reduction at the published ~480 GB/s busbw of 8 H100s,
a tree over the NICs across machines). ``vs nvls`` is NVLS's time over ours (above 1: ours is
faster). Fractions: ours of the ReduceScatter+AllGather class bound (new, α-aware; and the old
cut-only one), ours and NVLS's of the in-network reduction bound, which holds for both.

    python scripts/bench_nvls.py                     # 1, 2, 4, 8 nodes, 1MB-1GB; writes BENCHMARKS.md
    python scripts/bench_nvls.py --nodes 1 --sizes 1MB,1GB --no-write
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from bench_harness import (
    DATA_DIR,
    add_no_write_argument,
    add_nodes_argument,
    add_sizes_argument,
    argument_parser,
    csv_pointer,
    log,
    print_table,
    split_names,
    update_benchmarks_section,
    write_csv,
)

from taccl_py.baselines.nvls import nvls_allreduce_times
from taccl_py.bounds import lower_bounds
from taccl_py.bounds.reduction import in_network_reduction_bounds
from taccl_py.ir.library import read_library, shipped_library_paths
from taccl_py.simulate import simulate
from taccl_py.topology import load_topology
from taccl_py.units import format_size, parse_sizes

MACHINE = "dgx-h100"
DEFAULT_NODES = "1,2,4,8"
DEFAULT_SIZES = "1MB,4MB,16MB,64MB,256MB,1GB"
CSV_PATH = DATA_DIR / "nvls.csv"
CSV_HEADER = (
    "nodes",
    "gpus",
    "size",
    "size_bytes",
    "ours",
    "ours_us",
    "nvls",
    "nvls_us",
    "vs_nvls",
    "ours_of_rsag_bound",
    "ours_of_old_rsag_bound",
    "ours_of_in_network_bound",
    "nvls_of_in_network_bound",
    "rsag_bound_us",
    "old_rsag_bound_us",
    "in_network_bound_us",
    "model",
)
TABLE_HEADER = (
    "nodes",
    "size",
    "ours (us)",
    "NCCL NVLS (us)",
    "vs nvls",
    "ours of RS+AG bound",
    "(old bound)",
    "ours of in-network bound",
    "NVLS of in-network bound",
)


def instance_rows(nodes: int, sizes: Sequence[int]) -> list[tuple]:
    """Return the CSV rows (``CSV_HEADER``) of ``nodes`` DGX-H100 machines, one per size."""
    topology = load_topology(MACHINE, nodes=nodes)
    (path,) = [p for p in shipped_library_paths(MACHINE, nodes) if p.name == "allreduce.library.json"]
    library = read_library(path)
    class_bounds = lower_bounds(topology, "allreduce", sizes)
    in_network = in_network_reduction_bounds(topology, sizes)
    nvls = nvls_allreduce_times(topology, sizes)
    rows = []
    for size, rsag, inr, modelled in zip(sizes, class_bounds, in_network, nvls):
        algorithm = library.select(size)
        ours = simulate(algorithm, topology, size, bound_time_us=rsag.time_us)
        rows.append(
            (
                nodes,
                topology.num_ranks,
                format_size(size),
                size,
                algorithm.name,
                ours.time_us,
                modelled.algorithm,
                modelled.time_us,
                modelled.time_us / ours.time_us,
                rsag.time_us / ours.time_us,
                rsag.cut_only_time_us / ours.time_us,
                inr.time_us / ours.time_us,
                inr.time_us / modelled.time_us,
                rsag.time_us,
                rsag.cut_only_time_us,
                inr.time_us,
                ours.model,
            )
        )
        log(f"{MACHINE} x{nodes} {format_size(size)}: ours {ours.time_us:.1f}, NVLS {modelled.time_us:.1f} us")
    return rows


def table_rows(records: Sequence[dict]) -> list[tuple]:
    """Return the printed table's rows (``TABLE_HEADER``) from CSV records."""
    return [
        (
            r["nodes"],
            r["size"],
            f"{r['ours_us']:.1f}",
            f"{r['nvls_us']:.1f} ({r['nvls']})",
            f"{r['vs_nvls']:.2f}x",
            f"{r['ours_of_rsag_bound']:.3f}",
            f"{r['ours_of_old_rsag_bound']:.3f}",
            f"{r['ours_of_in_network_bound']:.3f}",
            f"{r['nvls_of_in_network_bound']:.3f}",
        )
        for r in records
    ]


def faster_sizes(records: Sequence[dict]) -> str:
    """Return, per node count, the sizes where ours beats NVLS: ``1 node: 1MB; 4 nodes: 64MB, 256MB, 1GB``."""
    parts = []
    for nodes in dict.fromkeys(r["nodes"] for r in records):
        won = [r["size"] for r in records if r["nodes"] == nodes and r["vs_nvls"] > 1]
        parts.append(f"{nodes} node{'s' * (nodes > 1)}: {', '.join(won) or 'none'}")
    return "; ".join(parts)


def _body(table: str, csv_line: str, records: Sequence[dict], runtime_s: float) -> str:
    models = ", ".join(sorted({str(r["model"]) for r in records}))
    return f"""Simulated (α-β, max-min fair sharing; execution model `{models}`, the simulator's default): each
size runs the band algorithm of the shipped library `algorithms/dgx-h100/n*/allreduce.library.json`.
NCCL's NVLS AllReduce (NVLink SHARP: the NVSwitch reduces, so each GPU sends and receives the buffer
about once) is modelled in the same run by `taccl_py.baselines.nvls`: one machine NVLS, several
NVLS-Tree (in-switch reduction, then each GPU's slice up and down a tree of machines over its NIC).
Its switch figures come from NVIDIA's published ~480 GB/s busbw on 8 H100s (`topologies/dgx-h100.json`
sources). `vs nvls` = NVLS time / our time (above 1: ours is faster). Our fractions are of AllReduce's
ReduceScatter+AllGather class bound (new: with the α of the cheapest route across the binding cut;
`(old bound)`: the cut-only bound before issue 30), which NVLS is not held to; both columns of the
in-network reduction bound (`taccl_py.bounds.reduction`) hold for every AllReduce, NVLS
included.

{table}

{csv_line}

Sizes where ours is faster than NVLS: {faster_sizes(records)}. Why: NVLS pays its switch α (4.06 µs)
and NVLS-Tree two network α per tree level, so small sizes favour a short point-to-point schedule; at
large sizes on one or two machines NVLS wins outright, since any point-to-point AllReduce moves
2(N-1)/N of the buffer in and out of each GPU where NVLS moves (1 + 1/8) of it (our fractions of the
RS+AG class bound are near 1 there: no schedule of ours can close that gap). Above two machines
NVLS-Tree's NIC traffic binds (each GPU's slice, twice over for a tree's inner machines), and a
schedule that spreads the cross-machine traffic over all NICs can beat it.

Runtime: {runtime_s:.0f} s."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(__doc__, full_doc=True)
    add_nodes_argument(parser, DEFAULT_NODES)
    add_sizes_argument(parser, DEFAULT_SIZES, what="AllReduce sizes")
    add_no_write_argument(parser)
    args = parser.parse_args(argv)
    sizes = parse_sizes(args.sizes, "--sizes")
    began = time.perf_counter()
    rows = [row for nodes in (int(n) for n in split_names(args.nodes)) for row in instance_rows(nodes, sizes)]
    runtime_s = time.perf_counter() - began
    if args.no_write:
        print_table(TABLE_HEADER, table_rows([dict(zip(CSV_HEADER, row)) for row in rows]), markdown=True)
        return 0
    records = write_csv(CSV_PATH, CSV_HEADER, rows)
    table = print_table(TABLE_HEADER, table_rows(records), markdown=True)
    update_benchmarks_section(
        "nvls",
        "Our AllReduce against NCCL NVLS on DGX-H100 (simulated against modelled)",
        "python scripts/bench_nvls.py",
        _body(table, csv_pointer(CSV_PATH, len(records), "Every row, with the bounds in µs"), records, runtime_s),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
