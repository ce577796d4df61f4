"""compare_baselines builds its baselines unverified and verifies, once each, only the schedules it returns."""

from __future__ import annotations

from dataclasses import replace

import pytest

import taccl_py.baselines.build as build_module
import taccl_py.verify.replay as replay_module
from taccl_py.baselines import compare_baselines
from taccl_py.baselines.ring import ring_algorithm
from taccl_py.errors import VerificationError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType
from taccl_py.topology import load_topology

SIZES = (2**20, 64 * 2**20, 2**30)


def _returned(compared) -> dict[int, str]:
    """Return id -> name of every schedule (not a modelled NCCL algorithm) ``compared`` holds."""
    held = [getattr(entry, slot) for entry in compared for slot in ("fastest", "kept", "native", "schedule")]
    return {id(pair[0]): pair[0].name for pair in held if pair is not None and isinstance(pair[0], Algorithm)}


def test_only_the_returned_schedules_are_verified_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    verified: list[int] = []
    real = replay_module.verify_algorithm

    def recording(algorithm: Algorithm):
        verified.append(id(algorithm))
        return real(algorithm)

    monkeypatch.setattr(replay_module, "verify_algorithm", recording)
    built: list[str] = []
    topology = load_topology("ndv2", nodes=2)
    compared = compare_baselines(topology, "allreduce", SIZES, progress=built.append)
    returned = _returned(compared)
    assert sorted(verified) == sorted(returned), "each returned schedule once, nothing else"
    simulated = [line for line in built if line.endswith(("size", "sizes"))]
    assert len(simulated) > len(returned), f"every baseline built was returned: {built}"


def _wrong_data(algorithm: Algorithm) -> Algorithm:
    """Return ``algorithm`` with rank 0's first send reading the next output chunk: same time, wrong result."""
    program = algorithm.ranks[0]
    for tb_index, threadblock in enumerate(program.threadblocks):
        for step_index, step in enumerate(threadblock.steps):
            if step.op is OpType.SEND and step.src_buffer is Buffer.OUTPUT:
                wrong = replace(step, src_offset=(step.src_offset + 1) % program.output_chunks)
                steps = threadblock.steps[:step_index] + (wrong,) + threadblock.steps[step_index + 1 :]
                blocks = list(program.threadblocks)
                blocks[tb_index] = replace(threadblock, steps=steps)
                ranks = (replace(program, threadblocks=tuple(blocks)), *algorithm.ranks[1:])
                return replace(algorithm, ranks=ranks)
    raise AssertionError(f"{algorithm.name}: no send from the output on rank 0")


def test_a_wrong_baseline_that_is_returned_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def wrong_ring(topology, collective, **options):
        return _wrong_data(ring_algorithm(topology, collective, **{**options, "verify": False}))

    monkeypatch.setattr(build_module, "ring_algorithm", wrong_ring)
    # one NDv2: only the ring and the packed trees compete, and the ring wins at 1 GiB
    with pytest.raises(VerificationError, match="ring"):
        compare_baselines(load_topology("ndv2"), "allgather", (2**30,))
