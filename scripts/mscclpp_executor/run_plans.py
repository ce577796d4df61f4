"""Run MSCCL++ execution plans through MSCCL++'s own executor and check every rank's output exactly.

    python3 scripts/mscclpp_executor/run_plans.py BUILD PLAN.json [PLAN.json ...]

BUILD holds ``run_plan`` (``build.sh`` makes it). Each plan runs with one ``run_plan`` process
per rank, rank r on GPU r mod the GPU count (it ran with every rank on one GPU), at a message size
inside the plan's band that its chunks split evenly; ranks meet over MSCCL++'s TCP bootstrap and
share memory through CUDA IPC. The first call's output and that of a call after ``MORE_CALLS`` more
(on a cleared output, the input restored; an LL plan's packet flags and scratch half have moved on)
are both checked. Inputs are small random integers in float32, so every order of reduction gives
the same bits; the expected output is the collective's definition, computed with numpy. The
per-call time ``run_plan`` prints is not a speed when ranks share a GPU: their kernels take turns.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TIMEOUT_S = 40  # per plan: every rank's process, set-up included
MORE_CALLS = 5  # calls after the checked one (reusing the plan's connections), timed by run_plan


def message_bytes(plan: dict) -> int:
    """Return a message size (bytes) in the plan's band that passes MSCCL++'s ``checkMessageSize``.

    The size is the one MSCCL++ selects by (AllGather: the output, else the input); every
    buffer it implies must split into the plan's chunks of whole ``buffer_alignment`` units.
    """
    gpu, ranks, collective = plan["gpus"][0], len(plan["gpus"]), plan["collective"]
    input_share = ranks if collective == "allgather" else 1  # message bytes per input byte
    output_share = ranks if collective == "reducescatter" else 1
    unit = plan.get("buffer_alignment", 16) * math.lcm(
        gpu["input_chunks"] * input_share, gpu["output_chunks"] * output_share, ranks
    )
    low, high = plan.get("min_message_size", 0), plan.get("max_message_size", 1 << 62)
    size = max(unit, min(high, max(low, 1 << 20)) // unit * unit)
    if size < low:
        size += unit
    if not low <= size <= high:
        raise ValueError(f"{plan['name']}: no multiple of {unit} bytes in [{low}, {high}]")
    return size


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
    """Run one plan on every rank; print one line; return whether every rank's output is exact."""
    plan = json.loads(path.read_text())
    ranks, collective, inplace = len(plan["gpus"]), plan["collective"], plan["inplace"]
    size = message_bytes(plan)
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
            print(f"{path.name}: TIMEOUT after {TIMEOUT_S} s")
            return False
    if any(proc.returncode for proc in procs):
        print(f"{path.name}: FAILED\n" + "\n".join(out[-2000:] for out in outputs))
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
