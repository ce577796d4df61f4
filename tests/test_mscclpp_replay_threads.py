"""The MSCCL++ replay runs a control op's ids one per thread, as the executor does.

``handleWait``, ``handleSemAcquire``, ``handleFlush``, ``handleSignal``, ``handleSemRelease`` and a
port put run id i on thread i (``if (tid < n)``, execution_kernel.hpp) with no ``__syncthreads``:
after ``sem_acquire [0, 1]`` thread 0 has semaphore 0 and goes on while thread 1 may still wait for
semaphore 1; only a ``nop`` (or ``barrier``) makes every thread wait. Each plan here is a 2-GPU
AllGather whose forwarding op relies on the second id's producer: refused without the nop, verified
with it.
"""

from __future__ import annotations

import json

import pytest
from test_simulate import full_mesh

from taccl_py.errors import VerificationError
from taccl_py.mscclpp import check_mscclpp_plan, parse_mscclpp_plan, verify_mscclpp_plan
from taccl_py.mscclpp.simulate import simulate_mscclpp_plan

NOP = {"name": "nop"}


def _buffer(kind: str, index: int) -> list[dict]:
    return [{"type": kind, "index": index, "size": 1}]


def _remote(index: int) -> list[dict]:
    return [{"buffer_id": 0, "index": index, "size": 1}]


def _copy(kind: str, index: int) -> dict:
    return {"name": "copy", "src_buff": _buffer("i", 0), "dst_buff": _buffer(kind, index)}


def _control(name: str, channels: list[int], kind: str = "memory") -> dict:
    return {"name": name, "channel_ids": channels, "channel_type": kind}


def _semaphores(name: str, ids: list[int]) -> dict:
    return {"name": name, "semaphore_ids": ids}


def _pwsf(rank: int) -> dict:
    """Put this GPU's output chunk ``rank`` (tb 1's copy) into the peer's, over port channel 0."""
    return {
        "name": "pwsf",
        "src_buff": _buffer("o", rank),
        "dst_buff": _remote(rank),
        "channel_ids": [0],
        "channel_type": "port",
    }


def _threadblock(tb: int, ops: list[dict], kind: str | None = None, channels: tuple[int, ...] = (0,)) -> dict:
    refs = [{"channel_type": kind, "channel_ids": list(channels)}] if kind else []
    remote = [{"access_channel_type": kind, "remote_buffer_ids": [0]}] if kind else []
    return {"id": tb, "ops": ops, "channels": refs, "remote_buffer_refs": remote}


def _plan(threadblocks_of, kind: str, channels: int = 1, semaphores: int = 0) -> object:
    """Return a 2-GPU out-of-place AllGather whose GPU r runs ``threadblocks_of(r)``.

    Every GPU has ``channels`` channels of ``kind`` to its peer and the peer's output as remote buffer 0.
    """
    gpus = []
    for rank in range(2):
        gpus.append(
            {
                "id": rank,
                "input_chunks": 1,
                "output_chunks": 2,
                "scratch_chunks": 2,
                "threadblocks": threadblocks_of(rank),
                "channels": [{"channel_type": kind, "connected_to": [1 - rank] * channels}],
                "remote_buffers": [{"rank": 1 - rank, "type": "o", "access_channel_types": [kind]}],
                "semaphores": [{"init_value": 0}] * semaphores,
            }
        )
    document = {"name": "threads", "collective": "allgather", "protocol": "Simple", "inplace": False, "gpus": gpus}
    return parse_mscclpp_plan(json.dumps(document), "threads.json")


def _producers(rank: int) -> list[dict]:
    """tb 0 writes a scratch chunk and releases semaphore 0; tb 1 writes output chunk ``rank``, releases 1."""
    return [
        _threadblock(0, [_copy("s", 0), NOP, _semaphores("sem_release", [0])]),
        _threadblock(1, [_copy("o", rank), NOP, _semaphores("sem_release", [1])]),
    ]


def _acquire_then_put(synced: bool):
    """tb 2: ``sem_acquire [0, 1]`` then a port pwsf of tb 1's chunk (thread 0 alone issues it)."""

    def threadblocks(rank: int) -> list[dict]:
        ops = [_semaphores("sem_acquire", [0, 1]), *([NOP] if synced else []), _pwsf(rank)]
        return [*_producers(rank), _threadblock(2, [*ops, _control("wait", [0], "port")], "port")]

    return _plan(threadblocks, "port", semaphores=2)


def _acquire_then_release(synced: bool, released: list[int] = (2,)):
    """tb 2: ``sem_acquire [0, 1]`` then ``sem_release released``; tb 3 acquires 2 and puts tb 1's chunk."""

    def threadblocks(rank: int) -> list[dict]:
        relay = [_semaphores("sem_acquire", [0, 1]), *([NOP] if synced else []), _semaphores("sem_release", released)]
        forward = [_semaphores("sem_acquire", [2]), NOP, _pwsf(rank), _control("wait", [0], "port")]
        return [*_producers(rank), _threadblock(2, relay), _threadblock(3, forward, "port")]

    return _plan(threadblocks, "port", semaphores=4)


def _acquire_then_signal(synced: bool):
    """tb 2: ``sem_acquire [0, 1]`` then a memory signal; the peer's tb 3 waits and gets tb 1's chunk."""

    def threadblocks(rank: int) -> list[dict]:
        relay = [_semaphores("sem_acquire", [0, 1]), *([NOP] if synced else []), _control("signal", [0])]
        get = {"name": "get", "src_buff": _remote(1 - rank), "dst_buff": _buffer("o", 1 - rank)}
        get |= {"channel_ids": [0], "channel_type": "memory"}
        return [
            *_producers(rank),
            _threadblock(2, relay, "memory"),
            _threadblock(3, [_control("wait", [0]), NOP, get], "memory"),
        ]

    return _plan(threadblocks, "memory", semaphores=2)


def _wait_then_signal(synced: bool):
    """tb 2 waits on channels 0 and 1 (the peer's tb 0 and its tb 1's put) and signals channel 2 (thread 0).

    The peer's tb 3 waits on channel 2 and reads what it put here, which only channel 1 published.
    """

    def threadblocks(rank: int) -> list[dict]:
        put = {"name": "put", "src_buff": _buffer("i", 0), "dst_buff": _remote(rank), "channel_type": "memory"}
        get = {"name": "get", "src_buff": _remote(rank), "dst_buff": _buffer("s", 1)}
        get |= {"channel_ids": [0], "channel_type": "memory"}
        forward = [_control("wait", [0, 1]), *([NOP] if synced else []), _control("signal", [2])]
        return [
            _threadblock(0, [_copy("o", rank), NOP, _control("signal", [0])], "memory", (0,)),
            _threadblock(1, [put, NOP, _control("signal", [0])], "memory", (1,)),
            _threadblock(2, forward, "memory", (0, 1, 2)),
            _threadblock(3, [_control("wait", [0]), NOP, get], "memory", (2,)),
        ]

    return _plan(threadblocks, "memory", channels=3)


def test_put_after_a_two_semaphore_acquire_races_with_the_second_producer():
    with pytest.raises(
        VerificationError,
        match=r"race \(rank (\d), tb 2, step 1\): gpu \1 tb 2 op 1 \(pwsf\): reads GPU \1 o slice \1 before it "
        r"is guaranteed written by gpu \1 tb 1 op 0 \(copy\)",
    ):
        verify_mscclpp_plan(_acquire_then_put(synced=False))
    verify_mscclpp_plan(_acquire_then_put(synced=True))


def test_release_after_a_two_semaphore_acquire_passes_on_only_the_first():
    problems = check_mscclpp_plan(_acquire_then_release(synced=False))
    assert problems and problems[0].kind == "race" and (problems[0].threadblock, problems[0].step) == (3, 2)
    assert "gpu 1 tb 3 op 2 (pwsf): reads GPU 1 o slice 1 before it is guaranteed written by gpu 1 tb 1" in (
        problems[0].message
    )
    verify_mscclpp_plan(_acquire_then_release(synced=True))


def test_each_thread_releases_after_its_own_acquire():
    # thread 1 acquires semaphore 1 and then releases 2: tb 3 sees tb 1's chunk without a nop
    verify_mscclpp_plan(_acquire_then_release(synced=False, released=[3, 2]))
    # thread 0 releases 2 after semaphore 0 alone
    assert check_mscclpp_plan(_acquire_then_release(synced=False, released=[2, 3]))[0].kind == "race"


def test_signal_after_a_two_semaphore_acquire_does_not_publish_the_second():
    problems = check_mscclpp_plan(_acquire_then_signal(synced=False))
    assert {(v.kind, v.rank, v.threadblock, v.step) for v in problems} == {("race", 0, 3, 2), ("race", 1, 3, 2)}
    assert "gpu 0 tb 3 op 2 (get): reads GPU 1 o slice 1 before it is guaranteed written by gpu 1 tb 1 op 0" in (
        problems[0].message
    )
    verify_mscclpp_plan(_acquire_then_signal(synced=True))


def test_signal_after_a_two_channel_wait_does_not_forward_the_second():
    problems = check_mscclpp_plan(_wait_then_signal(synced=False))
    assert {(v.kind, v.rank, v.threadblock, v.step) for v in problems} == {("race", 0, 3, 2), ("race", 1, 3, 2)}
    assert "gpu 1 tb 3 op 2 (get): reads GPU 0 o slice 1 before it is guaranteed written by gpu 1 tb 1 op 0 (put)" in (
        problems[0].message
    )
    verify_mscclpp_plan(_wait_then_signal(synced=True))


def test_a_thread_that_passed_no_gate_releases_at_once():
    # thread 0 acquires semaphore 1; thread 1 releases 2 without waiting for it
    def threadblocks(rank: int) -> list[dict]:
        relay = [_semaphores("sem_acquire", [1]), _semaphores("sem_release", [3, 2])]
        forward = [_semaphores("sem_acquire", [2]), NOP, _pwsf(rank), _control("wait", [0], "port")]
        return [*_producers(rank), _threadblock(2, relay), _threadblock(3, forward, "port")]

    problems = check_mscclpp_plan(_plan(threadblocks, "port", semaphores=4))
    assert problems and problems[0].kind == "race" and "tb 3 op 2 (pwsf)" in problems[0].message


def test_the_simulator_lets_thread_0_go_on_after_its_own_wait():
    # without the nop, tb 2's forwarding signal leaves when the peer's channel 0 signal arrives,
    # not when channel 1's (behind a put) does: side events are 0-cost control events
    synced, unsynced = (
        simulate_mscclpp_plan(_wait_then_signal(synced=flag), full_mesh(2), [2**20])[0].time_us
        for flag in (True, False)
    )
    assert synced - unsynced == pytest.approx(3.0)
