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


def test_a_ring_spread_over_more_channels_than_allowed_loads_at_the_runtimes_step_limit() -> None:
    """A 2-channel ring of 128 GPUs at 28 sends a threadblock takes 10 channels; at 64, 4."""
    from taccl_py.baselines.build import BaselineKind
    from taccl_py.baselines.choice import _loadable_variant
    from taccl_py.ir.collectives import Collective
    from taccl_py.synth.candidates import exportable

    topology = load_topology("ndv2", nodes=16)
    ring = ring_algorithm(topology, "allgather", verify=False)

    def keep(algorithm: Algorithm) -> bool:  # stands in for MSCCL's 32 channels against 128 H100s' 40
        return algorithm.num_channels <= 4 and exportable(algorithm)

    variant = _loadable_variant(ring, keep, BaselineKind.RING, topology, Collective.ALLGATHER, None, 2**30)
    assert variant is not None and variant.name == "ring-2ch-1p-tb64" and keep(variant)
    assert max(len(tb.steps) for program in variant.ranks for tb in program.threadblocks) == 64


@pytest.mark.slow  # a minute: a ring of 130k transfers built three times, verified, and the baselines at 128 GPUs
def test_the_loadable_ring_is_kept_at_1_gb_on_128_h100s_and_ties_nccls() -> None:
    """Issue 47, done-when 1: the XML at 1 GB is NCCL's ring as MSCCL loads it, as fast as NCCL's (closed form)."""
    from taccl_py.synth.candidates import exportable
    from taccl_py.verify import verify_algorithm

    topology = load_topology("dgx-h100", nodes=16)
    (compared,) = compare_baselines(topology, "allgather", [10**9], keep=exportable)
    assert compared.kept is not None
    ring, result = compared.kept
    # 28 sends a threadblock would take 40 channels, over MSCCL's 32; 64 take 16, every NIC keeps its ring.
    assert ring.name == "ring-8ch-1p-tb64" and ring.num_channels == 16 and ring.chunks_per_loop == 128 * 8
    assert exportable(ring) and verify_algorithm(ring).ok
    assert compared.native is not None and compared.native[0].name == "nccl-ring-8ch-1p"  # in closed form
    assert result.time_us == pytest.approx(compared.native[1].time_us, rel=1e-9)
