"""Run MSCCL++ execution plans through MSCCL++'s own executor and check every rank's output exactly.

    python3 scripts/mscclpp_executor/run_plans.py BUILD PLAN.json [PLAN.json ...]

BUILD holds ``run_plan``: our driver ``run_plan.cc`` compiled against a build of MSCCL++'s core library,
which the repository does not carry (build MSCCL++ as its own docs say); this imports taccl_py from the repository.
Each plan runs with one ``run_plan`` process per rank, rank r on GPU r mod the GPU count (it ran
with every rank on one GPU), at sizes frameworks pass (powers of two, 3, 25 and 100 MiB) inside its
range: the smallest, the nearest 1 MiB and the largest up to ``LARGEST_RUN_BYTES``. A plan whose
executor would refuse such a size (``taccl_py.mscclpp.sizes``: a PyTorch job's call would fail)
fails without running. Ranks meet over MSCCL++'s TCP bootstrap and share memory through CUDA IPC.
The first call's output and that of a call after ``MORE_CALLS`` more (on a cleared output, the
input restored; an LL plan's packet flags and scratch half have moved on) are both checked. Inputs
are small random integers in float32, so every order of reduction gives the same bits; the
expected output is the collective's definition, computed with numpy. The per-call time
``run_plan`` prints is not a speed when ranks share a GPU: their kernels take turns.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for taccl_py
from taccl_py.mscclpp.parse import parse_mscclpp_plan  # noqa: E402
from taccl_py.mscclpp.sizes import acceptance_rule, framework_sizes, refused_sizes  # noqa: E402

TIMEOUT_S = 40  # per plan and size: every rank's process, set-up included
MORE_CALLS = 5  # calls after the checked one (reusing the plan's connections), timed by run_plan
LARGEST_RUN_BYTES = 64 << 20  # every rank's data is made on the host, ranks may share one GPU
MIDDLE_BYTES = 1 << 20
SHOWN = 4  # refused sizes named


def message_sizes(text: str, name: str) -> tuple[int, ...]:
    """Return the sizes (bytes, ascending) to run the plan ``text`` at, from the framework sizes in its range.

    The smallest, the nearest ``MIDDLE_BYTES`` and the largest up to ``LARGEST_RUN_BYTES`` (the
    smallest alone where all are larger). Raises ValueError where MSCCL++'s executor refuses a
    framework size in the range (``checkMessageSize``), or where the range holds none.
    """
    plan = parse_mscclpp_plan(text, name)
    rule = acceptance_rule(plan)  # its max_bytes: the plan's, at most where offsets would wrap
    sizes = framework_sizes(plan.min_message_size, rule.max_bytes)
    if refused := refused_sizes(plan, sizes):
        shown = ", ".join(map(str, refused[:SHOWN])) + (", ..." if len(refused) > SHOWN else "")
        raise ValueError(f"{name}: MSCCL++ refuses {len(refused)} sizes frameworks pass ({shown}): {rule.describe()}")
    if not sizes:
        raise ValueError(f"{name}: no size frameworks pass in [{plan.min_message_size}, {rule.max_bytes}] bytes")
    runnable = [size for size in sizes if size <= LARGEST_RUN_BYTES] or [sizes[0]]
    middle = min(runnable, key=lambda size: abs(size - MIDDLE_BYTES))
    return tuple(sorted({runnable[0], middle, runnable[-1]}))


def collective_data(collective: str, ranks: int, size: int, seed: int = 7) -> tuple[list, list]:
    """Return (each rank's float32 input, each rank's expected output) for a message of ``size`` bytes."""
    rng = np.random.default_rng(seed)
    elements = size // 4
    if collective == "allgather":
        inputs = [rng.integers(-8, 8, elements // ranks).astype(np.float32) for _ in range(ranks)]
        return inputs, [np.concatenate(inputs)] * ranks
    if collective not in ("reducescatter", "allreduce"):
        raise ValueError(f"collective {collective!r} is not checked here")
    inputs = [rng.integers(-8, 8, elements).astype(np.float32) for _ in range(ranks)]
    total = np.sum(inputs, axis=0)
    return inputs, list(np.split(total, ranks)) if collective == "reducescatter" else [total] * ranks


def buffer_offsets(collective: str, inplace: bool, rank: int, input_bytes: int, output_bytes: int) -> tuple[int, int]:
    """Return (send, receive) byte offsets in one buffer for an in-place call; (-1, -1) out of place."""
    if not inplace:
        return -1, -1
    if collective == "allgather":
        return rank * input_bytes, 0
    if collective == "reducescatter":
        return 0, rank * output_bytes
    return 0, 0


def run_plan_file(build: Path, path: Path) -> bool:
    """Run one plan on every rank at each of ``message_sizes``, one line each; return whether all are exact."""
    text = path.read_text()
    try:
        sizes = message_sizes(text, path.name)
    except ValueError as error:
        print(f"{error}: NOT RUN")
        return False
    return all([_run_at(build, path, json.loads(text), size) for size in sizes])


def _run_at(build: Path, path: Path, plan: dict, size: int) -> bool:
    """Run ``plan`` on every rank at ``size`` bytes; print one line; return whether every rank's output is exact."""
    ranks, collective, inplace = len(plan["gpus"]), plan["collective"], plan["inplace"]
    inputs, expected = collective_data(collective, ranks, size)
    work = Path(tempfile.mkdtemp())
    started, procs = time.time(), []
    for rank in range(ranks):
        inputs[rank].tofile(work / f"in{rank}")
        send, recv = buffer_offsets(collective, inplace, rank, inputs[rank].nbytes, expected[rank].nbytes)
        args = [build / "run_plan", path, rank, ranks, work / "id", work / f"in{rank}", work / f"out{rank}"]
        args += [expected[rank].nbytes, send, recv, MORE_CALLS]
        command = [str(a) for a in args]
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=max(1.0, TIMEOUT_S - (time.time() - started)))[0])
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            print(f"{path.name}: {size} bytes: TIMEOUT after {TIMEOUT_S} s")
            return False
    if any(proc.returncode for proc in procs):
        print(f"{path.name}: {size} bytes: FAILED\n" + "\n".join(out[-2000:] for out in outputs))
        return False
    wrong = [
        r
        for r in range(ranks)
        if not all(
            np.array_equal(np.fromfile(work / name, np.float32), expected[r]) for name in (f"out{r}", f"out{r}.last")
        )
    ]
    timing = next((line for out in outputs for line in out.splitlines() if line.startswith("rank 0:")), "")
    placement = "in place" if inplace else "out of place"
    verdict = "EXACT" if not wrong else f"WRONG on ranks {sorted(set(wrong))}"
    took = f"{time.time() - started:.1f} s"
    print(f"{path.name}: {collective} {placement}, {ranks} ranks, {size} bytes: {verdict} ({took}; {timing})")
    return not wrong


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    results = [run_plan_file(Path(argv[0]), Path(path)) for path in argv[1:]]
    print(f"{sum(results)} of {len(results)} plans exact")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
