"""Train a small MLP with DDP five ways: default DDP, the taccl_py hook and backend (plain and calibrated).

    torchrun --nproc-per-node 4 scripts/ddp_example.py [--steps 20] [--width 256] [--library ring]

Every variant starts from the same seed and sees the same batches; their steps alternate. Rank 0 prints each variant's
median step time and the largest parameter difference from default DDP (over all ranks), and
whether they agree within 1e-6. ``--library ring`` (the default) runs taccl_py's ring schedules,
built for the world size on a uniform loopback topology; pass a ``*.library.json`` from
``taccl synthesize --sizes`` or a built-in topology name to run synthesized ones.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from taccl_py.baselines import ring_algorithm  # noqa: E402
from taccl_py.ir.collectives import Collective  # noqa: E402
from taccl_py.runtime.backend import BACKEND_NAME, register_backend  # noqa: E402
from taccl_py.runtime.ddp import register  # noqa: E402
from taccl_py.topology.model import Link, LinkKind, Vertex, VertexKind, make_topology  # noqa: E402

#: Parameters must agree with default DDP within this (fp32) to print "agree".
AGREEMENT = 1e-6
#: Steps run before timing starts (executor compilation, bucket rebuild).
WARMUP_STEPS = 3
BATCH, INPUTS, CLASSES = 32, 64, 10
VARIANTS = ("default DDP", "taccl hook", "taccl backend", "calibrated hook", "calibrated backend")


def ring_library(num_ranks: int) -> list[Any]:
    """Return ring all-reduce, all-gather and reduce-scatter for ``num_ranks`` ranks (one channel each).

    The topology is a uniform full mesh (the α and bandwidth only rank ring orders, and every
    order is alike here), so this runs anywhere the ranks can reach each other.
    """
    gpus = [Vertex(f"gpu{r}", VertexKind.GPU, local_index=r, rank=r) for r in range(num_ranks)]
    links = [
        Link(f"gpu{a}", f"gpu{b}", LinkKind.ETHERNET, 10.0, 1.0)
        for a in range(num_ranks)
        for b in range(num_ranks)
        if a != b
    ]
    topology = make_topology(f"loopback{num_ranks}", gpus, links, description="uniform full mesh for CPU runs")
    return [
        ring_algorithm(topology, c, channels=1)
        for c in (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER)
    ]


def resolve_library(spec: str, world_size: int) -> Any:
    """Return what ``--library`` names: ``ring`` builds ring schedules, anything else passes through."""
    return ring_library(world_size) if spec == "ring" else spec


def make_model(width: int, seed: int = 0) -> torch.nn.Module:
    """Return the seeded MLP ``INPUTS``-``width``-``width``-``CLASSES``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(INPUTS, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, CLASSES),
    )


def train_side_by_side(
    models: Sequence[torch.nn.Module], rank: int, steps: int
) -> list[tuple[torch.Tensor, list[float]]]:
    """Train every model with SGD on the same rank-seeded batches, one step of each in turn.

    Returns, per model, its flat parameters and each timed step (ms). Interleaving the steps
    spreads any change of machine load over all models alike.
    """
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.05) for model in models]
    generator = torch.Generator().manual_seed(1000 + rank)
    times_ms: list[list[float]] = [[] for _ in models]
    for step in range(WARMUP_STEPS + steps):
        x = torch.randn(BATCH, INPUTS, generator=generator)
        y = torch.randint(0, CLASSES, (BATCH,), generator=generator)
        for model, optimizer, times in zip(models, optimizers, times_ms):
            start = time.perf_counter()
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            if step >= WARMUP_STEPS:
                times.append((time.perf_counter() - start) * 1e3)
    return [
        (torch.cat([p.detach().reshape(-1) for p in model.parameters()]), times)
        for model, times in zip(models, times_ms)
    ]


def init_taccl(
    library: Any, *, store: Any = None, rank: int | None = None, world_size: int | None = None, timeout_s: float = 120.0
) -> None:
    """Register the taccl backend with ``library`` and make it the default group (env:// without a store)."""
    register_backend(library)
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        dist.init_process_group("taccl", timeout=timeout)
    else:
        dist.init_process_group("taccl", store=store, rank=rank, world_size=world_size, timeout=timeout)


def run_variants(rank: int, width: int, steps: int, library: Any, gloo: Any) -> dict[str, tuple[float, float]]:
    """Train every variant; return variant -> (largest parameter difference over ranks, median step ms).

    Call with the taccl group as the default group; the reference runs on the gloo group ``gloo``.
    Keep ``gloo`` alive until the DDP models on it are gone: a DDP reducer that drops the last
    reference to a gloo group destroys it while holding the GIL, which can deadlock
    (pytorch/pytorch#56297).
    """
    hooked_model = DDP(make_model(width), process_group=gloo)
    calibrated_model = DDP(make_model(width), process_group=gloo)
    # The calibrated variants time their all-reduce against gloo's own on their group first
    # (rank 0's file counts); the calibrated backend is a second taccl group, calibrated alone.
    calibrated_group = dist.new_group(backend=BACKEND_NAME)
    with tempfile.TemporaryDirectory(prefix="taccl-ddp-") as folder:
        calibrated_group.calibrate(Path(folder) / "backend.json", collectives=[Collective.ALLREDUCE])
        models = [
            DDP(make_model(width), process_group=gloo),
            hooked_model,
            DDP(make_model(width)),
            calibrated_model,
            DDP(make_model(width), process_group=calibrated_group),
        ]
        with (
            register(hooked_model, library=library),
            register(calibrated_model, library=library, calibration=Path(folder) / "hook.json"),
        ):
            trained = train_side_by_side(models, rank, steps)
    found = {}
    reference = trained[0][0]
    for name, (params, times_ms) in zip(VARIANTS, trained):
        summary = torch.tensor(
            [float((params - reference).abs().max()), statistics.median(times_ms)], dtype=torch.float64
        )
        dist.all_reduce(summary, op=dist.ReduceOp.MAX, group=gloo)  # the worst rank
        found[name] = (float(summary[0]), float(summary[1]))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per variant (default 20)")
    parser.add_argument("--width", type=int, default=256, help="hidden width of the MLP (default 256)")
    parser.add_argument(
        "--library", default="ring", help="'ring', a *.library.json, an algorithm file or a topology name"
    )
    args = parser.parse_args(argv)
    if "WORLD_SIZE" not in os.environ:
        parser.error("run under torchrun, e.g. torchrun --nproc-per-node 4 scripts/ddp_example.py")
    library = resolve_library(args.library, int(os.environ["WORLD_SIZE"]))
    init_taccl(library)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    results = run_variants(rank, args.width, args.steps, library, dist.new_group(backend="gloo"))
    if rank == 0:
        params = sum(p.numel() for p in make_model(args.width).parameters())
        print(
            f"{world_size} ranks, MLP width {args.width} ({params * 4 / 1e6:.2f} MB of fp32 gradients), {args.steps} "
            "timed steps"
        )
        for name, (difference, median_ms) in results.items():
            verdict = "" if name == VARIANTS[0] else ("  agree" if difference <= AGREEMENT else "  DIFFER")
            print(f"  {name:<18} {median_ms:8.2f} ms/step (median)   max |param - default| = {difference:.2e}{verdict}")
    agree = all(difference <= AGREEMENT for difference, _ in results.values())
    dist.destroy_process_group()
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
