"""Train a small tensor- and data-parallel model on the ``taccl`` backend's subgroups and on gloo's; compare.

    torchrun --nproc-per-node 8 scripts/train_3d.py --topology ndv2 --tp 4 --dp 2 [--steps 5] [--library DIR]
    python scripts/train_3d.py --nproc 8 --topology ndv2 --tp 4 --dp 2

The model is a few Megatron-style blocks, ``x + RowParallel(GELU(ColumnParallel(LayerNorm(x))))``,
then a LayerNorm, in float32: the column-parallel linear all-reduces its input's gradient over the
tensor-parallel (TP) group, the row-parallel one its output, and DDP all-reduces the gradients over
the data-parallel (DP) group. Groups follow Megatron's order (TP fastest, then DP;
``taccl_py.placement.parallel.parallel_groups``). The same model, seed and batches train twice: on
TP and DP groups of the ``taccl`` backend, which run the group libraries of ``--library`` (default:
rank 0 synthesizes all-reduce for every group and all-gather for the DP groups, as ``taccl
synthesize --parallel`` does, into a temporary folder), and on gloo groups; then unsharded on one
process, which checks the parallel model itself. Rank 0 ends with ``subgroup collectives routed: R
of T; max parameter difference: D`` (R: the taccl groups' calls that ran a taccl_py algorithm; T:
their all-reduce, all-gather, reduce-scatter and all-to-all calls; D: the largest parameter
difference between the taccl and gloo runs, over all ranks). The status is 1 when D, or the gloo
run's difference from the one-process run (then reported on stderr), is 1e-5 or more, or R != T
under ``--require-routed`` (the default); 2 for bad options.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from taccl_py.errors import ArgumentError, InputError, TacclError  # noqa: E402
from taccl_py.ir.collectives import Collective  # noqa: E402
from taccl_py.placement.parallel import parallel_groups  # noqa: E402

#: The two runs' parameters must agree within this (float32, a few SGD steps).
TOLERANCE = 1e-5
#: Model width, feed-forward width (a multiple of every --tp), blocks, rows per DP rank and step.
HIDDEN, FFN, BLOCKS, BATCH_PER_DP = 64, 256, 2, 8
LEARNING_RATE = 0.05
#: Sizes the default library is synthesized for: TP all-reduces are BATCH_PER_DP·HIDDEN·4 = 2 KB,
#: DDP's gradient buckets at most a rank's 70-135 KB of gradients; the first and last bands reach 0 and beyond.
LIBRARY_SIZES = "1KB-1MB"
#: How long a rank waits for a peer (seconds): the others wait while rank 0 synthesizes.
GROUP_TIMEOUT_S = 600.0
#: The collectives the taccl backend routes; T counts their calls.
ROUTED_KINDS = tuple(
    c.value for c in (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLTOALL)
)


@dataclass(frozen=True)
class Options:
    """What one run trains: the machine, the parallel layout, steps, the library folder (None: synthesize)."""

    topology: str
    nodes: int
    tp: int
    dp: int
    steps: int
    seed: int
    library: str | None


@dataclass(frozen=True)
class Summary:
    """The job's outcome, the same on every rank.

    ``routed`` and ``total`` subgroup calls; ``difference``: the largest parameter difference
    between the taccl and gloo runs; ``serial_difference``: between the gloo run and the same model
    trained unsharded on one process (whether the tensor and data parallelism are right).
    """

    routed: int
    total: int
    difference: float
    serial_difference: float

    def line(self) -> str:
        """Return the line rank 0 ends with."""
        return (
            f"subgroup collectives routed: {self.routed} of {self.total}; "
            f"max parameter difference: {self.difference:.3e}"
        )

    def passed(self, require_routed: bool) -> bool:
        """Return True when the runs agree within TOLERANCE (and, if required, every call was routed)."""
        agree = self.difference < TOLERANCE and self.serial_difference < TOLERANCE
        return agree and (self.routed == self.total or not require_routed)


# -- tensor parallelism (Megatron-LM's f and g operators) ----------------------------------------


class _CopyToGroup(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient over the TP group backward (Megatron's ``f``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromGroup(torch.autograd.Function):
    """All-reduce over the TP group forward; identity backward (Megatron's ``g``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def _shard_rows(tp_rank: int, tp: int) -> slice:
    """Return the feed-forward rows (of W1; columns of W2) that TP rank ``tp_rank`` of ``tp`` holds."""
    return slice(tp_rank * FFN // tp, (tp_rank + 1) * FFN // tp)


class ParallelBlock(torch.nn.Module):
    """``x + W2·GELU(W1·LayerNorm(x) + b1) + b2`` with W1 split by rows and W2 by columns over the TP group.

    ``group`` None: the whole block on one process (``tp`` 1), no collectives.
    """

    def __init__(self, full: dict[str, torch.Tensor], tp_rank: int, tp: int, group: Any) -> None:
        super().__init__()
        rows = _shard_rows(tp_rank, tp)
        self.group = group
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.w1 = torch.nn.Parameter(full["w1"][rows].clone())
        self.b1 = torch.nn.Parameter(full["b1"][rows].clone())
        self.w2 = torch.nn.Parameter(full["w2"][:, rows].clone())
        self.b2 = torch.nn.Parameter(full["b2"].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = self.norm(x)
        if self.group is not None:
            normed = _CopyToGroup.apply(normed, self.group)
        hidden = torch.nn.functional.linear(normed, self.w1, self.b1)
        out = torch.nn.functional.linear(torch.nn.functional.gelu(hidden), self.w2)
        if self.group is not None:
            out = _ReduceFromGroup.apply(out, self.group)
        return x + out + self.b2


def shard_parameters(serial: torch.nn.Module, tp_rank: int, tp: int) -> list[torch.Tensor]:
    """Return the unsharded model's parameters as TP rank ``tp_rank`` holds them, in ``parameters()`` order."""
    rows = _shard_rows(tp_rank, tp)
    shards = []
    for name, parameter in serial.named_parameters():
        if name.endswith(("w1", "b1")):
            shards.append(parameter.detach()[rows])
        elif name.endswith("w2"):
            shards.append(parameter.detach()[:, rows])
        else:
            shards.append(parameter.detach())
    return shards


def build_model(seed: int, tp_rank: int, tp: int, group: Any) -> torch.nn.Module:
    """Return the seeded model, this TP rank's shard of it: every rank draws the full weights, then slices."""
    generator = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(BLOCKS):
        full = {
            "w1": torch.randn(FFN, HIDDEN, generator=generator) / HIDDEN**0.5,
            "b1": torch.randn(FFN, generator=generator) * 0.1,
            "w2": torch.randn(HIDDEN, FFN, generator=generator) / FFN**0.5,
            "b2": torch.randn(HIDDEN, generator=generator) * 0.1,
        }
        blocks.append(ParallelBlock(full, tp_rank, tp, group))
    return torch.nn.Sequential(*blocks, torch.nn.LayerNorm(HIDDEN))


def train(model: torch.nn.Module, options: Options, rows: slice) -> None:
    """Run ``options.steps`` SGD steps on seeded global batches, of which this process takes ``rows``.

    A DP rank's slice, averaged by DDP over the DP group, gives the whole batch's mean gradient.
    """
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    generator = torch.Generator().manual_seed(options.seed + 1)
    for _ in range(options.steps):
        inputs = torch.randn(options.dp * BATCH_PER_DP, HIDDEN, generator=generator)
        targets = torch.randn(options.dp * BATCH_PER_DP, HIDDEN, generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs[rows]), targets[rows]).backward()
        optimizer.step()


# -- groups and libraries -------------------------------------------------------------------------


def check_options(options: Options, world_size: int) -> None:
    """Raise an InputError for an unknown --topology, a --library that is no folder, or a TP x DP layout that
    does not fit: each at least 2, TP a divisor of FFN, TP·DP the job's ``world_size`` and the topology's GPUs."""
    from taccl_py.topology import load_topology

    gpus = load_topology(options.topology, nodes=options.nodes).num_ranks
    if options.library is not None and not Path(options.library).is_dir():
        raise ArgumentError(options.library, "--library", "not a folder", "a folder of group libraries")
    if options.tp < 2 or options.dp < 2:
        raise ArgumentError("train_3d", "--tp/--dp", f"tp={options.tp}, dp={options.dp}", "both at least 2")
    if FFN % options.tp:
        raise ArgumentError("train_3d", "--tp", str(options.tp), f"a divisor of the model's width {FFN}")
    for what, ranks in (("the job's ranks", world_size), (f"{options.topology} x{options.nodes}'s GPUs", gpus)):
        if options.tp * options.dp != ranks:
            raise ArgumentError("train_3d", "--tp/--dp", f"tp·dp = {options.tp * options.dp}", f"{ranks} ({what})")


def synthesize_library(options: Options, folder: Path) -> None:
    """Write what ``taccl synthesize --parallel tp=..,dp=.. --sizes LIBRARY_SIZES -o folder`` writes per collective.

    Every group gets all-reduce; DP groups also all-gather, which DDP's constructor runs on its
    group to compare parameter shapes (torch/nn/parallel/distributed.py, _verify_param_shape_across_processes).
    """
    from taccl_py.synth import write_library
    from taccl_py.synth.groups import group_folder_name, synthesize_groups
    from taccl_py.synth.jobs import available_cores
    from taccl_py.topology import load_topology
    from taccl_py.units import parse_sizes

    topology = load_topology(options.topology, nodes=options.nodes)
    sizes = parse_sizes(LIBRARY_SIZES)
    # launch_local's ranks are daemon processes, which may not start a pool of solver processes
    jobs = 1 if multiprocessing.current_process().daemon else available_cores()
    for kind in parallel_groups({"tp": options.tp, "dp": options.dp}, topology.num_ranks):
        collectives = (Collective.ALLREDUCE, Collective.ALLGATHER) if kind.kind == "dp" else (Collective.ALLREDUCE,)
        for collective in collectives:
            for outcome in synthesize_groups(
                topology, collective, kind, machine=options.topology, sizes=sizes, jobs=jobs
            ):
                if outcome.library is None:
                    raise TacclError(
                        f"{kind.kind} groups {list(outcome.record.members)}: no {collective.value} library"
                    )
                target = folder / group_folder_name(outcome.record)
                target.mkdir(parents=True, exist_ok=True)
                write_library(outcome.library, target / f"{collective.value}.library.json")


def resolve_library(options: Options, scratch: Path | None) -> str:
    """Return the library folder every rank uses: ``--library``, or the one rank 0 synthesized into ``scratch``."""
    if options.library is not None:
        return options.library
    folder: list[str | None] = [None]
    if scratch is not None:  # rank 0
        synthesize_library(options, scratch)
        folder = [str(scratch)]
    dist.broadcast_object_list(folder, src=0)  # doubles as the barrier: the others wait for the files
    return str(folder[0])


def make_groups(options: Options, backend: str) -> tuple[Any, Any]:
    """Return this rank's TP and DP groups of ``backend``; every rank makes every group, in the same order."""
    rank = dist.get_rank()
    mine: dict[str, Any] = {}
    for kind in parallel_groups({"tp": options.tp, "dp": options.dp}, dist.get_world_size()):
        for ranks in kind.groups:
            group = dist.new_group(list(ranks), backend=backend, timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
            if rank in ranks:
                mine[kind.kind] = group
    return mine["tp"], mine["dp"]


def count_calls(groups: Sequence[Any]) -> tuple[int, int]:
    """Return (routed, total) calls of the four routed collectives on this rank's taccl ``groups``.

    ``new_group`` returns the TacclProcessGroup itself (torch keeps a backend that is a ProcessGroup).
    """
    from taccl_py.runtime.backend import TacclProcessGroup

    routed: Counter = Counter()
    total: Counter = Counter()
    for group in groups:
        if not isinstance(group, TacclProcessGroup):
            raise TacclError(f"{group!r} is not a taccl process group")
        routed.update(group.routed)
        total.update(group.routed + group.delegated)
    return sum(routed[k] for k in ROUTED_KINDS), sum(total[k] for k in ROUTED_KINDS)


# -- the job --------------------------------------------------------------------------------------


def run_rank(options: Options, scratch: Path | None) -> Summary:
    """Train on taccl groups, then on gloo groups; return the job's Summary (every rank gets the same).

    Call after ``init_process_group("taccl")``; ``scratch`` is rank 0's folder for the synthesized library.
    """
    from taccl_py.runtime.backend import BACKEND_NAME, register_backend

    rank = dist.get_rank()
    library = resolve_library(options, scratch)
    register_backend(library=library, topology=None, calibration=False)  # for the groups made from here on
    tp_rank, dp_rank = rank % options.tp, (rank // options.tp) % options.dp
    trained = []
    counts = (0, 0)
    for backend in (BACKEND_NAME, "gloo"):
        tp_group, dp_group = make_groups(options, backend)
        model = DDP(build_model(options.seed, tp_rank, options.tp, tp_group), process_group=dp_group)
        train(model, options, slice(dp_rank * BATCH_PER_DP, (dp_rank + 1) * BATCH_PER_DP))
        trained.append([p.detach().clone() for p in model.module.parameters()])
        if backend == BACKEND_NAME:
            counts = count_calls((tp_group, dp_group))
        del model  # the groups outlive the DDP reducer (pytorch/pytorch#56297)
    serial = build_model(options.seed, 0, 1, None)
    train(serial, options, slice(None))
    trained.append(shard_parameters(serial, tp_rank, options.tp))
    totals = torch.tensor(counts, dtype=torch.float64)
    dist.all_reduce(totals)
    worst = torch.tensor([_max_difference(trained[0], trained[1]), _max_difference(trained[1], trained[2])])
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return Summary(int(totals[0]), int(totals[1]), float(worst[0]), float(worst[1]))


def _max_difference(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> float:
    """Return the largest absolute difference between matching tensors of two parameter lists."""
    return max(float((a - b).abs().max()) for a, b in zip(first, second, strict=True))


def _init_and_run(options: Options) -> Summary:
    """Join the job as torchrun's environment says, on the taccl backend; run; return the Summary."""
    from taccl_py.runtime.backend import BACKEND_NAME, register_backend

    register_backend(calibration=False)  # the world group: no 8-rank library, every call on gloo
    dist.init_process_group(BACKEND_NAME, timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    synthesizes = options.library is None and dist.get_rank() == 0
    scratch = Path(tempfile.mkdtemp(prefix="taccl-train3d-")) if synthesizes else None
    try:
        return run_rank(options, scratch)  # its last all-reduce comes after every rank's last use of the files
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def local_rank_main(rank: int, world_size: int, options: Options) -> Summary:
    """The function ``--nproc`` runs on each local process (``launch_local`` set torchrun's environment)."""
    del rank, world_size  # read from the environment by init_process_group
    return _init_and_run(options)


def parse_args(argv: Sequence[str] | None) -> tuple[Options, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", required=True, help="built-in topology the libraries are made for, e.g. ndv2")
    parser.add_argument("--nodes", type=int, default=1, help="machines of --topology (default 1)")
    parser.add_argument("--tp", type=int, required=True, help="tensor-parallel group size")
    parser.add_argument("--dp", type=int, required=True, help="data-parallel group size")
    parser.add_argument("--steps", type=int, default=5, help="training steps per run (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and batches (default 0)")
    parser.add_argument(
        "--library", help="folder of group libraries (taccl synthesize --parallel -o DIR); default: synthesize"
    )
    parser.add_argument(
        "--require-routed",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fail unless every subgroup collective was routed (default on)",
    )
    parser.add_argument("--nproc", type=int, help="run on this many local processes instead of under torchrun")
    args = parser.parse_args(argv)
    options = Options(args.topology, args.nodes, args.tp, args.dp, args.steps, args.seed, args.library)
    return options, args


def main(argv: Sequence[str] | None = None) -> int:
    options, args = parse_args(argv)
    try:
        world_size = args.nproc if args.nproc is not None else int(os.environ.get("WORLD_SIZE", "0"))
        if world_size < 1:
            raise ArgumentError("train_3d", "launch", "no WORLD_SIZE", "torchrun --nproc-per-node N, or --nproc N")
        check_options(options, world_size)
        if args.nproc is not None:
            from taccl_py.runtime.launch import run_local

            timeouts = {"timeout_s": GROUP_TIMEOUT_S, "pg_timeout_s": GROUP_TIMEOUT_S}
            summary = run_local(local_rank_main, args.nproc, (options,), backend=None, **timeouts)[0]
        else:
            summary = _init_and_run(options)
            rank = dist.get_rank()
            dist.destroy_process_group()
            if rank != 0:
                return 0 if summary.passed(args.require_routed) else 1
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if summary.serial_difference >= TOLERANCE:
        print(f"error: the model differs from its one-process run by {summary.serial_difference:.3e}", file=sys.stderr)
    print(summary.line())
    return 0 if summary.passed(args.require_routed) else 1


if __name__ == "__main__":
    sys.exit(main())
