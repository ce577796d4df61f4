"""all_gather_single (all_gather_into_tensor) with a fresh output tensor every call: ``taccl`` against a gloo group.

Runs ``--ranks`` local gloo processes (8 by default, as the shipped NDv2 libraries need). Each
initialises the ``taccl`` backend on the shipped ``ndv2`` library with calibration off (so a size
with an algorithm is routed, never handed to gloo after a timing) and makes a plain gloo group
beside it. Batches of ``--calls`` calls at ``--size`` (the gathered output; as nccl-tests counts an
all-gather) alternate between the two groups, ``--repeats`` times, each batch with a new output
tensor per call ("fresh", as FSDP2 allocates its all-gather outputs) or one output for all calls
("persistent"); a batch's time is the slowest rank's. The table gives the median batch's time per
call, the ratio to gloo (of the medians, and of each group's fastest batch), and how many of the
taccl group's calls were routed (``group.routed``), so a ratio near 1 is not that of a call handed
to gloo. A second table gives the host time per call of binding the algorithm's executor to
tensors (median over ranks of the per-rank median): a fresh pair now (views sliced from the
index-space binding made once per aliasing form), the same pair again (a cache hit), and a full
bind (index space, then views: what every call with fresh tensors paid before the index-space
binding was kept).

    python scripts/bench_fresh_tensors.py
    python scripts/bench_fresh_tensors.py --size 4MB --calls 30 --repeats 5
"""

from __future__ import annotations

import datetime
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench_harness import argument_parser, log, print_table

from taccl_py.runtime.launch import run_local
from taccl_py.units import format_size, parse_sizes

RANKS = 8
SIZE = "1MB"
CALLS = 30
REPEATS = 3
WARMUP_CALLS = 3
LIBRARY = "ndv2"
#: Join deadline for the ranks (seconds): 8 ranks share 2 slow cores here.
JOIN_TIMEOUT_S = 900.0
#: Host-time samples of each binding step per rank.
BIND_SAMPLES = 30


def _batch_s(group: Any, gloo: Any, output_numel: int, data: Any, calls: int, fresh: bool) -> float:
    """Return the slowest rank's seconds for ``calls`` all-gathers on ``group`` (all ranks start together)."""
    import torch
    import torch.distributed as dist

    output = torch.empty(output_numel)
    dist.barrier(group=gloo)
    start = time.perf_counter()
    for _ in range(calls):
        if fresh:
            output = torch.empty(output_numel)
        dist.all_gather_single(output, data, group=group)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=gloo)
    return float(elapsed.item())


def _bind_times_us(rank: int, world_size: int, size_bytes: int) -> dict[str, Any]:
    """Return this rank's median host time (µs) of each binding step for the algorithm a call of ``size_bytes`` runs."""
    import torch

    from taccl_py.ir.collectives import Collective
    from taccl_py.ir.library import read_library, shipped_library_paths
    from taccl_py.runtime.executor import Executor
    from taccl_py.runtime.executor.binding import DEFAULT_SEGMENT_BYTES
    from taccl_py.runtime.executor.binding_cache import unowned_alias
    from taccl_py.runtime.executor.call_binding import bind_index_space, call_form

    libraries = [read_library(path) for path in shipped_library_paths(LIBRARY, 1)]
    library = next(lib for lib in libraries if lib.collective is Collective.ALLGATHER)
    algorithm = library.select(size_bytes)
    numel = size_bytes // 4 // world_size
    # as the Communicator makes it on gloo (a transport that matches every message on its own)
    executor = Executor(
        algorithm, rank, torch.float32, numel, prepost_receives=True, segment_bytes=DEFAULT_SEGMENT_BYTES
    )
    data = torch.randn(numel)
    samples: dict[str, list[float]] = {"fresh": [], "same": [], "full": []}
    for _ in range(BIND_SAMPLES):
        output = torch.empty(numel * world_size)
        start = time.perf_counter()
        executor._binding(output, data)
        samples["fresh"].append(time.perf_counter() - start)
        start = time.perf_counter()
        executor._binding(output, data)
        samples["same"].append(time.perf_counter() - start)
        start = time.perf_counter()
        form = call_form(executor.plan, executor._layout, output, data)
        indexed = bind_index_space(executor.plan, executor._layout, form, executor._scratch, torch.float32, "cpu")
        indexed.bind(unowned_alias(output), unowned_alias(data))
        samples["full"].append(time.perf_counter() - start)
    result: dict[str, Any] = {name: statistics.median(values) * 1e6 for name, values in samples.items()}
    result["algorithm"] = algorithm.name
    return result


def _rank_main(rank: int, world_size: int, size_bytes: int, calls: int, repeats: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from taccl_py.runtime.backend import register_backend

    register_backend(library=LIBRARY, calibration=False)
    dist.init_process_group("taccl", init_method="env://", timeout=datetime.timedelta(seconds=300))
    taccl, gloo = dist.group.WORLD, dist.new_group(backend="gloo")
    numel = size_bytes // 4 // world_size
    data = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    ours, theirs = torch.empty(numel * world_size), torch.empty(numel * world_size)
    dist.all_gather_single(ours, data)
    dist.all_gather_single(theirs, data, group=gloo)
    same = bool(torch.equal(ours, theirs))
    for group in (taccl, gloo):  # connections, executors, the first bind
        _batch_s(group, gloo, numel * world_size, data, WARMUP_CALLS, fresh=True)
    routed_before = taccl.routed["allgather"]
    batches: dict[tuple[str, str], list[float]] = {}
    for repeat in range(repeats):
        order = ((taccl, "taccl"), (gloo, "gloo")) if repeat % 2 == 0 else ((gloo, "gloo"), (taccl, "taccl"))
        for fresh in (True, False):
            for group, name in order:
                seconds = _batch_s(group, gloo, numel * world_size, data, calls, fresh)
                batches.setdefault(("fresh" if fresh else "persistent", name), []).append(seconds)
    routed = taccl.routed["allgather"] - routed_before
    dist.barrier(group=gloo)
    binds = _bind_times_us(rank, world_size, size_bytes)
    return {"batches": batches, "routed": routed, "same": same, "binds": binds}


def run_benchmark(size_bytes: int, calls: int, repeats: int, ranks: int) -> tuple[list[tuple], list[tuple]]:
    """Return the rows of the call-time table and of the bind-time table."""
    results = run_local(_rank_main, ranks, (size_bytes, calls, repeats), backend=None, timeout_s=JOIN_TIMEOUT_S)
    first = results[0]  # every rank holds the slowest rank's batch times
    taccl_calls = 2 * repeats * calls
    rows = []
    for output in ("fresh", "persistent"):
        batches = {name: first["batches"][(output, name)] for name in ("taccl", "gloo")}
        per_call = {name: statistics.median(found) / calls * 1e3 for name, found in batches.items()}
        best = {name: min(found) / calls * 1e3 for name, found in batches.items()}
        rows.append(
            (
                format_size(size_bytes),
                output,
                f"{per_call['taccl']:.2f}",
                f"{per_call['gloo']:.2f}",
                f"{per_call['taccl'] / per_call['gloo']:.2f}x",
                f"{best['taccl'] / best['gloo']:.2f}x",
                f"{first['routed']}/{taccl_calls}",
                "yes" if all(r["same"] for r in results) else "NO",
            )
        )
    binds = [r["binds"] for r in results]
    bind_rows = [
        (
            first["binds"]["algorithm"],
            f"{statistics.median(b['full'] for b in binds):.0f}",
            f"{statistics.median(b['fresh'] for b in binds):.0f}",
            f"{statistics.median(b['same'] for b in binds):.1f}",
        )
    ]
    return rows, bind_rows


HEADERS = ("size", "output", "taccl ms/call", "gloo ms/call", "taccl/gloo", "best/best", "routed", "equal")
BIND_HEADERS = ("algorithm", "full bind µs", "fresh pair µs", "same pair µs")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--size", default=SIZE, help=f"all-gather output size (default {SIZE})")
    parser.add_argument("--calls", type=int, default=CALLS, help=f"calls per timed batch (default {CALLS})")
    parser.add_argument(
        "--repeats", type=int, default=REPEATS, help=f"batches per group and output (default {REPEATS})"
    )
    parser.add_argument("--ranks", type=int, default=RANKS, help=f"local gloo ranks (default {RANKS})")
    args = parser.parse_args(argv)
    (size_bytes,) = parse_sizes(args.size)
    log(f"{args.ranks} ranks, {format_size(size_bytes)}, {args.repeats} x {args.calls} calls per variant")
    rows, bind_rows = run_benchmark(size_bytes, args.calls, args.repeats, args.ranks)
    print_table(HEADERS, rows)
    print()
    print_table(BIND_HEADERS, bind_rows)
    log(f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} after the run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
