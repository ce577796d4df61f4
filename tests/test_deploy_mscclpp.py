"""taccl_py.deploy.mscclpp: register exported plans with MSCCL++'s NCCL shim so that no call reaches a plan it breaks.

MSCCL++ is not installed here: a fake ``mscclpp`` with the documented call shapes records the
registration, and an emulation of the shim's selection (microsoft/mscclpp @1f5f065d:
``AlgorithmCollection::selectAlgorithm`` src/core/algorithm.cc:98-110, the shim's
``matchExecutionPlan`` src/ext/nccl/algorithm_selector.cc:38-50 with ``DslAlgorithm::bufferMode``'s
one static placement, algorithm.cc:165-170, and ``CollectiveRequest::bufferMode``, :13-24) drives
every call form through it.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from taccl_py.cli import main
from taccl_py.deploy.mscclpp import (
    PlanSelector,
    call_placement,
    read_plan_folder,
    register_plans,
)
from taccl_py.errors import ArgumentError, FormatError
from taccl_py.files import read_any_algorithm
from taccl_py.mscclpp.files import write_mscclpp_plan
from taccl_py.mscclpp.sizes import FRAMEWORK_SIZES, executor_accepts, largest_addressable_size

WORLD, PER_NODE = 8, 8
COLLECTIVES = ("allgather", "allreduce", "reducescatter")
SIZES = tuple(sorted({1 << bit for bit in range(7, 34)} | set(FRAMEWORK_SIZES)))
OUTPUT_BASE, OTHER_BASE = 1 << 40, 1 << 44  # addresses far apart: out-of-place buffers never overlap


def _baseline_plan(work: Path, collective: str, channels: int, plan: Path) -> None:
    """Write NCCL's ring baseline for NDv2 x1 as a verified MSCCL++ plan (every size in its range)."""
    algorithm = work / f"{collective}-{channels}.json"
    args = ["baseline", "ring", "-t", "ndv2", "-c", collective, "--channels", str(channels), "-o", str(algorithm)]
    assert main(args) == 0
    write_mscclpp_plan(read_any_algorithm(algorithm), plan)


@pytest.fixture(scope="module")
def plans_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped NDv2 x1 AllGather library's plans, both placements, and an AllReduce ring plan beside them."""
    work = tmp_path_factory.mktemp("plans")
    folder = work / "ndv2"
    # --no-baselines: the library's own plans, NCCL's sizes left to it, no baseline's plan tried in their place
    assert main(["export-mscclpp", "ndv2", "--collective", "allgather", "--no-baselines", "-o", str(folder)]) == 0
    _baseline_plan(work, "allreduce", 2, folder / "allreduce-ring.json")
    return folder


@pytest.fixture(scope="module")
def ring_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One AllGather plan of NCCL's six rings (48 chunks): it refuses every power of two (issue 45, B1)."""
    work = tmp_path_factory.mktemp("ring")
    (work / "plans").mkdir()
    _baseline_plan(work, "allgather", 6, work / "plans" / "ring6.json")
    return work / "plans"


# --- a fake mscclpp: the call shapes of python/mscclpp/_core/algorithm.py and ext/algorithm_collection_builder.py


class FakeExecutionPlan:
    """``mscclpp.ExecutionPlan(planPath, rank)``: reads the fields the selector side needs, as the C++ parser does."""

    def __init__(self, plan_path: str, rank: int) -> None:
        document = json.loads(Path(plan_path).read_text())
        self.path, self.rank = plan_path, rank
        self.name, self.collective, self.inplace = document["name"], document["collective"], document["inplace"]
        self.min_message_size = document.get("min_message_size", 0)
        self.max_message_size = document.get("max_message_size", 2**64 - 1)


class FakeConstraint:
    def __init__(self, world_size: int = 0, n_ranks_per_node: int = 0) -> None:
        self.world_size, self.n_ranks_per_node = world_size, n_ranks_per_node


class FakeAlgorithm:
    Constraint = FakeConstraint

    def __init__(self, id=None, execution_plan=None, native_handle=None, tags=None, constraint=None) -> None:
        self.id, self.plan, self.tags = id, execution_plan, tags if tags is not None else {}
        self.constraint = constraint if constraint is not None else FakeConstraint()

    @property
    def name(self) -> str:
        return self.plan.name  # DslAlgorithm::name() is its plan's name (algorithm.cc:149)


class FakeBuilder:
    def __init__(self) -> None:
        self.added: list[FakeAlgorithm] = []
        self.selectors: list = []

    def add_algorithm_builder(self, algorithm) -> None:
        if not isinstance(algorithm, FakeAlgorithm):
            raise ValueError("The 'algorithm_builder' argument must be an AlgorithmBuilder or DSL Algorithm.")
        self.added.append(algorithm)

    def set_algorithm_selector(self, selector) -> None:
        self.selectors.append(selector)

    def build(self) -> dict[str, dict[str, FakeAlgorithm]]:
        """collective -> name -> algorithm, as AlgorithmCollectionBuilder::build registers them (:42-50)."""
        collection: dict[str, dict[str, FakeAlgorithm]] = {}
        for algorithm in self.added:
            collection.setdefault(algorithm.plan.collective, {})[algorithm.name] = algorithm
        return collection


class FakeMscclpp:
    """The module: ``ExecutionPlan``, ``Algorithm`` and ``ext.AlgorithmCollectionBuilder()`` (a singleton)."""

    ExecutionPlan = FakeExecutionPlan
    Algorithm = FakeAlgorithm

    def __init__(self) -> None:
        self.builder = FakeBuilder()
        self.ext = SimpleNamespace(AlgorithmCollectionBuilder=lambda: self.builder)


class FakeRequest:
    """A ``CollectiveRequest`` as ncclAllGather/ncclAllReduce/ncclReduceScatter fill it (src/ext/nccl/nccl.cc)."""

    def __init__(self, collective: str, size: int, inplace: bool, rank: int, dtype: str = "bfloat16") -> None:
        self.collective, self.rank, self.world_size, self.n_ranks_per_node = collective, rank, WORLD, PER_NODE
        self.dtype = SimpleNamespace(name=dtype)  # a CppDataType (python/csrc/core_py.cpp:42-53)
        block = size // WORLD
        self.message_size = block if collective == "allgather" else size  # AllGather: send bytes (:752)
        self.output_buffer = OUTPUT_BASE
        if collective == "allgather":
            self.input_buffer = OUTPUT_BASE + rank * block if inplace else OTHER_BASE
        elif collective == "reducescatter":
            self.input_buffer = OTHER_BASE
            self.output_buffer = OTHER_BASE + rank * block if inplace else OUTPUT_BASE
        else:
            self.input_buffer = OUTPUT_BASE if inplace else OTHER_BASE

    def buffer_mode(self) -> str:
        """CollectiveRequest::bufferMode (algorithm.cc:13-24): only equal pointers, or AllGather's rank block."""
        if self.input_buffer == self.output_buffer:
            return "in"
        if self.collective == "allgather" and self.input_buffer == self.output_buffer + self.rank * self.message_size:
            return "in"
        return "out"


class ShimSelection:
    """Our selector first, then the shim's: the first DSL algorithm ``matchExecutionPlan`` accepts."""

    def __init__(self, builder: FakeBuilder) -> None:
        self.algorithms = builder.build()
        self.selector = builder.selectors[-1] if builder.selectors else None
        self.static_mode: str | None = None  # DslAlgorithm::bufferMode's function-local static

    def _mode(self, algorithm: FakeAlgorithm) -> str:
        if self.static_mode is None:
            self.static_mode = "in" if algorithm.plan.inplace else "out"
        return self.static_mode

    def _match(self, algorithm: FakeAlgorithm, request: FakeRequest) -> bool:
        size = request.message_size * request.world_size if request.collective == "allgather" else request.message_size
        return (
            algorithm.constraint.world_size == request.world_size
            and algorithm.constraint.n_ranks_per_node == request.n_ranks_per_node
            and algorithm.plan.collective == request.collective
            and self._mode(algorithm) == request.buffer_mode()
            and algorithm.plan.min_message_size <= size <= algorithm.plan.max_message_size
        )

    def select(self, request: FakeRequest) -> FakeAlgorithm | None:
        chosen = self.selector(self.algorithms, request) if self.selector is not None else None
        if chosen is None:
            chosen = next(
                (a for a in self.algorithms.get(request.collective, {}).values() if self._match(a, request)), None
            )
        return chosen


def _oracle(plans, collective: str, size: int, inplace: bool) -> str | None:
    """The plan that runs the call right, found without the selector: placement, range, divisibility, 32-bit offsets."""
    for entry in plans:
        plan = entry.plan
        if (plan.collective, plan.inplace) == (collective, inplace) and plan.min_message_size <= size:
            if size <= min(plan.max_message_size, largest_addressable_size(plan)) and executor_accepts(plan, size):
                return plan.name
    return None


def _wrong_calls(selection: ShimSelection, plans) -> tuple[list[str], int]:
    """Return the calls that reach a plan other than the oracle's, and how many calls plans serve."""
    by_name = {entry.name: entry for entry in plans}
    wrong, served = [], 0
    for collective in COLLECTIVES:
        for inplace in (False, True):
            for size in SIZES:
                for rank in range(WORLD):
                    chosen = selection.select(FakeRequest(collective, size, inplace, rank))
                    name = None if chosen is None else chosen.name
                    if name in by_name:
                        served += 1
                    if name != _oracle(plans, collective, size, inplace):
                        wrong.append(f"{collective} inplace={inplace} {size} B rank {rank}: {name}")
    return wrong, served


def test_registration_makes_the_documented_calls(plans_dir: Path) -> None:
    fake = FakeMscclpp()
    registration = register_plans(plans_dir, rank=3, world_size=WORLD, ranks_per_node=PER_NODE, mscclpp_module=fake)
    files = sorted(plans_dir.glob("*.json"))
    assert len(registration.plans) == len(files) == len(fake.builder.added) > 0
    for algorithm in fake.builder.added:
        assert algorithm.plan.rank == 3 and Path(algorithm.plan.path).parent == plans_dir
        assert algorithm.id == algorithm.plan.name
        # world size 0 and ranks per node 0: the shim's matchExecutionPlan never picks the plan
        assert (algorithm.constraint.world_size, algorithm.constraint.n_ranks_per_node) == (0, 0)
    assert len(fake.builder.selectors) == 1


@pytest.mark.parametrize("folder", ["plans_dir", "ring_dir"])
def test_every_call_reaches_only_a_plan_that_runs_it_right(folder: str, request: pytest.FixtureRequest) -> None:
    fake = FakeMscclpp()
    registration = register_plans(
        request.getfixturevalue(folder), rank=0, world_size=WORLD, ranks_per_node=PER_NODE, mscclpp_module=fake
    )
    wrong, served = _wrong_calls(ShimSelection(fake.builder), registration.plans)
    assert not wrong, wrong[:5]
    assert served > 0  # not vacuous: plans serve calls


def test_sizes_a_plan_refuses_fall_back(ring_dir: Path, plans_dir: Path, tmp_path: Path) -> None:
    selector = PlanSelector(read_plan_folder(ring_dir, world_size=WORLD, ranks_per_node=PER_NODE), WORLD, PER_NODE)
    for size in (1 << 20, 1 << 30, 25 * 2**20):
        entry, why = selector.decide("allgather", size, False)
        assert entry is None and why == "ring-6ch-1p's chunks do not divide the size"
    assert selector.select("allgather", 3 * 2**20, False).name == "ring-6ch-1p"
    # an open range (MSCCL++'s default maximum, which our exports wrote before) stops where offsets pass 2^32 bytes
    document = json.loads((ring_dir / "ring6.json").read_text())
    del document["max_message_size"]
    (tmp_path / "open.json").write_text(json.dumps(document))
    open_range = PlanSelector(read_plan_folder(tmp_path, world_size=WORLD, ranks_per_node=PER_NODE), WORLD, PER_NODE)
    assert open_range.decide("allgather", 3 * 2**32, False) == (None, "ring-6ch-1p would pass 32-bit offsets")
    assert open_range.select("allgather", 3 * 2**30, False) is not None
    assert selector.decide("allgather", 3 * 2**20, True) == (None, "no plan for this collective and placement")
    plans = PlanSelector(read_plan_folder(plans_dir, world_size=WORLD, ranks_per_node=PER_NODE), WORLD, PER_NODE)
    assert (
        plans.select("allgather", 16 * 1024, True).inplace and not plans.select("allgather", 16 * 1024, False).inplace
    )


def test_the_shims_own_rule_would_break_calls(plans_dir: Path) -> None:
    """The control: plans registered for the shim's rule (exact world size, no selector) reach wrong calls."""
    fake = FakeMscclpp()
    plans = read_plan_folder(plans_dir, world_size=WORLD, ranks_per_node=PER_NODE)
    for entry in plans:
        constraint = FakeConstraint(WORLD, PER_NODE)
        fake.builder.add_algorithm_builder(
            FakeAlgorithm(entry.name, FakeExecutionPlan(str(entry.path), 0), constraint=constraint)
        )
    wrong, _ = _wrong_calls(ShimSelection(fake.builder), plans)
    assert wrong


def test_a_job_reducing_with_max_is_refused_allreduce_plans(plans_dir: Path) -> None:
    fake = FakeMscclpp()
    with pytest.raises(ArgumentError, match=r"allreduce-ring\.json: reduce_ops: the job reduces with max.*as a sum"):
        register_plans(
            plans_dir, rank=0, world_size=WORLD, ranks_per_node=PER_NODE, reduce_ops=("sum", "max"), mscclpp_module=fake
        )
    assert not fake.builder.added and not fake.builder.selectors
    registration = register_plans(
        plans_dir,
        rank=0,
        world_size=WORLD,
        ranks_per_node=PER_NODE,
        reduce_ops=("SUM", "max"),
        collectives=("allgather",),
        mscclpp_module=fake,
    )
    assert {entry.collective for entry in registration.plans} == {"allgather"}
    with pytest.raises(ArgumentError, match="reduce_ops: unknown op 'mean'"):
        register_plans(plans_dir, rank=0, world_size=WORLD, ranks_per_node=PER_NODE, reduce_ops=("mean",))


def test_calls_no_plan_serves_go_to_the_users_selector(ring_dir: Path) -> None:
    fake = FakeMscclpp()
    asked = []

    def user_selector(algorithms, request):
        asked.append((request.collective, request.message_size))
        return "users-algorithm"

    register_plans(
        ring_dir, rank=0, world_size=WORLD, ranks_per_node=PER_NODE, mscclpp_module=fake, user_selector=user_selector
    )
    selection = ShimSelection(fake.builder)
    assert selection.select(FakeRequest("allgather", 3 * 2**20, False, 2)).name == "ring-6ch-1p"
    assert selection.select(FakeRequest("allgather", 1 << 20, False, 2)) == "users-algorithm"
    assert selection.select(FakeRequest("allgather", 3 * 2**20, True, 2)) == "users-algorithm"
    # DslAlgorithm::execute refuses uint8 (algorithm.cc:237-239): such a call never reaches a plan
    assert selection.select(FakeRequest("allgather", 3 * 2**20, False, 2, dtype="uint8")) == "users-algorithm"
    assert [size for _, size in asked] == [(1 << 20) // WORLD, 3 * 2**20 // WORLD, 3 * 2**20 // WORLD]


def test_placement_follows_msccls_aliasing() -> None:
    size = 8 * 1024
    assert call_placement("allreduce", 100, 100, 5, size, WORLD) is True
    assert call_placement("allgather", 10_000 + 5 * 1024, 10_000, 5, size, WORLD) is True
    # MSCCL++'s bufferMode calls this ReduceScatter out of place; its output is rank 5's block of the input
    assert call_placement("reducescatter", 10_000, 10_000 + 5 * 1024, 5, size, WORLD) is True
    assert call_placement("reducescatter", 10_000, 10_000 + 1024, 5, size, WORLD) is None
    assert call_placement("allreduce", 0, size, 0, size, WORLD) is False
    assert call_placement("allreduce", 0, size - 16, 0, size, WORLD) is None


def test_folder_faults_name_the_file(plans_dir: Path, tmp_path: Path) -> None:
    def job(folder, **kw):
        return read_plan_folder(folder, world_size=kw.get("world", WORLD), ranks_per_node=kw.get("per", PER_NODE))

    with pytest.raises(ArgumentError, match="gpus: a plan for 8 ranks; expected plans for the job's 16 ranks"):
        job(plans_dir, world=16)
    with pytest.raises(ArgumentError, match=r"channels\[\d+\]: a memory channel to rank \d, on another machine"):
        job(plans_dir, per=4)
    with pytest.raises(ArgumentError, match="ranks_per_node: 3 ranks per machine"):
        job(plans_dir, per=3)
    with pytest.raises(ArgumentError, match="holds no plan"):
        job(tmp_path)
    source = plans_dir / "ndv2-n1-allgather-0.json"
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(source, broken / "a.json")
    (broken / "b.json").write_text('{"name": "x", "collective": "allgather"')
    with pytest.raises(FormatError, match=r"b\.json: line \d+: not JSON"):
        job(broken)
    (broken / "b.json").write_text(source.read_text())
    with pytest.raises(ArgumentError, match=r"b\.json: name: 'ndv2-n1-allgather-0' also names a\.json"):
        job(broken)
    document = json.loads(source.read_text())
    document.update(name="other", min_message_size=1000)
    (broken / "b.json").write_text(json.dumps(document))
    with pytest.raises(
        ArgumentError, match=r"b\.json: min_message_size: allgather out of place from 1000 B overlaps a\.json"
    ):
        job(broken)


def test_missing_mscclpp_is_one_line(plans_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mscclpp", None)  # import mscclpp raises ImportError
    with pytest.raises(ArgumentError, match="mscclpp: MSCCL\\+\\+'s Python package cannot be imported"):
        register_plans(plans_dir, rank=0, world_size=WORLD, ranks_per_node=PER_NODE)
    with pytest.raises(ArgumentError, match="rank: rank 8"):
        register_plans(plans_dir, rank=8, world_size=WORLD, ranks_per_node=PER_NODE)


def test_cli_dry_run(plans_dir: Path, ring_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted(path.name for path in plans_dir.iterdir())
    assert main(["deploy", "mscclpp", str(plans_dir), "--world-size", "8", "--ranks-per-node", "8"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\n  allgather +out of place +1KiB-\S+ +ndv2-n1-allgather-0\n", out)
    assert "LD_PRELOAD=<mscclpp>/build/lib/libmscclpp_nccl.so" in out and "register_plans(" in out
    args = [
        "deploy",
        "mscclpp",
        str(plans_dir),
        "--world-size",
        "8",
        "--ranks-per-node",
        "8",
        "--reduce-ops",
        "sum,max",
    ]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and captured.err.count("\n") == 1
    assert main([*args, "--collectives", "allgather"]) == 0
    assert "reduction ops: sum, max" in capsys.readouterr().out
    assert sorted(path.name for path in plans_dir.iterdir()) == before
    assert main(["deploy", "mscclpp", str(ring_dir), "--world-size", "8", "--ranks-per-node", "8"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"ring-6ch-1p \(ring6\.json\): allgather out of place, 0B-\S+, multiples of 768 B \(no power", out)
    assert re.search(r"allgather +out of place +1KiB-2MiB +fallback .*chunks do not divide the size\)\n", out)


def test_selector_ignores_other_communicators(plans_dir: Path) -> None:
    selector = PlanSelector(read_plan_folder(plans_dir, world_size=WORLD, ranks_per_node=PER_NODE), WORLD, PER_NODE)
    assert selector.select("allgather", 4096, True) is not None
    assert selector.select("allgather", 4096, True, world_size=4) is None
    assert selector.select("allgather", 4096, True, ranks_per_node=4) is None
    assert selector.select("allgather", 4096, None) is None
    assert selector.select("allreduce", 4096, False) is not None
    assert selector.select("alltoall", 4096, False) is None
