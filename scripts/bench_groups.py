"""Data-parallel groups of a 3D-parallel job: our libraries against NCCL's best over the same groups.

For each machine set, the data-parallel groups of ``--parallel tp=G,dp=N`` (G GPUs per machine,
N machines: one GPU of each machine per group, all G groups running at once) are synthesized as
``taccl synthesize --parallel`` does (``taccl_py.synth.groups``: one library per placement class,
every link shared among the groups crossing it), at every power of two from 1 MiB to 1 GiB. Each
size's chosen algorithm (a native band: NCCL's own) is simulated under MSCCL's loop and compared
with NCCL's best modelled algorithm over the same group topology (rings with NCCL's channel counts,
double binary trees, PAT: ``nccl_best_times``) and with the group's lower bound.

    python scripts/bench_groups.py                          # dgx-h100 x4, x8 and ndv2 x4
    python scripts/bench_groups.py --instances ndv2:4 --collectives allreduce --no-write
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from bench_harness import (
    DATA_DIR,
    add_collectives_argument,
    add_instances_argument,
    add_no_write_argument,
    argument_parser,
    command_line,
    csv_output,
    csv_pointer,
    log,
    markdown_table,
    parse_instances,
    split_names,
    update_benchmarks_section,
)

from taccl_py.baselines.nccl import nccl_best_times
from taccl_py.placement.parallel import parallel_groups
from taccl_py.synth import synthesize
from taccl_py.synth.groups import group_topologies
from taccl_py.topology import load_topology

CSV_PATH = DATA_DIR / "groups.csv"
CSV_HEADER = (
    "topology",
    "nodes",
    "collective",
    "members",
    "groups",
    "size_bytes",
    "chosen",
    "time_us",
    "nccl",
    "nccl_us",
    "vs_nccl",
    "of_bound",
    "synth_s",
)
SIZES = tuple(2**power for power in range(20, 31))  # 1 MiB .. 1 GiB


def instance_rows(name: str, nodes: int, collectives: Sequence[str]) -> list[tuple]:
    """Return one row per (placement class, collective, size) of the data-parallel groups of ``name`` x ``nodes``."""
    topology = load_topology(name, nodes=nodes)
    (data_parallel,) = (
        kind
        for kind in parallel_groups({"tp": topology.gpus_per_node, "dp": nodes}, topology.num_ranks)
        if kind.kind == "dp"
    )
    rows = []
    for record, group in group_topologies(topology, data_parallel):
        for collective in collectives:
            began = time.perf_counter()
            result = synthesize(group, collective, sizes=SIZES, jobs=1)
            elapsed = time.perf_counter() - began
            nccl = nccl_best_times(group, collective, SIZES)
            log(f"  {group.name} {collective}: {elapsed:.0f} s")
            for choice, best in zip(result.choices, nccl):
                ours_us = best.time_us if choice.native else choice.chosen_result.time_us
                rows.append(
                    (
                        name,
                        nodes,
                        collective,
                        " ".join(map(str, record.members)),
                        len(record.groups),
                        choice.size_bytes,
                        "NCCL" if choice.native else choice.chosen.name,
                        round(ours_us, 3),
                        best.name,
                        round(best.time_us, 3),
                        round(best.time_us / ours_us, 4),
                        round(choice.chosen_result.bound_time_us / ours_us, 4),
                        round(elapsed, 1),
                    )
                )
    return rows


def summary_table(records: Sequence[dict]) -> str:
    """Return one line per machine set, class and collective: the worst ratio to NCCL and the fraction of bound."""
    header = ["machines", "DP group (members)", "groups alike", "collective", "min vs NCCL", "of bound 1 MiB"]
    header += ["of bound 64 MiB", "of bound 1 GiB", "sizes left to NCCL", "synthesis (s)"]
    lines = []
    keys = dict.fromkeys((r["topology"], r["nodes"], r["members"], r["collective"]) for r in records)
    for name, nodes, members, collective in keys:
        cell = [
            r
            for r in records
            if (r["topology"], r["nodes"], r["members"], r["collective"]) == (name, nodes, members, collective)
        ]
        by_size = {r["size_bytes"]: r for r in cell}
        lines.append(
            [
                f"{name} x{nodes}",
                str(members).replace(" ", ","),
                cell[0]["groups"],
                collective,
                f"{min(float(r['vs_nccl']) for r in cell):.3f}x",
                *(f"{float(by_size[size]['of_bound']):.2f}" for size in (2**20, 2**26, 2**30)),
                f"{sum(r['chosen'] == 'NCCL' for r in cell)} of {len(cell)}",
                cell[0]["synth_s"],
            ]
        )
    return markdown_table(header, lines)


def render(records: Sequence[dict], elapsed_s: float) -> str:
    """Return the BENCHMARKS.md body: what is compared, the table and the pointer to the CSV."""
    worst = min(float(r["vs_nccl"]) for r in records)
    return (
        "The data-parallel groups of `taccl synthesize --parallel tp=G,dp=N` (one GPU of each machine per group, "
        "all G groups at once, each link's rate shared among the groups crossing it) against NCCL's best "
        "modelled algorithm over the same groups (rings with NCCL's channel counts, double binary trees, PAT), "
        "both under MSCCL's loop (`msccl-net`), at every power of two from 1 MiB to 1 GiB. `min vs NCCL`: "
        "NCCL's time over "
        "ours at the worst size (1: equal; a size left to NCCL counts as 1); `of bound`: the group's lower "
        "bound over our time (NCCL's where the size is left to it). A size is left to NCCL (a `native` band) "
        "where NCCL's modelled algorithm, PAT for one GPU per machine, beats every schedule a band may hold.\n\n"
        f"{summary_table(records)}\n\nSlowest size against NCCL's best: {worst:.3f}x.\n\n"
        f"{csv_pointer(CSV_PATH, len(records), 'Per size')}\n\nRuntime: {elapsed_s:.0f} s."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; print it; write the CSV and BENCHMARKS.md unless ``--no-write``."""
    parser = argument_parser(__doc__)
    add_instances_argument(parser, "dgx-h100:4,dgx-h100:8,ndv2:4")
    add_collectives_argument(parser, "allreduce,allgather,reducescatter")
    add_no_write_argument(parser)
    args = parser.parse_args(argv)
    cases = parse_instances(args.instances)
    began = time.perf_counter()
    rows: list[tuple] = []
    for index, (name, nodes) in enumerate(cases, 1):
        log(f"[{index}/{len(cases)}] {name} x{nodes}")
        rows += instance_rows(name, nodes, split_names(args.collectives))
    records = csv_output(CSV_PATH, CSV_HEADER, rows, write=not args.no_write)
    body = render(records, time.perf_counter() - began)
    print(body)
    if not args.no_write:
        title = "Process groups: data-parallel libraries against NCCL over the same groups"
        update_benchmarks_section("groups", title, command_line(__file__, argv), body)
        log("wrote the groups section of BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
