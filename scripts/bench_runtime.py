"""Time the runtime over gloo against gloo's own all_gather/all_reduce/all_to_all_single, and the executor's own cost.

Starts N local gloo ranks (loopback) for each N in --ranks and, per collective and size, times
our ring, every other candidate (a ring cut into two chunks per rank, a direct all-pairs
schedule, the shipped algorithms and the baselines of the built-in machines that have N GPUs)
and torch.distributed's collective, alternately, on the same group: the median over --iters of
the slowest rank. "best" is the fastest candidate at that size, known only afterwards; "chosen"
is what a Communicator on the ring library runs once calibrated on the group (the ring, or gloo's
own unless the ring measured more than 5% faster), timed again after the calibration. The
executor's own cost per round is measured over a transport that moves nothing. Writes the
``runtime`` section of BENCHMARKS.md unless --no-write.

alltoall has no ring: its first candidate is the direct schedule (every rank sends each peer its
block, peers by offset), the others the direct schedule with two chunks per block and (unless
--no-shipped) the baselines of the built-in machines; "chosen" calibrates the direct schedule
against gloo's all_to_all_single. Its rows go to the ``runtime-alltoall`` section.

    python scripts/bench_runtime.py                          # 4 and 8 ranks, 64KB-64MB (minutes)
    python scripts/bench_runtime.py --ranks 4 --sizes 1MB,4MB --iters 5 --no-write
    python scripts/bench_runtime.py --collectives alltoall --no-shipped
"""

from __future__ import annotations

import argparse
import os
import sys

from bench_harness import (
    add_collectives_argument,
    add_no_write_argument,
    add_sizes_argument,
    argument_parser,
    log,
    print_table,
    split_names,
    text_table,
    update_benchmarks_section,
)

from taccl_py.ir.algorithm import Algorithm, Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import read_library, shipped_library_dir
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
from taccl_py.runtime.launch import run_local
from taccl_py.runtime.measure.bench import BenchRow, bench_sizes, executor_overhead_us, ring_algorithm
from taccl_py.units import format_size, parse_sizes

COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE, Collective.ALLTOALL)
DEFAULT_COLLECTIVES = ",".join(c.value for c in COLLECTIVES)
DEFAULT_SIZES = "64KB-64MB"
CALIBRATED = "calibrated"  # results key of the calibrated Communicator's rows
I, O = Buffer.INPUT, Buffer.OUTPUT


def direct_algorithm(collective: Collective, n: int, chunks_per_block: int = 1) -> Algorithm:
    """Return the all-pairs schedule: every rank sends each block straight to the rank that needs it.

    ``chunks_per_block`` (alltoall only) cuts each block into that many chunks.
    """
    items: list[Transfer | LocalCopy] = []
    if collective is Collective.ALLTOALL:  # peers by offset, as the direct baseline: no rank is everyone's first
        k = chunks_per_block
        items += [LocalCopy(r, (I, r * k + j), (O, r * k + j)) for r in range(n) for j in range(k)]
        for offset in range(1, n):
            items += [
                Transfer(r, (r + offset) % n, (I, (r + offset) % n * k + j), (O, r * k + j))
                for r in range(n)
                for j in range(k)
            ]
        return lower_plan(f"direct-alltoall-{n}x{k}", collective, n, n * k, items)
    if collective is Collective.ALLGATHER:
        items += [LocalCopy(r, (I, 0), (O, r)) for r in range(n)]
        items += [Transfer(r, q, (I, 0), (O, r)) for r in range(n) for q in range(n) if q != r]
    elif collective is Collective.REDUCESCATTER:  # rank q reduces block q of every rank into its output
        items += [LocalCopy(q, (I, q), (O, 0)) for q in range(n)]
        items += [Transfer(r, q, (I, q), (O, 0), reduce=True) for r in range(n) for q in range(n) if q != r]
    else:  # allreduce in place: reduce block q at rank q, then rank q sends it to everyone
        items += [Transfer(r, q, (I, q), (I, q), reduce=True) for r in range(n) for q in range(n) if q != r]
        items += [Transfer(q, r, (I, q), (I, q)) for q in range(n) for r in range(n) if q != r]
    return lower_plan(
        f"direct-{collective.value}-{n}", collective, n, n, items, inplace=collective is Collective.ALLREDUCE
    )


def candidates(collective: Collective, n: int, shipped: bool = True) -> list[Algorithm]:
    """Return our algorithms for ``collective`` on ``n`` ranks; the first is the ring.

    Without ``shipped``: only the rings and the direct schedule, not the libraries and baselines of the machines.
    alltoall has no ring: its first is the direct schedule, then the same with two chunks per block.
    """
    if collective is Collective.ALLTOALL:
        found = [direct_algorithm(collective, n), direct_algorithm(collective, n, 2)]
    else:
        found = [ring_algorithm(collective, n), ring_algorithm(collective, n, 2), direct_algorithm(collective, n)]
    if not shipped:
        return found
    for path in sorted(shipped_library_dir().glob("*/n*/*.library.json")):
        library = read_library(path)
        if library.num_ranks == n and library.collective is collective:
            found += [
                band.algorithm.with_metadata(library=str(path.relative_to(shipped_library_dir())))
                for band in library.bands
            ]
    try:
        from taccl_py.baselines import all_baselines
        from taccl_py.topology import builtin_topology_names, load_topology
    except ImportError:
        return found
    for name in builtin_topology_names():
        topology = load_topology(name)
        if topology.num_ranks == n:
            found += [a.with_metadata(topology=name) for a in all_baselines(topology, collective)]
    return found


def label(algorithm: Algorithm) -> str:
    where = algorithm.meta("library") or algorithm.meta("topology")
    return f"{algorithm.name}@{where}" if where else algorithm.name


def bench_worker(
    rank: int, world: int, sizes: tuple[int, ...], iters: int, shipped: bool, collectives: tuple[Collective, ...]
) -> dict:
    """One rank: time every candidate against torch at every size; return rows per (collective, label)."""
    from taccl_py.runtime.communicator import Communicator

    results: dict = {}
    for collective in collectives:
        found = candidates(collective, world, shipped)
        for algorithm in found:
            comm = Communicator(None, algorithm, timeout_s=120, calibration=False)  # the algorithm itself
            rows = bench_sizes(comm, collective, sizes, iters=iters, warmup=1, progress=log if rank == 0 else None)
            results[(collective.value, label(algorithm))] = rows
        comm = Communicator(None, found[0], timeout_s=120)  # the ring (alltoall: the direct schedule)
        comm.calibrate(sizes, collectives=[collective], iters=iters, warmup=1)
        results[(CALIBRATED, collective.value)] = bench_sizes(comm, collective, sizes, iters=iters, warmup=1)
    return results


def summarize(
    world: int, results: dict[tuple[str, str], list[BenchRow]], collectives: tuple[Collective, ...]
) -> list[list[str]]:
    """Return table rows: per collective and size, torch, our first candidate (the ring; alltoall: direct), our
    best candidate and the calibrated choice."""
    table = []
    for collective in collectives:
        keys = [key for key in results if key[0] == collective.value]
        if not keys:
            continue
        chosen_rows = results[(CALIBRATED, collective.value)]
        ring_key = keys[0]
        for index, ring_row in enumerate(results[ring_key]):
            torch_us = ring_row.torch_time_us
            best_key = min(keys, key=lambda key: results[key][index].ours_time_us / results[key][index].torch_time_us)
            best = results[best_key][index]
            chosen = chosen_rows[index]
            table.append(
                [
                    str(world),
                    collective.value,
                    format_size(ring_row.size_bytes),
                    f"{torch_us:.0f}",
                    f"{ring_row.ours_time_us:.0f}",
                    f"{ring_row.speedup:.2f}x",
                    best_key[1],
                    f"{best.ours_time_us:.0f}",
                    f"{best.speedup:.2f}x",
                    "gloo" if chosen.algorithm == "torch" else chosen.algorithm,
                    f"{chosen.ours_time_us:.0f}",
                    f"{chosen.speedup:.2f}x",
                ]
            )
    return table


def overhead_rows() -> list[list[str]]:
    rows = []
    for collective, n in ((Collective.ALLGATHER, 8), (Collective.ALLREDUCE, 8), (Collective.ALLREDUCE, 16)):
        for algorithm in (ring_algorithm(collective, n), direct_algorithm(collective, n)):
            per_round_us, per_message_us = executor_overhead_us(algorithm)
            rows.append([algorithm.name, str(n), f"{per_round_us:.1f}", f"{per_message_us:.1f}"])
    return rows


def write_section(args: argparse.Namespace, load: str, main_table: str, overhead: str) -> None:
    """Write the ``runtime`` section of BENCHMARKS.md from its tables; ``load`` says how busy the machine was."""
    body = (
        f"Local gloo ranks on loopback, {os.cpu_count()} CPU cores ({load}: "
        "other work on the machine shows up as noise); float32; the median over "
        f"{args.iters} iterations of the "
        "slowest rank's time, ours and gloo's timed alternately on the same group (x > 1: we are faster). "
        "ring = one-channel ring in rank order (allreduce: reduce-scatter then allgather, in place); best = the "
        "fastest "
        "of the ring, the ring with two chunks per rank, the direct all-pairs schedule"
        + (
            ""
            if args.no_shipped
            else ", the shipped algorithms and the baselines of the built-in machines with that many GPUs"
        )
        + ". gloo_us is gloo's time paired with the ring; "
        "each ratio "
        "divides the gloo time measured alternately with that algorithm by the algorithm's own. chosen = what a "
        "Communicator on the ring library runs after `Communicator.calibrate` on the same group (the ring, or "
        "gloo's own unless the ring measured more than 5% faster: `taccl_py.runtime.communicator.calibration`), "
        "timed in a second pass.\n\n"
        f"```\n{main_table}\n```\n\n"
        "Our side runs as the Communicator runs it on gloo: receives posted a round early, messages cut into 1 MB "
        "segments, each reduced as it arrives and forwarded at once.\n\n"
        "Executor cost per round and per message, measured over a transport that moves nothing (one element per "
        "chunk): "
        "the Python replay loop, its bookkeeping and the torch calls, without any communication.\n\n"
        f"```\n{overhead}\n```\n"
    )
    update_benchmarks_section("runtime", "Runtime: our collectives over gloo against gloo's own", _command(args), body)


def _command(args: argparse.Namespace) -> str:
    """Return the command line that reproduces this run."""
    return (
        "python scripts/bench_runtime.py"
        + (f" --ranks {args.ranks}" if args.ranks != "4,8" else "")
        + (f" --sizes {args.sizes}" if args.sizes != DEFAULT_SIZES else "")
        + (f" --collectives {args.collectives}" if args.collectives != DEFAULT_COLLECTIVES else "")
        + (" --no-shipped" if args.no_shipped else "")
    )


def write_alltoall_section(args: argparse.Namespace, load: str, table: str) -> None:
    """Write the ``runtime-alltoall`` section of BENCHMARKS.md; ``load`` says how busy the machine was."""
    body = (
        f"Local gloo ranks on loopback, {os.cpu_count()} CPU cores ({load}: other work on the machine shows up "
        f"as noise); float32; size = each rank's input (nccl-tests convention); the median over {args.iters} "
        "iterations of the slowest rank's time, ours (`Communicator.all_to_all`) and gloo's `all_to_all_single` "
        "timed alternately on the same group (x > 1: we are faster). direct = every rank sends each peer its "
        "block, peers by offset, all posted at once; best = the fastest of direct and direct with two chunks per "
        "block"
        + ("" if args.no_shipped else " and the baselines of the built-in machines with that many GPUs")
        + ". chosen = what a Communicator on the direct schedule runs after `Communicator.calibrate` on the same "
        "group (direct, or gloo's own unless direct measured more than 5% faster), timed in a second pass.\n\n"
        f"```\n{table}\n```\n"
    )
    title = "Runtime: all_to_all over gloo against gloo's own all_to_all_single"
    update_benchmarks_section("runtime-alltoall", title, _command(args), body)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__, full_doc=True)
    parser.add_argument("--ranks", default="4,8", help="world sizes to run (default 4,8)")
    add_sizes_argument(parser, DEFAULT_SIZES)
    parser.add_argument("--iters", type=int, default=7, help="timed iterations per size (default 7)")
    add_collectives_argument(parser, DEFAULT_COLLECTIVES, what="collectives to time")
    parser.add_argument(
        "--no-shipped",
        action="store_true",
        help="time only the rings and the direct schedule, not the shipped libraries and baselines (faster)",
    )
    add_no_write_argument(parser, "BENCHMARKS.md")
    args = parser.parse_args(argv)
    sizes = parse_sizes(args.sizes)
    collectives = tuple(Collective(name) for name in split_names(args.collectives))
    load_at_start = os.getloadavg()[0]
    table: list[list[str]] = []
    for world in (int(text) for text in args.ranks.split(",")):
        log(f"{world} ranks ...")
        options = (sizes, args.iters, not args.no_shipped, collectives)
        results = run_local(bench_worker, world, options, timeout_s=3600)[0]
        table += summarize(world, results, collectives)
    load = f"1-minute load average {load_at_start:.1f} at the start"
    headers = ["ranks", "collective", "size", "gloo_us", "ring_us", "ring_vs_gloo", "best", "best_us", "best_vs_gloo"]
    headers += ["chosen", "chosen_us", "chosen_vs_gloo"]
    main_rows = [row for row in table if row[1] != Collective.ALLTOALL.value]
    alltoall_rows = [row for row in table if row[1] == Collective.ALLTOALL.value]
    if main_rows:
        main_table = text_table(headers, main_rows)
        overhead = text_table(["algorithm", "ranks", "us_per_round", "us_per_message"], overhead_rows())
        print(main_table, overhead, sep="\n\n")
        if not args.no_write:
            write_section(args, load, main_table, overhead)
    if alltoall_rows:
        alltoall_headers = [h.replace("ring", "direct") for h in headers]
        alltoall_table = print_table(alltoall_headers, alltoall_rows)
        if not args.no_write:
            write_alltoall_section(args, load, alltoall_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
