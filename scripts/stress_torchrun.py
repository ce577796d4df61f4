"""Run ``taccl bench`` under torchrun many times and count the runs that die, and how.

Issue 13 saw one of ten 4-rank torchrun ``bench`` runs die with SIGABRT and no message. This
repeats such a run (ring all-gather, reduce-scatter and all-reduce for N ranks, every size from
64 KB to 4 MB) and prints, per outcome, how many runs ended that way: a clean exit, an exit code,
or the signal that killed a rank as torchrun reports it.

    python scripts/stress_torchrun.py --runs 50 --nproc 4
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from taccl_py.ir.algorithm_json import write_algorithm  # noqa: E402
from taccl_py.ir.collectives import Collective  # noqa: E402
from taccl_py.runtime.measure.bench import ring_algorithm  # noqa: E402

#: How torchrun's failure summary names a rank killed by a signal ("exitcode  : -6 (pid: ...)").
_SIGNAL = re.compile(r"exitcode\s*:\s*-(\d+)")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _outcome(result: subprocess.CompletedProcess) -> str:
    """Return how one torchrun run ended: "ok", "signal N" (a rank killed by it) or "exit N"."""
    if result.returncode == 0:
        return "ok"
    killed = _SIGNAL.search(result.stderr)
    return f"signal {killed.group(1)}" if killed else f"exit {result.returncode}"


def stress(runs: int, nproc: int, timeout_s: float) -> collections.Counter:
    """Run the bench ``runs`` times on ``nproc`` ranks; return the count of each outcome."""
    outcomes: collections.Counter = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="taccl-stress-") as folder:
        files = []
        for collective in (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE):
            path = Path(folder) / f"ring-{collective.value}.json"
            write_algorithm(ring_algorithm(collective, nproc), str(path))
            files.append(str(path))
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        command += ["-m", "taccl_py", "bench", "--library", *files, "--sizes", "64KB-4MB", "--iters", "3"]
        for run in range(1, runs + 1):
            start = time.perf_counter()
            try:
                result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
                outcome = _outcome(result)
            except subprocess.TimeoutExpired:
                result, outcome = None, "hung"
            outcomes[outcome] += 1
            _log(f"run {run}/{runs}: {outcome} ({time.perf_counter() - start:.1f} s)")
            if outcome != "ok" and result is not None:
                _log(result.stderr[-2000:])
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="torchrun runs (default 50)")
    parser.add_argument("--nproc", type=int, default=4, help="ranks per run (default 4)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="a run taking longer counts as hung")
    args = parser.parse_args(argv)
    outcomes = stress(args.runs, args.nproc, args.timeout_s)
    for outcome, count in sorted(outcomes.items()):
        print(f"{outcome:<10} {count:>4} of {args.runs}")
    return 0 if outcomes["ok"] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
