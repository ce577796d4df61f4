"""Checkers and small algorithm builders shared by the tests (import, never copy).

``assert_valid_algorithm(algorithm)`` is the one check every synthesizer, baseline and importer
output goes through; the ``ring_*`` builders give correct reference schedules for 2..N ranks.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from random import Random

import pytest

from taccl_py.ir.algorithm import Algorithm, Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
from taccl_py.solvers.cbc import CBC_INSTALL_HINT, find_cbc
from taccl_py.verify import VerificationReport, verify_algorithm

__all__ = [
    "too_many_steps_allgather",
    "assert_valid_algorithm",
    "ring_allgather_plan",
    "ring_reducescatter_plan",
    "ring_allreduce_plan",
    "direct_alltoall_plan",
    "chunked_alltoall_algorithm",
    "ring_algorithm",
    "FIXTURES",
    "msccl_fixture_paths",
    "BROKEN_MSCCL_FIXTURES",
    "LogLines",
    "error_line",
    "one_error_line",
    "requires_cbc",
    "run_calls_interleaved",
    "covering_product",
]

FIXTURES = Path(__file__).parent / "fixtures"
# pulp 4 bundles no CBC: tests that run it skip, naming how to get one, where none is installed.
requires_cbc = pytest.mark.skipif(find_cbc() is None, reason=f"no CBC program here: {CBC_INSTALL_HINT}")
# Reference files known to be incorrect, with the fault the verifier must name first.
BROKEN_MSCCL_FIXTURES = {"sccl_allreduce_dgx1_composed.xml": "uninitialized read"}


# Built-in machines whose per-machine tests run with --runslow only: gb200-nvl72 (72 GPUs a machine:
# minutes on 2 cores) and dgx-b200 (dgx-h100's graph at other rates: the default run checks dgx-h100).
LARGE_BUILTINS = frozenset({"gb200-nvl72", "dgx-b200"})


def builtin_machine_params() -> list:
    """Return the built-in machine names as pytest parameters, the large ones marked slow."""
    from taccl_py.topology import builtin_topology_names

    return [pytest.param(n, marks=pytest.mark.slow) if n in LARGE_BUILTINS else n for n in builtin_topology_names()]


# What ``pytest.param`` returns (pytest does not export the class).
_PARAMETER_SET = type(pytest.param(None))


def covering_product(rows: list, columns: list) -> list:
    """Return every (row, column) pair as a pytest parameter, all but a covering few marked slow.

    The default run keeps row i with column i mod len(columns) and column j with row j mod
    len(rows): every row and every column at least once, max(len) pairs. ``--runslow`` runs the
    whole product. A row or column that is itself a ``pytest.param`` keeps its marks; tuples unpack.
    """

    def values(item) -> tuple:
        item = item.values[0] if isinstance(item, _PARAMETER_SET) else item
        return item if isinstance(item, tuple) else (item,)

    def marks(item) -> tuple:
        return tuple(item.marks) if isinstance(item, _PARAMETER_SET) else ()

    covering = {(i, i % len(columns)) for i in range(len(rows))} | {(j % len(rows), j) for j in range(len(columns))}
    params = []
    for i, row in enumerate(rows):
        for j, column in enumerate(columns):
            slow = () if (i, j) in covering else (pytest.mark.slow,)
            pair = values(row) + values(column)
            params.append(pytest.param(*pair, marks=marks(row) + marks(column) + slow, id="-".join(map(str, pair))))
    return params


def error_line(stderr: str) -> str:
    """Return the one line of a failed command's ``stderr``, asserting it is exactly one ``error:`` line."""
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """Return the one ``error:`` line an in-process ``main([...])`` wrote to stderr (``error_line``)."""
    return error_line(capsys.readouterr().err)


def msccl_fixture_paths() -> list[Path]:
    """Return every reference MSCCL-IR XML under tests/fixtures/msccl, sorted."""
    return sorted((FIXTURES / "msccl").rglob("*.xml"))


I, O = Buffer.INPUT, Buffer.OUTPUT


def assert_valid_algorithm(algorithm: Algorithm, *, max_shown: int = 5) -> VerificationReport:
    """Assert that ``algorithm`` is well formed and implements its collective; return the report.

    The failure message lists the first ``max_shown`` violations and how many there are.
    """
    assert isinstance(algorithm, Algorithm), f"not an Algorithm: {type(algorithm).__name__}"
    assert len(algorithm.ranks) == algorithm.num_ranks, "one RankProgram per rank expected"
    assert [p.rank for p in algorithm.ranks] == list(range(algorithm.num_ranks)), "rank programs out of order"
    report = verify_algorithm(algorithm)
    if not report.ok:
        shown = "\n  ".join(str(v) for v in report.violations[:max_shown])
        more = f"\n  ... and {len(report.violations) - max_shown} more" if len(report.violations) > max_shown else ""
        raise AssertionError(f"{algorithm.name}: {len(report.violations)} violations:\n  {shown}{more}")
    assert report.rounds >= 1 or not any(tb.steps for p in algorithm.ranks for tb in p.threadblocks)
    return report


def ring_allgather_plan(num_ranks: int, channel: int = 0) -> list:
    """Return the items of a ring allgather, one chunk per rank, in causal order."""
    n = num_ranks
    items: list = [LocalCopy(r, (I, 0), (O, r)) for r in range(n)]
    for k in range(n - 1):
        for r in range(n):
            chunk = (r - k) % n
            items.append(Transfer(r, (r + 1) % n, (O, chunk), (O, chunk), channel=channel))
    return items


def ring_reducescatter_plan(num_ranks: int, channel: int = 0) -> list:
    """Return the items of a ring reduce-scatter that reduces in the input buffer and copies out."""
    n = num_ranks
    items: list = []
    for k in range(n - 1):
        for r in range(n):
            chunk = (r - k - 1) % n
            items.append(Transfer(r, (r + 1) % n, (I, chunk), (I, chunk), reduce=True, channel=channel))
    items += [LocalCopy(r, (I, r), (O, 0)) for r in range(n)]
    return items


def ring_allreduce_plan(num_ranks: int, inplace: bool = False, channel: int = 0) -> list:
    """Return a ring allreduce: reduce-scatter in the input buffer, then allgather of the sums."""
    n = num_ranks
    items = [item for item in ring_reducescatter_plan(n, channel) if isinstance(item, Transfer)]
    for k in range(n - 1):
        for r in range(n):
            chunk = (r - k) % n
            items.append(Transfer(r, (r + 1) % n, (I, chunk), (I, chunk), channel=channel))
    if not inplace:
        items += [LocalCopy(r, (I, c), (O, c)) for r in range(n) for c in range(n)]
    return items


def direct_alltoall_plan(num_ranks: int, chunks_per_block: int = 1) -> list:
    """Return an alltoall where every rank sends each block straight to its owner, as ``chunks_per_block`` chunks."""
    n, k = num_ranks, chunks_per_block
    items: list = [LocalCopy(r, (I, r * k + j), (O, r * k + j)) for r in range(n) for j in range(k)]
    items += [
        Transfer(r, q, (I, q * k + j), (O, r * k + j)) for r in range(n) for q in range(n) if q != r for j in range(k)
    ]
    return items


def chunked_alltoall_algorithm(num_ranks: int, chunks_per_block: int) -> Algorithm:
    """Return the direct alltoall with each block cut into ``chunks_per_block`` chunks (odd blocks get padded)."""
    items = direct_alltoall_plan(num_ranks, chunks_per_block)
    name = f"direct-alltoall-{num_ranks}x{chunks_per_block}"
    return lower_plan(name, Collective.ALLTOALL, num_ranks, num_ranks * chunks_per_block, items)


def ring_algorithm(collective: Collective, num_ranks: int, *, inplace: bool = False) -> Algorithm:
    """Return a correct lowered ring (direct for alltoall) algorithm, one chunk per rank."""
    n = num_ranks
    if collective is Collective.ALLGATHER:
        items = ring_allgather_plan(n)
    elif collective is Collective.REDUCESCATTER:
        items = ring_reducescatter_plan(n)
    elif collective is Collective.ALLREDUCE:
        return lower_plan(f"ring_allreduce_{n}", collective, n, n, ring_allreduce_plan(n, inplace), inplace=inplace)
    else:
        items = direct_alltoall_plan(n)
    return lower_plan(f"ring_{collective.value}_{n}", collective, n, n, items)


def too_many_steps_allgather() -> Algorithm:
    """Return a correct 2-rank allgather beyond MSCCL's step limit: 80 one-chunk sends on one threadblock."""
    plan = [Transfer(0, 1, (Buffer.INPUT, i), (Buffer.OUTPUT, i)) for i in range(80)]
    plan += [Transfer(1, 0, (Buffer.INPUT, i), (Buffer.OUTPUT, 80 + i)) for i in range(80)]
    return lower_plan("long", Collective.ALLGATHER, 2, 160, plan)


def assert_arborescence(graph, root: int, tree: tuple[int, ...]) -> None:
    """Assert that ``tree`` (link indices, parents first) spans ``graph`` from ``root`` on links allowed to it."""
    reached = {root}
    for l in tree:
        link = graph.links[l]
        assert link.src in reached, "a link before its parent"
        assert link.dst not in reached, "a rank reached twice"
        assert link.allows(root)
        reached.add(link.dst)
    assert reached == set(range(graph.num_ranks))


class LogLines(logging.Handler):
    """A logging handler that keeps the message of every record at INFO or above."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_calls_interleaved(
    plan: dict,
    calls: int,
    rng: Random,
    start: Callable[[int, int], None],
    step: Callable[[int, dict, dict, dict], bool],
    finish: Callable[[int, int], None],
    slow: int | None = None,
) -> None:
    """Run ``calls`` back-to-back calls of every threadblock of an MSCCL++ plan (its JSON) in a random interleaving.

    ``start(call, rank)`` writes a rank's inputs of a call; ``step(call, gpu, tb, op)`` runs one op,
    False while it must wait; ``finish(call, rank)`` checks the rank's outputs once all its
    threadblocks are done, and the rank starts its next call while its peers may lag (stream order).
    GPU ``slow`` mostly gives its turn away once another op moved. Fails when nothing can move.
    """
    programs = [(call, gpu, tb) for call in range(calls) for gpu in plan["gpus"] for tb in gpu["threadblocks"]]
    counters = [0] * len(programs)
    running = Counter((call, gpu["id"]) for call, gpu, _ in programs)

    def begin(call: int, rank: int) -> set[int]:
        start(call, rank)
        return {n for n, (c, gpu, _) in enumerate(programs) if c == call and gpu["id"] == rank}

    live = set().union(*(begin(0, gpu["id"]) for gpu in plan["gpus"]))
    while live:
        order = sorted(live)
        rng.shuffle(order)
        moved = False
        for number in order:
            call, gpu, tb = programs[number]
            if gpu["id"] == slow and moved and rng.random() < 0.9:
                continue
            if counters[number] < len(tb["ops"]):
                if step(call, gpu, tb, tb["ops"][counters[number]]):
                    counters[number] += 1
                    moved = True
                continue
            live.discard(number)
            running[(call, gpu["id"])] -= 1
            if running[(call, gpu["id"])] == 0:
                finish(call, gpu["id"])
                live |= begin(call + 1, gpu["id"]) if call + 1 < calls else set()
            moved = True
        assert moved or not live, "the plan deadlocks"


def write_one_gpu_machine(folder: Path) -> Path:
    """Write a machine of one GPU and one NIC (25 GB/s, α 2 µs) behind a PCIe switch (32 GB/s, α 0.5 µs a link)."""
    machine = {
        "schema": "taccl-topology/1",
        "name": "one-gpu",
        "description": "test: one GPU per machine",
        "sources": ["test fixture: made-up figures"],
        "vertices": [
            {"name": "gpu0", "kind": "gpu", "local_index": 0, "numa": 0},
            {
                "name": "nic0",
                "kind": "nic",
                "local_index": 0,
                "numa": 0,
                "net_kind": "ib",
                "net_bandwidth_GBps": 25.0,
                "net_alpha_us": 2.0,
            },
            {"name": "pcie0", "kind": "pcie_switch", "numa": 0},
        ],
        "links": [
            {"src": "gpu0", "dst": "pcie0", "kind": "pcie", "alpha_us": 0.5, "bandwidth_GBps": 32.0},
            {"src": "nic0", "dst": "pcie0", "kind": "pcie", "alpha_us": 0.5, "bandwidth_GBps": 32.0},
        ],
    }
    path = folder / "one-gpu.json"
    path.write_text(json.dumps(machine))
    return path
