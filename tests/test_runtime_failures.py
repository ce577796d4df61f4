"""Failures: a rank that dies or hangs mid-collective makes the others raise TransportError in time."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence

import pytest
import torch

from taccl_py.errors import TransportError
from taccl_py.ir.collectives import Collective
from taccl_py.runtime.communicator import Communicator
from taccl_py.runtime.launch import launch_local, run_local
from taccl_py.runtime.transports.interface import Message, Pending, Transport
from taccl_py.runtime.transports.torch_dist import TorchDistTransport

from helpers import ring_algorithm
from mp_utils import launch_ranks

TIMEOUT_S = 3.0
VICTIM = 2


class DyingTransport(Transport):
    """Delegates to gloo; on the victim rank the process exits when it posts round ``die_at``."""

    def __init__(self, die_at: int) -> None:
        self.inner = TorchDistTransport()
        self.rank, self.world_size, self.device, self.name = (
            self.inner.rank,
            self.inner.world_size,
            self.inner.device,
            "dying",
        )
        self.posts, self.die_at = 0, die_at

    def post(self, sends: Sequence[Message], recvs: Sequence[Message]) -> tuple[Sequence[Pending], Sequence[Pending]]:
        self.posts += 1
        if self.rank == VICTIM and self.posts == self.die_at:
            os._exit(7)  # die without cleanup, mid-collective
        return self.inner.post(sends, recvs)


def run_until_failure(comm: Communicator, world: int) -> tuple[str, float]:
    """Run all-reduces until one fails; return the error and the seconds the failing call took."""
    tensor = torch.ones(4096 * world)
    for _ in range(3):
        start = time.monotonic()
        try:
            comm.all_reduce(tensor)
        except TransportError as error:
            return str(error), time.monotonic() - start
    return "no failure", 0.0


def dying_worker(rank: int, world: int) -> tuple[str, float]:
    algorithm = ring_algorithm(Collective.ALLREDUCE, world, inplace=True)
    comm = Communicator(None, algorithm, transport=DyingTransport(die_at=3), timeout_s=TIMEOUT_S)
    return run_until_failure(comm, world)


def hanging_worker(rank: int, world: int) -> tuple[str, float]:
    comm = Communicator(None, ring_algorithm(Collective.ALLREDUCE, world, inplace=True), timeout_s=TIMEOUT_S)
    if rank == VICTIM:
        time.sleep(TIMEOUT_S + 3)  # alive but absent from the collective
        return "slept", 0.0
    return run_until_failure(comm, world)


def hanging_backend_worker(rank: int, world: int) -> tuple[str, float]:
    """As ``hanging_worker``, over the transport of the DDP hook and the taccl backend (a gloo backend object)."""
    import torch.distributed as dist

    from taccl_py.runtime.backend.work import BackendTransport

    group = dist.new_group(backend="gloo")
    link = BackendTransport(group._get_backend(torch.device("cpu")), torch.device("cpu"))
    algorithm = ring_algorithm(Collective.ALLREDUCE, world, inplace=True)
    comm = Communicator(group, algorithm, transport=link, timeout_s=TIMEOUT_S)
    if rank == VICTIM:
        time.sleep(TIMEOUT_S + 3)
        return "slept", 0.0
    return run_until_failure(comm, world)


def assert_survivors_failed_in_time(outcomes, victim_ok: bool) -> None:
    for outcome in outcomes:
        if outcome.rank == VICTIM:
            assert outcome.ok is victim_ok, outcome
            continue
        assert outcome.ok, f"rank {outcome.rank} crashed instead of raising TransportError:\n{outcome.error}"
        message, elapsed_s = outcome.value
        assert "ring_allreduce_4: rank" in message and "failed in round" in message, message
        # one timed-out wait, plus slack for a loaded machine (the call starts before its wait)
        assert elapsed_s < TIMEOUT_S + 4.0, f"rank {outcome.rank} took {elapsed_s:.1f} s to fail: {message}"


@pytest.mark.multiprocess
def test_a_rank_that_dies_mid_collective_fails_the_others_within_the_timeout() -> None:
    outcomes = launch_ranks(dying_worker, 4, timeout_s=60)
    assert "exited with code 7 without a result" in outcomes[VICTIM].error
    assert_survivors_failed_in_time(outcomes, victim_ok=False)


@pytest.mark.multiprocess
def test_a_rank_that_hangs_fails_the_others_within_the_timeout() -> None:
    outcomes = launch_ranks(hanging_worker, 4, timeout_s=60)
    assert_survivors_failed_in_time(outcomes, victim_ok=True)


@pytest.mark.multiprocess
def test_a_rank_that_hangs_fails_the_others_within_the_timeout_on_a_gloo_backend_object() -> None:
    outcomes = launch_ranks(hanging_backend_worker, 4, timeout_s=60)
    assert_survivors_failed_in_time(outcomes, victim_ok=True)


def raising_worker(rank: int, world: int) -> int:
    if rank == 1:
        raise ValueError("rank one gives up")
    return rank


def sleeping_worker(rank: int, world: int) -> int:
    if rank == 1:
        time.sleep(60)
    return rank


@pytest.mark.multiprocess
def test_the_launcher_names_the_rank_that_raised() -> None:
    with pytest.raises(TransportError, match=r"(?s)rank 1 of 2 failed:\n.*ValueError: rank one gives up"):
        run_local(raising_worker, 2, timeout_s=30)


@pytest.mark.multiprocess
def test_the_launcher_stops_a_rank_past_the_join_deadline() -> None:
    # 15 s: long enough for rank 0 to start (fork server, torch) while the suite loads both cores (8 s
    # was not, once), far short of rank 1's 60 s
    start = time.monotonic()
    outcomes = launch_local(sleeping_worker, 2, timeout_s=15)
    assert time.monotonic() - start < 45
    assert outcomes[0].ok and outcomes[0].value == 0, outcomes[0].error
    assert not outcomes[1].ok and "did not finish within 15 s (terminated)" in outcomes[1].error
    if hasattr(signal, "SIGUSR1"):  # the hung rank's stacks say where it waited
        assert "its threads when stopped:" in outcomes[1].error and "sleeping_worker" in outcomes[1].error
