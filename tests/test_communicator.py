"""Communicator: algorithm selection, collectives on gloo against torch's, errors before any message."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from taccl_py.errors import ArgumentError, TransportError, VerificationError
from taccl_py.ir import library as library_module
from taccl_py.ir.algorithm import Buffer
from taccl_py.ir.algorithm_json import write_algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary, SizeBand, generate_library
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
from taccl_py.runtime.communicator import Communicator
from taccl_py.runtime.communicator.selection import collect_algorithms
from taccl_py.runtime.executor import block_layout
from taccl_py.runtime.executor.native import all_gather_single, reduce_scatter_single

from helpers import LogLines, ring_algorithm
from mp_utils import Case, assert_no_mismatches, compare, random_input, run_ranks, torch_collective

FIXTURES = Path(__file__).parent / "fixtures" / "msccl"
I, O = Buffer.INPUT, Buffer.OUTPUT


def write_library(
    folder: Path,
    collective: Collective,
    num_ranks: int,
    bands: list[tuple[int, int | None, object]],
    topology: str = "test",
) -> Path:
    """Write a ``*.library.json`` with its algorithm files into ``folder``; return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for index, (low, high, algorithm) in enumerate(bands):
        name = f"{collective.value}-{index}.json"
        write_algorithm(algorithm, str(folder / name))
        entries.append(SizeBand(low, high, algorithm, name))
    path = folder / f"{collective.value}.library.json"
    path.write_text(
        generate_library(AlgorithmLibrary(topology, 1, collective, num_ranks, tuple(entries))), encoding="utf-8"
    )
    return path


def two_chunk_ring_allgather(n: int):
    """Return a ring allgather with two chunks per rank (a different algorithm than helpers' ring)."""
    items = [LocalCopy(r, (I, j), (O, 2 * r + j)) for r in range(n) for j in range(2)]
    for step in range(n - 1):
        for r in range(n):
            block = (r - step) % n
            items += [Transfer(r, (r + 1) % n, (O, 2 * block + j), (O, 2 * block + j)) for j in range(2)]
    return lower_plan(f"ring2_allgather_{n}", Collective.ALLGATHER, n, 2 * n, items)


def racy_inplace_allreduce(n: int):
    """Return an allreduce that copies its input out, then adds every peer's input into the output.

    Correct out of place; in place, a rank's receive adds into the chunk its own send still reads,
    so its in-place variant does not verify.
    """
    items = [LocalCopy(r, (I, c), (O, c)) for r in range(n) for c in range(n)]
    items += [
        Transfer(r, q, (I, c), (O, c), reduce=True) for r in range(n) for q in range(n) if q != r for c in range(n)
    ]
    return lower_plan(f"racy_inplace_allreduce_{n}", Collective.ALLREDUCE, n, n, items)


def wrong_allgather(n: int):
    """Return an allgather that forgets each rank's own chunk (the verifier rejects it)."""
    items = [Transfer(r, q, (I, 0), (O, r)) for r in range(n) for q in range(n) if q != r]
    return lower_plan("forgets_own_chunk", Collective.ALLGATHER, n, n, items)


# -- selection (one process) ------------------------------------------------------------------------


def test_library_bands_choose_by_size(tmp_path: Path) -> None:
    small, large = ring_algorithm(Collective.ALLGATHER, 4), two_chunk_ring_allgather(4)
    path = write_library(tmp_path, Collective.ALLGATHER, 4, [(0, 4096, small), (4096, None, large)])
    choices = collect_algorithms(str(path), 4)
    assert choices.select(Collective.ALLGATHER, 4095).algorithm.name == small.name
    assert choices.select(Collective.ALLGATHER, 4096).algorithm.name == large.name
    assert choices.select(Collective.ALLREDUCE, 4096) is None


def test_single_xml_and_json_files_are_candidates_for_every_size(tmp_path: Path) -> None:
    json_path = tmp_path / "rs.json"
    write_algorithm(ring_algorithm(Collective.REDUCESCATTER, 4), str(json_path))
    xml = FIXTURES / "microsoft" / "allreduce_ring_4gpu_simple.xml"
    choices = collect_algorithms([xml, str(json_path)], 4)
    assert choices.select(Collective.ALLREDUCE, 1).origin == str(xml)
    assert choices.select(Collective.REDUCESCATTER, 10**12).algorithm.collective is Collective.REDUCESCATTER


def test_algorithm_for_another_world_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match="runs on 4 ranks, the group has 2"):
        collect_algorithms(ring_algorithm(Collective.ALLGATHER, 4), 2)


def test_unknown_library_name_is_refused() -> None:
    with pytest.raises(ArgumentError, match="no-such-machine: library: neither a file nor a built-in topology"):
        collect_algorithms("no-such-machine", 2)


def test_topology_name_finds_its_shipped_libraries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_library(
        tmp_path / "mybox" / "n1",
        Collective.ALLGATHER,
        4,
        [(0, None, ring_algorithm(Collective.ALLGATHER, 4))],
        "mybox",
    )
    write_library(
        tmp_path / "mybox" / "n2",
        Collective.ALLGATHER,
        8,
        [(0, None, ring_algorithm(Collective.ALLGATHER, 8))],
        "mybox",
    )
    monkeypatch.setattr(library_module, "shipped_library_dir", lambda: tmp_path)
    assert collect_algorithms("mybox", 8).select(Collective.ALLGATHER, 10).algorithm.num_ranks == 8
    assert (
        collect_algorithms(None, 4, topology="mybox", nodes=1).select(Collective.ALLGATHER, 10).algorithm.num_ranks == 4
    )
    with pytest.raises(ArgumentError, match=r"3 ranks, but the shipped algorithms of mybox run on \[4, 8\] ranks"):
        collect_algorithms("mybox", 3)


def test_communicator_needs_an_initialised_group() -> None:
    with pytest.raises(TransportError, match="torch.distributed is not initialised"):
        Communicator()


def test_from_env_names_the_missing_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ArgumentError, match="environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: not set"):
        Communicator.from_env()


def test_import_taccl_py_does_not_import_torch() -> None:
    code = (
        "import sys, taccl_py; assert 'torch' not in sys.modules; "
        "print(taccl_py.Communicator.__name__, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Communicator", "True"]


# -- collectives on gloo ----------------------------------------------------------------------------


def run_collective(comm: Communicator, collective: Collective, case: Case, rank: int) -> str | None:
    """Run one call of ``collective`` with ``comm`` and with torch; return a mismatch or None."""
    world = comm.world_size
    blocks = world if collective is Collective.REDUCESCATTER else 1
    data = random_input(case, rank, blocks * case.numel)
    kept = data.clone()
    if collective is Collective.ALLGATHER:
        ours = torch.full((world * case.numel,), 99, dtype=data.dtype)
        comm.all_gather(ours, data)
    elif collective is Collective.REDUCESCATTER:
        ours = torch.full((case.numel,), 99, dtype=data.dtype)
        comm.reduce_scatter(ours, data, op=case.op)
    else:
        ours = data
        comm.all_reduce(ours, op=case.op)
    return compare(case, ours, torch_collective(collective.value, kept, case.op, world))


def collectives_worker(rank: int, world: int, library: object, plan: list[tuple[Collective, Case]]) -> list[str]:
    """Worker: run every (collective, case) through a Communicator on ``library``; return mismatches."""
    comm = Communicator(None, library, timeout_s=30)
    problems = []
    for collective, case in plan:
        problem = run_collective(comm, collective, case, rank)
        if problem:
            problems.append(f"{collective.value} via {comm.algorithm_for(collective, 1)}: {problem}")
    return problems


def sweep(collectives: tuple[Collective, ...], numels: tuple[int, ...] = (1, 5, 1000)) -> list[tuple[Collective, Case]]:
    plan = []
    for collective in collectives:
        for dtype, numel in [(d, n) for d in ("float32", "float16", "int64") for n in numels]:
            for op in ("sum", "avg", "max", "min") if collective.reduces else ("sum",):
                plan.append((collective, Case(collective.value, dtype, numel, op, seed=numel)))
    return plan


@pytest.mark.multiprocess
def test_library_file_runs_all_three_collectives_on_4_ranks(tmp_path: Path) -> None:
    path = write_library(
        tmp_path / "ag",
        Collective.ALLGATHER,
        4,
        [(0, 2000, ring_algorithm(Collective.ALLGATHER, 4)), (2000, None, two_chunk_ring_allgather(4))],
    )
    xml = FIXTURES / "azure" / "reducescatter_allpairs_4gpu_ll.xml"
    ar = tmp_path / "ar.json"
    write_algorithm(ring_algorithm(Collective.ALLREDUCE, 4, inplace=True), str(ar))
    plan = sweep((Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE))
    assert_no_mismatches(run_ranks(collectives_worker, 4, [str(path), xml, ar], plan))


@pytest.mark.multiprocess
def test_a_topology_library_on_2_ranks_with_torch_fallback_for_the_rest(tmp_path: Path) -> None:
    library = [ring_algorithm(Collective.ALLREDUCE, 2)]  # no allgather or reducescatter: torch runs those
    plan = sweep((Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE), (3, 64))
    assert_no_mismatches(run_ranks(collectives_worker, 2, library, plan))


def checks_worker(rank: int, world: int) -> list[str]:
    """Worker: bad calls raise before sending; fallback logs once; the group stays usable."""
    handler = LogLines()
    logger = logging.getLogger("taccl_py.runtime.communicator")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    with pytest.raises(ArgumentError, match="runs on 4 ranks, the group has 2"):
        Communicator(None, ring_algorithm(Collective.ALLGATHER, 4))
    with pytest.raises(VerificationError, match="forgets_own_chunk: incorrect"):
        Communicator(None, wrong_allgather(2))
    comm = Communicator(None, [ring_algorithm(Collective.ALLGATHER, 2)], timeout_s=20)
    with pytest.raises(
        ArgumentError, match=r"all_gather.output: 5 elements for an input of 3 on 2 ranks; expected 6 elements"
    ):
        comm.all_gather(torch.zeros(5), torch.zeros(3))
    with pytest.raises(
        ArgumentError, match="reduce_scatter: output is torch.float64 but input is torch.float32; expected one dtype"
    ):
        comm.reduce_scatter(torch.zeros(3, dtype=torch.float64), torch.zeros(6))
    with pytest.raises(ArgumentError, match="all_reduce.output: tensor is not contiguous"):
        comm.all_reduce(torch.zeros(4, 2)[:, 1])
    with pytest.raises(ArgumentError, match="dtype torch.uint8 is not supported"):
        comm.all_reduce(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ArgumentError, match="op: 'prod'"):
        comm.all_reduce(torch.zeros(4), op="prod")
    import torch.distributed as dist

    problems = []
    for repeat in range(2):  # the group is in step: no stray message was sent above
        problem = run_collective(
            comm,
            Collective.ALLREDUCE,
            Case(ring_algorithm(Collective.ALLREDUCE, 2), "float32", 10, "sum", seed=repeat),
            rank,
        )
        problems += [problem] if problem else []
    tensor = torch.full((4,), float(rank + 1))
    comm.all_reduce(tensor, op=dist.ReduceOp.MAX)
    problems += [] if tensor.tolist() == [2.0] * 4 else [f"ReduceOp.MAX gave {tensor.tolist()}"]
    fallback_lines = [m for m in handler.messages if "using torch.distributed's own" in m]
    expected = 1 if rank == 0 else 0  # the other ranks log it at DEBUG, below the handler's INFO
    problems += [] if len(fallback_lines) == expected else [f"expected {expected} fallback lines, got {fallback_lines}"]
    return problems


@pytest.mark.multiprocess
def test_bad_calls_fail_before_any_message_and_fallback_logs_once() -> None:
    assert_no_mismatches(run_ranks(checks_worker, 2))


def from_env_worker(rank: int, world: int) -> list[str]:
    """Worker started like torchrun, without a group: from_env initialises it."""
    import atexit

    at_exit: list = []
    register, atexit.register = atexit.register, at_exit.append  # this process's exit is the launcher's
    try:
        comm = Communicator.from_env([ring_algorithm(Collective.ALLGATHER, world)], backend="gloo", timeout_s=20)
    finally:
        atexit.register = register
    output = torch.zeros(world * 3, dtype=torch.int32)
    comm.all_gather(output, torch.full((3,), rank, dtype=torch.int32))
    want = [r for r in range(world) for _ in range(3)]
    problems = [] if output.tolist() == want else [f"from_env all_gather gave {output.tolist()}"]
    # torch 2.13 aborts now and then when a gloo group is left to interpreter exit (SIGABRT in about
    # half of 4-rank torchrun runs; scripts/stress_torchrun.py): the group from_env made is destroyed then
    for handler in at_exit:
        handler()
    if len(at_exit) != 1 or torch.distributed.is_initialized():
        problems.append("the group from_env initialised is still alive after the exit handlers ran")
    return problems


@pytest.mark.multiprocess
def test_from_env_initialises_from_torchrun_variables() -> None:
    assert_no_mismatches(run_ranks(from_env_worker, 2, backend=None))


# -- in-place calls on gloo -------------------------------------------------------------------------

# The packages' loggers: their modules' lines (inplace_calls among them) propagate up to these.
_DEBUG_LOGGERS = ("taccl_py.runtime.communicator", "taccl_py.runtime.executor")


def debug_lines() -> LogLines:
    """Return a handler that keeps the runtime's DEBUG lines (which form ran, which copies were bound)."""
    handler = LogLines()
    handler.setLevel(logging.DEBUG)
    for name in _DEBUG_LOGGERS:
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.DEBUG)
    return handler


def stop_lines(handler: LogLines) -> None:
    """Detach a handler that ``debug_lines`` attached."""
    for name in _DEBUG_LOGGERS:
        logging.getLogger(name).removeHandler(handler)


def inplace_call(comm: Communicator, collective: Collective, case: Case, rank: int) -> tuple[torch.Tensor, ...]:
    """Run MSCCL's in-place form of ``collective`` with ``comm`` and with gloo on the same data; return both results."""
    import torch.distributed as dist

    world, op = comm.world_size, getattr(dist.ReduceOp, case.op.upper())
    if collective is Collective.ALLREDUCE:
        ours = random_input(case, rank, case.numel)
        theirs = ours.clone()
        comm.all_reduce(ours, op=case.op)
        dist.all_reduce(theirs, op=op)
        return ours, theirs
    if collective is Collective.ALLGATHER:
        ours = torch.full((world * case.numel,), 99, dtype=getattr(torch, case.dtype))
        ours.chunk(world)[rank].copy_(random_input(case, rank, case.numel))
        theirs = ours.clone()
        comm.all_gather(ours, ours.chunk(world)[rank])
        all_gather_single(theirs, theirs.chunk(world)[rank])
        return ours, theirs
    ours = random_input(case, rank, world * case.numel)
    theirs = ours.clone()
    comm.reduce_scatter(ours.chunk(world)[rank], ours, op=case.op)
    reduce_scatter_single(theirs.chunk(world)[rank], theirs, op)
    return ours, theirs  # the whole input: its other blocks must stay as gloo leaves them


def inplace_problems(comm: Communicator, collective: Collective, case: Case, rank: int, form: str) -> list[str]:
    """Run one in-place call; return its mismatch with gloo, and a line unless it ran ``form`` without copies."""
    lines = debug_lines()
    ours, theirs = inplace_call(comm, collective, case, rank)
    problem = compare(case, ours, theirs)
    problems = [f"in place: {problem}"] if problem else []
    if not any(f"runs {form}" in line for line in lines.messages):
        problems.append(f"{case.label()}: expected {form!r} to run; log: {lines.messages}")
    per_block = block_layout(collective, comm.world_size, comm.world_size)[2]
    copy_free = "to the caller's one buffer with 0 copies in and 0 out"
    if form.startswith("in-place") and case.numel % per_block == 0 and not any(copy_free in m for m in lines.messages):
        problems.append(f"{case.label()}: the rank's block was copied; log: {lines.messages}")
    stop_lines(lines)
    return problems


def inplace_worker(rank: int, world: int) -> list[str]:
    """Worker: in-place and ordinary calls of out-of-place rings equal gloo's; the right form runs, verified once."""
    rings = [ring_algorithm(c, world) for c in (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)]
    comm = Communicator(None, rings, timeout_s=30)
    verified = debug_lines()
    problems = []
    cases = [  # 37 pads the allreduce's 4 chunks per block: it copies, but must still run in place
        Case("in place", "float32", 1000, "sum", seed=1, real=True),
        Case("in place", "float32", 37, "max", seed=2, real=True),
        Case("in place", "int64", 1000, "max", seed=3),
        Case("in place", "int64", 37, "sum", seed=4),
    ]
    for case in cases:
        for ring in rings:
            collective = ring.collective
            # an in-place ReduceScatter runs on a copy: its in-place schedule would write the input's other blocks
            form = f"{ring.name} (out of place)" if collective is Collective.REDUCESCATTER else None
            problems += inplace_problems(comm, collective, case, rank, form or f"in-place variant of {ring.name}")
            lines = debug_lines()
            problem = run_collective(comm, collective, case, rank)  # separate tensors (all_reduce: always in place)
            problems += [f"separate tensors: {problem}"] if problem else []
            ordinary = f"runs {ring.name} (out of place)"
            if collective is not Collective.ALLREDUCE and not any(ordinary in m for m in lines.messages):
                problems.append(f"{case.label()}: separate tensors did not run {ring.name}; log: {lines.messages}")
            stop_lines(lines)
    in_place_rings = [ring for ring in rings if ring.collective is not Collective.REDUCESCATTER]
    once = [m for m in verified.messages if "its in-place variant verifies" in m]
    if len(once) != len(in_place_rings):
        problems.append(f"expected one verification per ring, got {once}")
    for ring in in_place_rings:
        form = comm.algorithm_for(ring.collective, 4096, inplace=True)
        if not (form.inplace and form.meta("inplace_of") == ring.name and form is not ring):
            problems.append(f"algorithm_for(inplace=True) gave {form.name} inplace={form.inplace}")
    racy = Communicator(None, [racy_inplace_allreduce(world)], timeout_s=30)
    case = Case("racy", "float32", 64, "sum", seed=5, real=True)
    problems += inplace_problems(
        racy, Collective.ALLREDUCE, case, rank, f"{racy_inplace_allreduce(world).name} (out of place, on a copy"
    )
    if racy.algorithm_for(Collective.ALLREDUCE, 256, inplace=True).inplace:
        problems.append("a variant that does not verify was chosen")
    return problems


@pytest.mark.multiprocess
def test_inplace_calls_run_the_verified_inplace_variant_without_copies_and_equal_gloo() -> None:
    assert_no_mismatches(run_ranks(inplace_worker, 4))
