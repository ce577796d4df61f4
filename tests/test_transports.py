"""Transports: the executor over gloo (multi-process) against torch.distributed's own collectives.

Every algorithm we have that fits 2, 4 or 8 ranks — lowered rings, every baseline on small and
built-in topologies, the MSCCL reference XMLs and the shipped libraries — runs over
TorchDistTransport on random data (odd sizes, several dtypes and ops) and must equal what
torch.distributed computes in the same processes. GPU transports skip without CUDA.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from taccl_py.errors import TransportError
from taccl_py.files import read_any_algorithm
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import read_library, shipped_library_dir
from taccl_py.runtime.transports.cupy_nccl import CupyNcclTransport, unique_id_candidates, unique_id_to_bytes
from taccl_py.runtime.transports.torch_dist import TorchDistTransport

from helpers import ring_algorithm
from mp_utils import Case, assert_no_mismatches, check_executor_cases, run_ranks

FIXTURES = Path(__file__).parent / "fixtures" / "msccl"
BROKEN_XML = "sccl_allreduce_dgx1_composed.xml"
REDUCING = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)


# -- where the algorithms come from -----------------------------------------------------------------


def small_machine(gpus: int):
    """Return a one-node machine of ``gpus`` NVLink-connected GPUs with one NIC on a PCIe switch."""
    from taccl_py.topology import Link, LinkKind, Vertex, VertexKind, make_topology

    vertices = [Vertex(f"gpu{i}", VertexKind.GPU, local_index=i, rank=i) for i in range(gpus)]
    vertices += [
        Vertex("sw0", VertexKind.PCIE_SWITCH),
        Vertex("nic0", VertexKind.NIC, local_index=0, net_kind=LinkKind.IB, net_bandwidth_GBps=25.0, net_alpha_us=0.7),
    ]
    links = [Link(f"gpu{a}", f"gpu{b}", LinkKind.NVLINK, 0.3, 50.0) for a, b in itertools.permutations(range(gpus), 2)]
    for name in [f"gpu{i}" for i in range(gpus)] + ["nic0"]:
        links += [Link(name, "sw0", LinkKind.PCIE, 0.5, 24.0), Link("sw0", name, LinkKind.PCIE, 0.5, 24.0)]
    return make_topology(f"test{gpus}", vertices, links)


def test_topologies(num_ranks: int) -> list:
    """Return topologies with ``num_ranks`` GPUs: small one- and two-node machines, built-ins at 8."""
    from taccl_py.topology import compose_nodes, load_topology

    found = [small_machine(num_ranks)]
    if num_ranks % 2 == 0 and num_ranks >= 4:
        found.append(compose_nodes(small_machine(num_ranks // 2), 2))
    if num_ranks == 8:
        found += [load_topology(name) for name in ("ndv2", "dgx-a100", "pcie-8gpu")]
    return found


test_topologies.__test__ = False  # a helper, not a test


def baseline_algorithms(num_ranks: int) -> list[Algorithm]:
    from taccl_py.baselines import all_baselines

    found = []
    for topology in test_topologies(num_ranks):
        for collective in REDUCING:
            found += [a.with_metadata(test_topology=topology.name) for a in all_baselines(topology, collective)]
    return found


def msccl_algorithms(num_ranks: int) -> list[Algorithm]:
    return [
        a
        for a in (read_any_algorithm(p) for p in sorted(FIXTURES.glob("*/*.xml")) if p.name != BROKEN_XML)
        if a.num_ranks == num_ranks
    ]


def first_shipped_algorithm(num_ranks: int, collective: Collective) -> Algorithm | None:
    """Return band 0 of the first shipped ``collective`` library for ``num_ranks`` GPUs, reading no other band."""
    for path in sorted(shipped_library_dir().glob(f"*/n*/{collective.value}.library.json")):
        header = json.loads(path.read_text(encoding="utf-8"))
        if header["num_ranks"] == num_ranks:
            return read_any_algorithm(path.parent / header["bands"][0]["algorithm"])
    return None


def shipped_algorithms(num_ranks: int) -> list[Algorithm]:
    found = {}
    for path in sorted(shipped_library_dir().glob("*/n*/*.library.json")):
        if json.loads(path.read_text(encoding="utf-8"))["num_ranks"] != num_ranks:
            continue  # reading a library reads every band: only those of this size
        library = read_library(path)
        if library.num_ranks == num_ranks:
            for band in library.bands:
                found[(str(path.parent), band.algorithm_file)] = band.algorithm
    return list(found.values())


def ring_algorithms(num_ranks: int) -> list[Algorithm]:
    return [ring_algorithm(c, num_ranks) for c in Collective] + [
        ring_algorithm(Collective.ALLREDUCE, num_ranks, inplace=True)
    ]


def cases_for(
    algorithms: list[Algorithm],
    dtypes: tuple[str, ...],
    numels: tuple[int, ...],
    ops: tuple[str, ...] = ("sum", "max", "avg"),
    every_pair: bool = True,
) -> list[Case]:
    """Return the cases of every algorithm: each dtype at each numel (``every_pair``), else the i-th at the i-th."""
    cases = []
    pairs = list(itertools.product(dtypes, numels)) if every_pair else list(zip(dtypes, numels, strict=True))
    for index, algorithm in enumerate(algorithms):
        for dtype, numel in pairs:
            for op in ops if algorithm.collective.reduces else ("sum",):
                cases.append(
                    Case(algorithm, dtype, numel, op, seed=index, segment_bytes=256 if numel == max(numels) else None)
                )
        if algorithm.collective.reduces:
            cases.append(Case(algorithm, "float32", 1000, "sum", seed=index, real=True))
    return cases


# -- gloo -------------------------------------------------------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.parametrize("num_ranks", [2, 4])
def test_gloo_executor_matches_torch_on_every_algorithm(num_ranks: int) -> None:
    algorithms = (
        ring_algorithms(num_ranks)
        + msccl_algorithms(num_ranks)
        + baseline_algorithms(num_ranks)
        + shipped_algorithms(num_ranks)
    )
    # Every dtype at every numel on 2 ranks; on 4 (21 s for the product) each dtype at one numel.
    cases = cases_for(algorithms, ("float32", "bfloat16", "int64"), (1, 7, 1000), every_pair=num_ranks == 2)
    assert_no_mismatches(run_ranks(check_executor_cases, num_ranks, cases))


@pytest.mark.multiprocess
def test_gloo_executor_matches_torch_on_8_ranks_representative() -> None:
    algorithms = [ring_algorithm(Collective.ALLGATHER, 8), ring_algorithm(Collective.ALLREDUCE, 8, inplace=True)]
    algorithms += [
        a for a in msccl_algorithms(8) if a.name.startswith(("Allgather(n=8)-DGX1", "Reducescatter", "alltoall"))
    ][:3]
    algorithms += [a for a in (first_shipped_algorithm(8, c) for c in REDUCING) if a is not None]
    cases = cases_for(algorithms, ("float32", "int32"), (3, 1001), ("sum", "min"))
    assert_no_mismatches(run_ranks(check_executor_cases, 8, cases))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_gloo_executor_matches_torch_on_every_algorithm_at_8_ranks() -> None:
    algorithms = ring_algorithms(8) + msccl_algorithms(8) + baseline_algorithms(8) + shipped_algorithms(8)
    cases = cases_for(algorithms, ("float32", "float16", "bfloat16", "float64", "int32", "int64"), (1, 7, 1000))
    assert_no_mismatches(run_ranks(check_executor_cases, 8, cases, timeout_s=600))


def test_an_nccl_transport_sets_its_communicator_up_with_a_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU: the calls TorchDistTransport makes on an NCCL group, before any p2p."""
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group: "nccl")
    monkeypatch.setattr(dist, "get_rank", lambda group: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group: 2)
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, group: calls.append((tensor.tolist(), group)))
    monkeypatch.setattr(torch, "zeros", lambda n, device: torch.empty(n).fill_(0.0))  # no CUDA here
    link = TorchDistTransport(None, device="cuda:0")
    assert (link.name, link.independent_messages, calls) == ("torch-nccl", False, [([0.0], None)])


def test_torch_transport_needs_an_initialised_group() -> None:
    with pytest.raises(TransportError, match="torch.distributed is not initialised"):
        TorchDistTransport()


# -- GPU transports ---------------------------------------------------------------------------------


def _cuda_ranks_or_skip(needed: int) -> None:
    if not torch.cuda.is_available():
        pytest.skip("CUDA not available: the NCCL transports need GPUs")
    if torch.cuda.device_count() < needed:
        pytest.skip(f"CUDA not available: {needed} GPUs needed, {torch.cuda.device_count()} present")


def nccl_worker(rank: int, world_size: int, transport_kind: str) -> list[str]:
    """Worker: run rings over an NCCL transport on GPU ``rank`` and compare with torch's results on CPU."""
    import torch.distributed as dist

    from taccl_py.runtime.executor import Executor

    from mp_utils import random_input, torch_collective

    torch.cuda.set_device(rank)
    nccl_group = dist.new_group(backend="nccl")
    transport = TorchDistTransport(nccl_group) if transport_kind == "torch" else CupyNcclTransport(nccl_group)
    problems = []
    for algorithm in ring_algorithms(world_size):
        case = Case(algorithm, "float32", 1001)
        blocks = 1 if algorithm.collective in (Collective.ALLGATHER, Collective.ALLREDUCE) else world_size
        data = random_input(case, rank, blocks * case.numel)
        out_blocks = world_size if algorithm.collective in (Collective.ALLGATHER, Collective.ALLTOALL) else 1
        output = torch.zeros(out_blocks * case.numel, device=transport.device)
        Executor(algorithm, rank, torch.float32, case.numel, transport.device).run(
            output, data.to(transport.device), transport
        )
        torch.cuda.synchronize()
        if not torch.equal(output.cpu(), torch_collective(algorithm.collective.value, data, "sum", world_size)):
            problems.append(f"{case.label()} over {transport.name}")
    transport.close()
    return problems


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["torch", "cupy"])
def test_nccl_transports_match_torch(kind: str) -> None:
    _cuda_ranks_or_skip(2)
    if kind == "cupy":
        pytest.importorskip("cupy", reason="CUDA not available: CuPy is not installed")
    assert_no_mismatches(run_ranks(nccl_worker, 2, kind))


def test_cupy_transport_without_cupy_or_cuda_says_why() -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(TransportError, match="CuPy with NCCL is not available"):
            CupyNcclTransport()
        return
    if not torch.cuda.is_available():
        with pytest.raises(TransportError, match="CUDA is not available"):
            CupyNcclTransport()
        return
    pytest.skip("CUDA not available: not applicable, CuPy and CUDA are both present")


class FakeNccl:
    """Stands in for cupy.cuda.nccl where only get_unique_id matters (as CuPy returns it: tuple or bytes)."""

    def __init__(self, rank: int, form: str, salt: int) -> None:
        self.rank, self.form, self.salt = rank, form, salt

    def get_unique_id(self):
        raw = bytes((self.salt * 31 + self.rank * 7 + i) % 256 for i in range(128))  # rank 0's is the one to use
        return raw if self.form == "bytes" else tuple(v - 256 if v > 127 else v for v in raw)


def unique_id_worker(rank: int, world_size: int) -> list[str]:
    """Worker: two transports' worth of ids, through the default store, in both CuPy id forms."""
    from taccl_py.runtime.transports.cupy_nccl import _exchange_id

    seen = []
    for salt, form in enumerate(("signed tuple", "bytes")):
        raw = _exchange_id(FakeNccl(rank, form, salt), rank, None, None, "test/uid")
        seen.append(raw == bytes((salt * 31 + i) % 256 for i in range(128)))
    return [] if all(seen) else [f"rank {rank} got a different id: {seen}"]


@pytest.mark.multiprocess
def test_nccl_unique_id_goes_through_the_store_to_every_rank() -> None:
    assert_no_mismatches(run_ranks(unique_id_worker, 3))


@pytest.mark.parametrize("form", ["signed tuple", "bytes"])
def test_nccl_unique_id_survives_both_forms(form: str) -> None:
    raw = bytes(range(256))[:128]
    uid = tuple(v - 256 if v > 127 else v for v in raw) if form == "signed tuple" else raw
    wire = unique_id_to_bytes(uid)
    assert wire == raw
    signed, as_bytes = unique_id_candidates(wire)
    assert as_bytes == raw
    assert all(-128 <= v <= 127 for v in signed) and bytes(v & 0xFF for v in signed) == raw
