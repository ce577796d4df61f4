"""The one-page summary at the top of BENCHMARKS.md: each shipped library against the best baseline and the bound.

Per machine and node count, over its four collectives and the 11 sizes from 1 KB to 1 GB that
``scripts/rechoose_bands.py`` simulates (``scripts/data/slice_model.csv``, MSCCL's slice-loop
model), the shipped band's time is compared with the fastest baseline simulated the same way
(rings with NCCL's channel counts, double binary trees, hierarchical rings, packed trees; loadable
by MSCCL or not: ``taccl_py.baselines.compare_baselines``) and with today's lower bound. On the
NVSwitch machines it also reads each shipped AllReduce against NCCL's best algorithm, NVLS
included (``scripts/data/vs_nccl.csv``, ``scripts/bench_nccl.py``). No simulation runs here: rerun
the two scripts that write those CSVs, then this one.

    python scripts/bench_summary.py
    python scripts/bench_summary.py --no-write
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bench_harness import (
    DATA_DIR,
    add_no_write_argument,
    argument_parser,
    command_line,
    group_records,
    markdown_table,
    print_table,
    read_csv,
    row_bound_us,
    update_benchmarks_section,
    value_span,
)

from taccl_py.units import format_size

SHIPPED_CSV = DATA_DIR / "slice_model.csv"
NCCL_CSV = DATA_DIR / "vs_nccl.csv"
SELECTION_CSV = DATA_DIR / "selection.csv"
SELECTION_DETAIL = "[detail](#msccl-selection-of-the-shipped-libraries)"
GROUPS_CSV = DATA_DIR / "groups.csv"
GROUPS_DETAIL = "[detail](#process-groups-data-parallel-libraries-against-nccl-over-the-same-groups)"
# GitHub's anchors of the sections holding the detail.
DETAIL = "[detail](#shipped-bands-under-msccls-slice-loop)"
NCCL_DETAIL = "[detail](#shipped-libraries-against-nccls-algorithms-on-nvswitch-machines)"
# NCCL's algorithms that reduce in the switch (``taccl_py.baselines.nccl``), as the summary names them.
SWITCH_ALGORITHMS = {"nccl-nvls": "NVLS", "nccl-nvls-tree": "NVLS-Tree"}
HEADERS = (
    "machine",
    "nodes",
    "sizes",
    "vs best baseline: median",
    "worst (where)",
    "slower than a baseline",
    "of bound: median",
    "lowest (where)",
    "",
)


def summary_rows(records: list[dict]) -> list[tuple]:
    """Return one row per machine and node count: ratio to the best baseline and fraction of the bound."""
    bounds: dict[tuple, float] = {}
    rows = []
    for (name, nodes), group in sorted(group_records(records, "topology", "nodes").items()):
        ratios = [(row["baseline_us"] / row["ours_us"], row) for row in group if row["baseline_us"]]
        fractions = [(row_bound_us(row, bounds) / row["ours_us"], row) for row in group]
        worst, worst_row = min(ratios, key=lambda pair: pair[0])
        lowest, lowest_row = min(fractions, key=lambda pair: pair[0])
        slower = sum(ratio < 1 - 1e-9 for ratio, _ in ratios)
        rows.append(
            (
                name,
                nodes,
                len(group),
                f"{statistics.median(r for r, _ in ratios):.2f}x",
                f"{worst:.2f}x ({_where(worst_row)})",
                f"{slower} of {len(ratios)}",
                f"{statistics.median(f for f, _ in fractions):.2f}",
                f"{lowest:.2f} ({_where(lowest_row)})",
                DETAIL,
            )
        )
    return rows


def _where(row: dict) -> str:
    return f"{row['collective']} {format_size(row['size_bytes'])}"


def nccl_line(records: list[dict]) -> str:
    """Return one sentence: each NVSwitch machine's shipped AllReduce against NCCL's best, per node count.

    E.g. ``DGX-H100 x1 1.12-2.85x (NVLS from 4MiB)``: the span of NCCL's time over the library's
    across the sizes, and the size from which NCCL's best is its switch algorithm, where that is
    not the smallest size (the sentence says NCCL's best is NVLS or NVLS-Tree elsewhere).
    """
    parts = []
    allreduce = [row for row in records if row["collective"] == "allreduce"]
    for (machine, nodes), group in group_records(allreduce, "machine", "nodes").items():
        ratios = [row["vs_nccl"] for row in group]
        switch = _switch_from(group)
        parts.append(f"{machine.upper()} x{nodes} {value_span(ratios, 2)}x" + (f" ({switch})" if switch else ""))
    sizes = sorted({row["size_bytes"] for row in allreduce})
    span = f"{format_size(sizes[0])}-{format_size(sizes[-1])}" if sizes else "no sizes"
    return (
        f"Shipped AllReduce on NVSwitch machines, {span}, against NCCL's best algorithm (modelled; NVLS on one "
        f"machine, NVLS-Tree across machines at every size unless noted): {'; '.join(parts)} ({NCCL_DETAIL})."
    )


def selection_line(records: list[dict]) -> str:
    """Return one sentence: how many calls MSCCL's rule serves from the exported files, and the slowest against NCCL."""
    served = [row for row in records if row["selected"] != "NCCL"]
    if not served:
        return ""
    worst = min(served, key=lambda row: float(row["vs_nccl"]))
    machines = ", ".join(f"{machine} x{nodes}" for machine, nodes in group_records(records, "topology", "nodes"))
    return (
        f"Exported MSCCL XML ({machines}; every power of two from 1 MiB to 1 GiB, the calls PyTorch makes): "
        f"MSCCL's rule serves {len(served)} of {len(records)} calls from our files, the slowest at "
        f"{float(worst['vs_nccl']):.2f}x NCCL's best there ({worst['topology']} x{worst['nodes']} "
        f"{worst['collective']} {format_size(int(worst['size_bytes']))}); the export leaves every other size to "
        f"NCCL, which the model has faster there or which the files cannot serve ({SELECTION_DETAIL})."
    )


def groups_line(records: list[dict]) -> str:
    """Return one sentence: the data-parallel group libraries against NCCL over the same groups."""
    if not records:
        return ""
    worst = min(float(row["vs_nccl"]) for row in records)
    machines = ", ".join(f"{machine} x{nodes}" for machine, nodes in group_records(records, "topology", "nodes"))
    native = sum(row["chosen"] == "NCCL" for row in records)
    return (
        f"Data-parallel groups of `--parallel tp=G,dp=N` ({machines}; all G rails at once, 1 MiB-1 GiB): at "
        f"least {worst:.2f}x NCCL's best over the same groups; {native} of {len(records)} sizes are left to "
        f"NCCL (PAT, for AllGather and ReduceScatter) ({GROUPS_DETAIL})."
    )


def _switch_from(group: list[dict]) -> str:
    """Return e.g. ``NVLS from 4MiB`` where NCCL's best turns to a switch algorithm above the smallest size, or "".

    Also names NCCL's best at the largest size where that is no switch algorithm.
    """
    names = [row["nccl_algorithm"] for row in group]
    if names[-1] not in SWITCH_ALGORITHMS:
        return f"{names[-1]} at {format_size(group[-1]['size_bytes'])}"
    first = len(names)
    while first > 0 and names[first - 1] == names[-1]:
        first -= 1
    return "" if first == 0 else f"{SWITCH_ALGORITHMS[names[-1]]} from {format_size(group[first]['size_bytes'])}"


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    add_no_write_argument(parser, kept="BENCHMARKS.md")
    args = parser.parse_args(argv)
    records = read_csv(SHIPPED_CSV)
    rows = summary_rows(records)
    print_table(HEADERS[:-1], [row[:-1] for row in rows])
    if args.no_write:
        return 0
    body = "\n\n".join(
        (
            "Each shipped library (`algorithms/`, what `taccl export-msccl` and the runtime use) against the "
            "fastest baseline and the lower bound, per machine and node count, over allgather, reducescatter, "
            "allreduce and alltoall at 11 sizes from 1 KB to 1 GB, simulated as MSCCL runs it (`msccl-net`: 2 MiB "
            "slices; sends serialized inside a machine, pipelined between machines). "
            "Above 1.00x the shipped band is faster; `of bound` is the bound's time over the band's (AllReduce: "
            "the ReduceScatter+AllGather class bound). A baseline MSCCL cannot load (NCCL's own 6 rings on "
            "NDv2, 48 chunks per loop) still counts: it is what NCCL runs without us.",
            markdown_table(HEADERS, rows),
            nccl_line(read_csv(NCCL_CSV)),
            selection_line(read_csv(SELECTION_CSV)),
            groups_line(read_csv(GROUPS_CSV)),
            f"From `{SHIPPED_CSV.relative_to(Path(__file__).resolve().parents[1])}`, "
            f"`{NCCL_CSV.relative_to(Path(__file__).resolve().parents[1])}`, "
            f"`{SELECTION_CSV.relative_to(Path(__file__).resolve().parents[1])}` and "
            f"`{GROUPS_CSV.relative_to(Path(__file__).resolve().parents[1])}`; the bound is today's.",
        )
    )
    update_benchmarks_section("summary", "Summary", command_line(__file__, argv), body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
