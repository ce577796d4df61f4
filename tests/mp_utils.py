"""Multi-process test harness: N gloo ranks on loopback, a join deadline, failures named by rank.

Built on :func:`taccl_py.runtime.launch.launch_local` (TCPStore on 127.0.0.1 port 0, fork-server
children). Tests run many cases inside one launch: a worker loops over its cases and returns the
mismatches it found, so one spawn of N ranks covers a whole sweep.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from taccl_py.runtime.launch import RankOutcome, launch_local

__all__ = [
    "JOIN_TIMEOUT_S",
    "DTYPE_NAMES",
    "Case",
    "assert_no_mismatches",
    "check_executor_cases",
    "compare",
    "launch_ranks",
    "random_input",
    "require_gloo",
    "run_ranks",
    "torch_collective",
]

#: Join deadline for a multi-process test (seconds): only a hung test waits this long; generous so
#: that 8 ranks on 2 busy cores never trip it.
JOIN_TIMEOUT_S = 180.0


def require_gloo() -> None:
    """Skip the calling test, with the reason, when torch.distributed has no gloo backend."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")


def launch_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = JOIN_TIMEOUT_S,
    pg_timeout_s: float = 60.0,
    backend: str | None = "gloo",
) -> list[RankOutcome]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return every outcome.

    With ``backend=None`` the ranks get torchrun's environment but no initialised group.
    """
    require_gloo()
    return launch_local(fn, world_size, args, timeout_s=timeout_s, pg_timeout_s=pg_timeout_s, backend=backend)


def run_ranks(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = JOIN_TIMEOUT_S, backend: str | None = "gloo"
) -> list[Any]:
    """Run ``fn`` on ``world_size`` gloo ranks and return their values; fail naming each failed rank."""
    outcomes = launch_ranks(fn, world_size, *args, timeout_s=timeout_s, backend=backend)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        report = "\n".join(
            f"--- rank {o.rank} of {world_size} failed (exit code {o.exitcode}):\n{o.error}" for o in failed
        )
        pytest.fail(f"{len(failed)} of {world_size} ranks failed:\n{report}", pytrace=False)
    return [o.value for o in outcomes]


def assert_no_mismatches(per_rank: Sequence[Sequence[str]]) -> None:
    """Fail listing every (rank, case) mismatch the workers returned."""
    problems = [f"rank {rank}: {text}" for rank, texts in enumerate(per_rank) for text in texts]
    if problems:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        pytest.fail(f"{len(problems)} mismatches against torch.distributed:\n  {shown}{more}", pytrace=False)


# -- comparing our collectives with torch.distributed's, inside the ranks -----------------------

DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64", "int32", "int64")


@dataclass(frozen=True)
class Case:
    """One run of an algorithm: shard length ``numel`` of ``dtype`` reduced with ``op``.

    ``algorithm`` is the Algorithm to run (or just a label when a Communicator chooses).
    ``real`` draws normal values compared with a tolerance; otherwise small random integers
    (in -8..8) whose sums are exact in every dtype, compared exactly.
    """

    algorithm: Any
    dtype: str
    numel: int
    op: str = "sum"
    seed: int = 0
    real: bool = False
    segment_bytes: int | None = None  # executor's message segment size (None: whole messages)

    def label(self) -> str:
        name = getattr(self.algorithm, "name", self.algorithm)
        real = " real" if self.real else ""
        segments = f" segments of {self.segment_bytes} B" if self.segment_bytes else ""
        return f"{name} {self.dtype} numel={self.numel} op={self.op}{real}{segments}"


def random_input(case: Case, rank: int, numel: int) -> Any:
    """Return rank ``rank``'s input for ``case``: seeded per (case, rank), never zeros."""
    import torch

    generator = torch.Generator().manual_seed(case.seed * 7919 + rank * 104729 + numel)
    dtype = getattr(torch, case.dtype)
    if case.real:
        return torch.randn(numel, generator=generator, dtype=torch.float64).to(dtype)
    return torch.randint(-8, 9, (numel,), generator=generator).to(dtype)


def torch_collective(collective: str, input: Any, op: str, world_size: int) -> Any:
    """Return torch.distributed's result of ``collective`` on the default group (avg: sum, then divide)."""
    import torch

    from taccl_py.ir.collectives import Collective
    from taccl_py.runtime.executor.native import native_collective

    if collective == "allgather":
        output = torch.empty(input.numel() * world_size, dtype=input.dtype)
    elif collective == "reducescatter":
        output = torch.empty(input.numel() // world_size, dtype=input.dtype)
    elif collective == "allreduce":
        output = input.clone()  # reduced in place
    else:
        output = torch.empty_like(input)
    native_collective(Collective(collective), output, input, op, None)
    return output


def compare(case: Case, ours: Any, reference: Any) -> str | None:
    """Return a description of how ``ours`` differs from ``reference``, or None when they agree."""
    import torch

    if ours.shape != reference.shape or ours.dtype != reference.dtype:
        return (
            f"{case.label()}: shape/dtype {tuple(ours.shape)} {ours.dtype}, "
            f"torch {tuple(reference.shape)} {reference.dtype}"
        )
    if case.real:
        tolerance = {"float32": 1e-5, "float64": 1e-12}.get(case.dtype, 1e-2)
        good = torch.allclose(ours.double(), reference.double(), rtol=tolerance, atol=tolerance * 10)
    else:
        good = torch.equal(ours, reference)
    if good:
        return None
    bad = (ours != reference).nonzero().flatten()
    first = int(bad[0])
    return (
        f"{case.label()}: {bad.numel()} of {ours.numel()} elements differ, "
        f"first at {first}: ours {ours[first].item()} torch {reference[first].item()}"
    )


def check_executor_cases(rank: int, world_size: int, cases: Sequence[Case], timeout_s: float = 30.0) -> list[str]:
    """Worker: run each case with an Executor over gloo and with torch; return the mismatches."""
    import torch

    from taccl_py.runtime.executor import Executor, block_layout
    from taccl_py.runtime.transports.torch_dist import TorchDistTransport

    transport = TorchDistTransport()
    problems = []
    for case in cases:
        algorithm = case.algorithm
        in_blocks, out_blocks, _ = block_layout(algorithm.collective, world_size, algorithm.chunks_per_loop)
        data = random_input(case, rank, in_blocks * case.numel)
        keep = data.clone()
        output = torch.full((out_blocks * case.numel,), 99, dtype=data.dtype)
        executor = Executor(
            algorithm,
            rank,
            data.dtype,
            case.numel,
            prepost_receives=transport.independent_messages,
            segment_bytes=case.segment_bytes,
        )
        executor.run(output, data, transport, case.op, timeout_s)
        if not torch.equal(data, keep):
            problems.append(f"{case.label()}: the input was modified")
        reference = torch_collective(algorithm.collective.value, keep, case.op, world_size)
        problem = compare(case, output, reference)
        if problem:
            problems.append(problem)
    return problems
