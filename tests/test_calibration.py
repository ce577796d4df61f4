"""Calibration: the Communicator runs the group's own collective where it measured faster."""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_communicator import run_collective

from taccl_py.errors import ArgumentError, FormatError
from taccl_py.ir.collectives import Collective
from taccl_py.runtime.communicator import Communicator
from taccl_py.runtime.communicator.calibration import (
    NATIVE,
    Calibration,
    CalibrationKey,
    CalibrationPoint,
    read_calibration,
    write_calibration,
)

from helpers import LogLines, ring_algorithm
from mp_utils import Case, assert_no_mismatches, run_ranks

AR = Collective.ALLREDUCE
KEY = CalibrationKey(2, "torch-gloo", "cpu", "0123456789abcdef")


def calibration(*points: tuple[int, str, float, float], collective: str = "allreduce") -> Calibration:
    """Return a calibration of ``KEY`` with (size, algorithm, ours_us, native_us) points."""
    return Calibration(KEY, "float32", 3, tuple(CalibrationPoint(collective, *point) for point in points))


# -- the choice rule (one process) -------------------------------------------------------------------


def test_the_nearest_measured_size_decides() -> None:
    cal = calibration((65536, "ring", 900.0, 300.0), (4 << 20, "ring", 2000.0, 4000.0))
    assert cal.native_faster(AR, 65536, "ring")
    assert cal.native_faster(AR, 500_000, "ring")  # nearer 64 KB than 4 MB in ratio
    assert not cal.native_faster(AR, 600_000, "ring")
    assert cal.native_faster(AR, 1, "ring") and not cal.native_faster(AR, 1 << 30, "ring")  # beyond: the end's verdict
    assert not cal.native_faster(Collective.ALLGATHER, 65536, "ring")  # not measured: the algorithm keeps it


def test_only_a_measurement_of_the_same_algorithm_counts() -> None:
    cal = calibration((65536, "small", 900.0, 300.0), (4 << 20, "large", 5000.0, 4000.0))
    assert not cal.native_faster(AR, 65536, "large")  # the nearer point measured another algorithm
    assert cal.native_faster(AR, 300_000, "large")  # the other neighbour measured it
    assert not cal.native_faster(AR, 300_000, "other")  # nobody measured it
    assert calibration((65536, NATIVE, 0.0, 10.0)).points[0].prefers_native()  # no algorithm there: native


def test_an_algorithm_keeps_a_size_only_beyond_the_margin() -> None:
    close = calibration((65536, "ring", 960.0, 1000.0))  # 4% faster: inside the default 5% margin
    assert close.native_faster(AR, 65536, "ring")
    assert not replace(close, margin=0.0).native_faster(AR, 65536, "ring")
    assert not calibration((65536, "ring", 900.0, 1000.0)).native_faster(AR, 65536, "ring")  # 10% faster
    assert "native runs at 1 of 1 measured sizes (margin 5%)" == close.summary()


# -- the file ---------------------------------------------------------------------------------------------


def test_a_calibration_file_round_trips(tmp_path: Path) -> None:
    cal = calibration((65536, "ring", 900.0, 300.5), (1 << 20, NATIVE, 12.0, 11.0))
    write_calibration(cal, tmp_path / "cal.json")
    assert read_calibration(tmp_path / "cal.json") == cal
    body = json.loads((tmp_path / "cal.json").read_text())
    del body["margin"]  # a file from before margins reads with the default one
    (tmp_path / "old.json").write_text(json.dumps(body))
    assert read_calibration(tmp_path / "old.json") == cal


@pytest.mark.parametrize(
    ("edit", "fault"),
    [
        (lambda body: "not json {", "invalid JSON"),
        (lambda body: {**body, "format": "other/1"}, "format: 'other/1'"),
        (lambda body: {k: v for k, v in body.items() if k != "points"}, "points: missing"),
        (
            lambda body: {**body, "key": {**body["key"], "world_size": "2"}},
            "CalibrationKey.world_size: '2'; expected int",
        ),
        (lambda body: {**body, "points": [{**body["points"][0], "extra": 1}]}, "unknown field 'extra'"),
        (lambda body: {**body, "points": [{**body["points"][0], "collective": "gossip"}]}, "'gossip'"),
        (lambda body: {**body, "margin": 1.5}, "margin: 1.5; expected a fraction in [0, 1)"),
    ],
)
def test_a_bad_calibration_file_is_one_error_naming_it(tmp_path: Path, edit, fault: str) -> None:
    path = tmp_path / "cal.json"
    write_calibration(calibration((65536, "ring", 900.0, 300.0)), path)
    changed = edit(json.loads(path.read_text()))
    path.write_text(changed if isinstance(changed, str) else json.dumps(changed))
    with pytest.raises(FormatError, match=str(path)) as raised:
        read_calibration(path)
    assert fault in str(raised.value)


# -- on 2 gloo ranks ------------------------------------------------------------------------------------


def calibrated_choice_worker(rank: int, world: int, folder: str) -> list[str]:
    """Worker: a calibration sends small sizes to gloo's own; results stay equal to torch's."""
    ring = ring_algorithm(AR, world)
    probe = Communicator(None, [ring], timeout_s=30)
    key = probe.calibration_key()
    measured = Calibration(
        key, "float32", 3, (CalibrationPoint("allreduce", 4096, ring.name, 900.0, 300.0),)
    )  # native faster at 4 KB
    measured = replace(measured, points=(*measured.points, CalibrationPoint("allreduce", 1 << 20, ring.name, 1.0, 9.0)))
    with pytest.raises(ArgumentError, match="calibration: measured on"):
        Communicator(None, [ring], calibration=replace(measured, key=replace(key, world_size=8)))
    comm = Communicator(None, [ring], timeout_s=30, calibration=measured)
    problems = []
    if comm.algorithm_for(AR, 4096) is not None or comm.algorithm_for(AR, 1 << 20) is not ring:
        problems.append("algorithm_for ignores the calibration")
    problems += filter(None, [run_collective(comm, AR, Case(ring, "float32", 1024, "sum", seed=1, real=True), rank)])
    if comm._executors:
        problems.append("a native size compiled an executor")
    problems += filter(None, [run_collective(comm, AR, Case(ring, "float32", 1 << 18, "avg", seed=2), rank)])
    if len(comm._executors) != 1:
        problems.append(f"1 MB should run the ring: {len(comm._executors)} executors")
    return problems


@pytest.mark.multiprocess
def test_a_calibration_runs_the_native_collective_where_it_measured_faster(tmp_path: Path) -> None:
    assert_no_mismatches(run_ranks(calibrated_choice_worker, 2, str(tmp_path)))


def cached_calibration_worker(rank: int, world: int, folder: str) -> list[str]:
    """Worker: measure into a file once; a second Communicator reads it instead of measuring."""
    lines = LogLines()
    logger = logging.getLogger("taccl_py.runtime.communicator")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    path = Path(folder) / "cal.json"
    library = [ring_algorithm(AR, world), ring_algorithm(Collective.ALLGATHER, world)]
    first = Communicator(None, library, timeout_s=30)
    measured = first.load_or_calibrate(path, sizes=[4096, 65536], iters=2, warmup=0)
    problems = []
    if sorted((p.collective, p.size_bytes) for p in measured.points) != [
        ("allgather", 4096),
        ("allgather", 65536),
        ("allreduce", 4096),
        ("allreduce", 65536),
    ]:
        problems.append(f"measured {measured.points}")
    if any(p.ours_us <= 0 or p.native_us <= 0 for p in measured.points):
        problems.append("a time is not positive")
    second = Communicator(None, library, timeout_s=30, calibration=path)
    if second.calibration != measured:
        problems.append("the cached calibration differs from the measured one")
    if sum("calibrated 2 ranks" in line for line in lines.messages) != 1:
        problems.append(f"measured more or less than once: {lines.messages}")
    data = torch.randn(16384, generator=torch.Generator().manual_seed(rank))  # 64 KB: whatever was chosen
    want = data.clone()
    torch.distributed.all_reduce(want)
    second.all_reduce(data)
    if not torch.allclose(data, want, rtol=1e-5, atol=1e-5):
        problems.append("64 KB all_reduce differs from torch's")
    if rank == 0:
        path.write_text("{")
    with pytest.raises(FormatError, match="cal.json: line 1: invalid JSON"):  # on rank 1 too, which does not read it
        Communicator(None, library, timeout_s=30, calibration=path)
    return problems


@pytest.mark.multiprocess
def test_a_calibration_is_measured_once_then_read_and_a_bad_file_fails_every_rank(tmp_path: Path) -> None:
    assert_no_mismatches(run_ranks(cached_calibration_worker, 2, str(tmp_path)))


def native_band_worker(rank: int, world: int) -> list[str]:
    """Worker: a library's native band runs torch's all_reduce, silently; the ring runs above it."""
    from taccl_py.ir.library import AlgorithmLibrary, SizeBand

    ring = ring_algorithm(AR, world)
    bands = (SizeBand(0, 8192, None, NATIVE), SizeBand(8192, None, ring, "ring.json"))
    handler = LogLines()
    logger = logging.getLogger("taccl_py.runtime.communicator")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        comm = Communicator(None, AlgorithmLibrary("toy", 1, AR, world, bands), timeout_s=30)
        problems = []
        if comm.algorithm_for(AR, 4096) is not None or comm.algorithm_for(AR, 65536) is not ring:
            problems.append("the native band did not choose torch's all_reduce, or the ring band not the ring")
        for numel in (1024, 16384):  # 4 KB in the native band, 64 KB in the ring's
            data = torch.randn(numel, generator=torch.Generator().manual_seed(numel + rank))
            want = data.clone()
            torch.distributed.all_reduce(want)
            comm.all_reduce(data)
            if not torch.allclose(data, want, rtol=1e-5, atol=1e-5):
                problems.append(f"{numel * 4} B all_reduce differs from torch's")
    finally:
        logger.removeHandler(handler)
    if any("no taccl algorithm" in line for line in handler.messages):
        problems.append(f"a chosen native band was logged as a fallback: {handler.messages}")
    return problems


@pytest.mark.multiprocess
def test_a_native_library_band_runs_torchs_collective_without_a_fallback_line() -> None:
    assert_no_mismatches(run_ranks(native_band_worker, 2))


# -- a calibrated library ------------------------------------------------------------------------------


def test_a_calibrated_library_has_native_bands_exactly_where_the_calibration_runs_native() -> None:
    import random

    from taccl_py.ir.library import AlgorithmLibrary, SizeBand
    from taccl_py.runtime.communicator.calibration import calibrated_library

    small, large = ring_algorithm(AR, 2), replace(ring_algorithm(AR, 2), name="large")
    library = AlgorithmLibrary(
        "toy", 1, AR, 2, (SizeBand(0, 1 << 20, small, "small.json", 3.0), SizeBand(1 << 20, None, large, "large.json"))
    )
    cal = calibration(
        (65536, small.name, 900.0, 300.0),  # native
        (262144, small.name, 100.0, 900.0),  # ours
        (4 << 20, "large", 100.0, 900.0),  # ours
        (64 << 20, "large", 1000.0, 900.0),  # native
    )
    out = calibrated_library(library, cal)
    sixteen = 16 << 20  # the geometric mean of 4 MB and 64 MB: nearer the smaller up to and including it
    assert [(b.min_bytes, b.max_bytes, b.algorithm_file) for b in out.bands] == [
        (0, 131073, "native"),  # up to the geometric mean of 64 KB and 256 KB, which ties to the smaller
        (131073, 1 << 20, "small.json"),
        (1 << 20, sixteen + 1, "large.json"),
        (sixteen + 1, None, "native"),
    ]
    assert out.bands[1].simulated_time_us == 3.0  # an algorithm's piece keeps its band's figures
    rng = random.Random(7)
    sizes = [1, 131072, 131073, sixteen, sixteen + 1] + [rng.randrange(1, 1 << 28) for _ in range(500)]
    for size in sizes:
        original = library.select(size)
        expected = None if cal.native_faster(AR, size, original.name) else original
        assert out.select(size) is expected, size


# -- the automatic calibration (default) ------------------------------------------------------------


def _automatic_calibration_on(folder: str) -> str | None:
    """In a rank: turn the suite's TACCL_CALIBRATION=off back on, cache in ``folder``, measure small; return it."""
    from taccl_py.runtime.communicator import calibration_cache

    seen = os.environ.pop("TACCL_CALIBRATION", None)
    os.environ["TACCL_CACHE_DIR"] = folder
    calibration_cache.LAZY_CALIBRATION_SIZES = (4096, 65536)
    calibration_cache.LAZY_CALIBRATION_ITERS = 2
    calibration_cache.LAZY_CALIBRATION_WARMUP = 0
    return seen


def _listen() -> LogLines:
    lines = LogLines()
    logger = logging.getLogger("taccl_py.runtime.communicator")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    return lines


def _count(lines: LogLines, text: str) -> int:
    return sum(text in line for line in lines.messages)


def _native_all_reduces(comm: Communicator, numel: int, rank: int) -> tuple[int, str | None]:
    """Return how many torch all_reduce calls ``comm`` made for one all_reduce of ``numel`` floats, and a mismatch."""
    data = torch.randn(numel, generator=torch.Generator().manual_seed(numel + rank))
    want = data.clone()
    calls = []
    real = torch.distributed.all_reduce
    torch.distributed.all_reduce = lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs)
    try:
        comm.all_reduce(data)
    finally:
        torch.distributed.all_reduce = real
    real(want)
    good = torch.allclose(data, want, rtol=1e-5, atol=1e-5)
    return len(calls), None if good else f"{numel * 4} B all_reduce differs from torch's"


def automatic_calibration_worker(rank: int, world: int, folder: str) -> list[str]:
    """Worker: a default Communicator measures on each collective's first call; a second reads the cache."""
    problems = []
    if _automatic_calibration_on(folder) != "off":
        problems.append("tests/conftest.py's TACCL_CALIBRATION=off did not reach the rank")
    lines = _listen()
    library = [ring_algorithm(AR, world), ring_algorithm(Collective.ALLGATHER, world)]
    first = Communicator(None, library, timeout_s=30)
    if first.automatic_calibration is not None or list(Path(folder).iterdir()):
        problems.append("measured before the first call")
    for collective in (AR, AR, Collective.ALLGATHER):  # the second all_reduce measures nothing
        problems += filter(None, [run_collective(first, collective, Case("auto", "float32", 1024, seed=1), rank)])
    measured = first.automatic_calibration
    if sorted((p.collective, p.size_bytes) for p in measured.points) != [
        ("allgather", 4096),
        ("allgather", 65536),
        ("allreduce", 4096),
        ("allreduce", 65536),
    ]:
        problems.append(f"measured {measured.points}")
    if _count(lines, "calibrated at 2 sizes") != 2 or _count(lines, "calibration read from") != 0:
        problems.append(f"measured other than once per collective: {lines.messages}")
    files = sorted(Path(folder).glob("calibration-2ranks-torch-gloo-cpu-*.json"))
    cached = read_calibration(files[0]) if len(files) == 1 else None
    if cached is None or set(cached.points) != set(measured.points) or cached.key != measured.key:
        problems.append(f"the cache holds {cached} in {files}")
    elif cached.key.hosts != ",".join([socket.gethostname()] * world):
        problems.append(f"hosts {cached.key.hosts!r}")
    second = Communicator(None, library, timeout_s=30)
    for collective in (Collective.ALLGATHER, AR):
        problems += filter(None, [run_collective(second, collective, Case("auto", "float32", 1024, seed=2), rank)])
    if _count(lines, "calibrated at") != 2 or _count(lines, "calibration read from") != 2:
        problems.append(f"the second Communicator did not read the cache: {lines.messages}")
    if set(second.automatic_calibration.points) != set(measured.points):
        problems.append("the second Communicator read other points")
    if rank == 0 and cached is not None:  # now the cache says: native is 10x faster everywhere
        slower = [replace(p, ours_us=10 * p.native_us) for p in cached.points]
        write_calibration(replace(cached, points=tuple(slower)), files[0])
    torch.distributed.barrier()
    third = Communicator(None, library, timeout_s=30)
    for numel in (1024, 16384):
        calls, problem = _native_all_reduces(third, numel, rank)
        problems += [problem] if problem else []
        if calls != 1:
            problems.append(f"{numel * 4} B all_reduce made {calls} torch all_reduce calls; the cache says native")
    return problems


def subgroup_calibration_worker(rank: int, world: int, folder: str) -> list[str]:
    """Worker: two 2-rank groups of one library on one host each measure into their own cache file."""
    _automatic_calibration_on(folder)
    mine = [torch.distributed.new_group([0, 1]), torch.distributed.new_group([2, 3])][rank // 2]
    comm = Communicator(mine, [ring_algorithm(AR, 2)], timeout_s=30)
    data = torch.randn(1024, generator=torch.Generator().manual_seed(rank))
    want = data.clone()
    comm.all_reduce(data)
    torch.distributed.all_reduce(want, group=mine)
    problems = [] if torch.allclose(data, want, rtol=1e-5, atol=1e-5) else ["all_reduce differs from torch's"]
    members = "0,1" if rank < 2 else "2,3"
    if comm.automatic_calibration is None or comm.automatic_calibration.key.members != members:
        problems.append(f"key {None if comm.automatic_calibration is None else comm.automatic_calibration.key}")
    torch.distributed.barrier()
    files = sorted(Path(folder).glob("calibration-2ranks-*.json"))
    if sorted(read_calibration(f).key.members for f in files) != ["0,1", "2,3"]:
        problems.append(f"cache files {files}: each group's own expected")
    return problems


@pytest.mark.multiprocess
def test_two_groups_of_one_library_keep_their_own_calibration(tmp_path: Path) -> None:
    assert_no_mismatches(run_ranks(subgroup_calibration_worker, 4, str(tmp_path)))


@pytest.mark.multiprocess
def test_a_default_communicator_calibrates_on_each_first_call_and_a_second_one_reads_the_cache(tmp_path: Path) -> None:
    assert_no_mismatches(run_ranks(automatic_calibration_worker, 2, str(tmp_path)))


def calibration_off_and_other_hosts_worker(rank: int, world: int, folder: str) -> list[str]:
    """Worker: other hosts measure again; calibration=False and TACCL_CALIBRATION=off measure nothing."""
    _automatic_calibration_on(folder)
    lines = _listen()
    library = [ring_algorithm(AR, world)]
    problems = []
    problems += filter(None, [_native_all_reduces(Communicator(None, library, timeout_s=30), 1024, rank)[1]])
    real = socket.gethostname
    socket.gethostname = lambda: f"elsewhere-{rank}"
    try:
        problems += filter(None, [_native_all_reduces(Communicator(None, library, timeout_s=30), 1024, rank)[1]])
    finally:
        socket.gethostname = real
    if _count(lines, "calibrated at") != 2 or len(list(Path(folder).glob("*.json"))) != 2:
        problems.append(f"other hosts did not measure again into their own file: {lines.messages}")
    given_none = Communicator(None, library, timeout_s=30, calibration=None)  # None: not given, the default
    problems += filter(None, [_native_all_reduces(given_none, 1024, rank)[1]])
    if given_none.automatic_calibration is None or _count(lines, "calibration read from") != 1:
        problems.append(f"calibration=None did not calibrate automatically: {lines.messages}")
    with pytest.raises(ArgumentError, match="calibration: 0; expected True, None or False, a file path"):
        Communicator(None, library, calibration=0)
    off = Communicator(None, library, timeout_s=30, calibration=False)
    os.environ["TACCL_CALIBRATION"] = "off"
    off_by_env = Communicator(None, library, timeout_s=30)
    for comm in (off, off_by_env):
        calls, problem = _native_all_reduces(comm, 16384, rank)
        problems += [problem] if problem else []
        if calls or comm.automatic_calibration is not None:
            problems.append(f"calibration off ran torch's all_reduce {calls} times or calibrated")
    if _count(lines, "calibrat") != 3:
        problems.append(f"calibration off logged a calibration: {lines.messages}")
    return problems


@pytest.mark.multiprocess
def test_other_hosts_measure_again_and_calibration_false_or_off_measures_nothing(tmp_path: Path) -> None:
    assert_no_mismatches(run_ranks(calibration_off_and_other_hosts_worker, 2, str(tmp_path)))


# -- its cache, in one process ---------------------------------------------------------------------


def test_the_cache_folder_is_taccl_cache_dir_then_xdg_cache_home_then_home() -> None:
    from taccl_py.runtime.communicator.calibration_cache import cache_dir

    assert cache_dir({"TACCL_CACHE_DIR": "/a", "XDG_CACHE_HOME": "/b"}) == Path("/a")
    assert cache_dir({"TACCL_CACHE_DIR": "", "XDG_CACHE_HOME": "/b"}) == Path("/b/taccl_py")
    assert cache_dir({}) == Path.home() / ".cache" / "taccl_py"


def test_every_field_of_the_key_names_its_own_cache_file() -> None:
    from taccl_py.runtime.communicator.calibration_cache import cache_path

    key = replace(KEY, hosts="a,b")
    others = [
        replace(key, world_size=4),
        replace(key, transport="cupy-nccl"),
        replace(key, device="cuda"),
        replace(key, library="fedcba9876543210"),
        replace(key, hosts="a,c"),
        replace(key, hosts="b,a"),
        replace(key, members="2,3"),
    ]
    names = {cache_path(k, "/c") for k in [key, *others]}
    assert len(names) == 8 and cache_path(key, "/c") == cache_path(replace(key), "/c")


@pytest.mark.parametrize(
    ("value", "on"), [("off", False), ("OFF", False), ("0", False), ("false", False), ("no", False), ("on", True)]
)
def test_taccl_calibration_turns_the_automatic_calibration_off(value: str, on: bool) -> None:
    from taccl_py.runtime.communicator.calibration_cache import automatic_calibration_on

    assert automatic_calibration_on({"TACCL_CALIBRATION": value}) is on
    assert automatic_calibration_on({}) is True


def test_an_unknown_taccl_calibration_is_one_error_naming_it() -> None:
    from taccl_py.runtime.communicator.calibration_cache import automatic_calibration_on

    with pytest.raises(ArgumentError, match="TACCL_CALIBRATION: 'sometimes'; expected 'on' or 'off'"):
        automatic_calibration_on({"TACCL_CALIBRATION": "sometimes"})


def test_the_automatic_calibration_measures_only_where_an_algorithm_runs() -> None:
    from taccl_py.runtime.communicator.calibration_cache import lazy_sizes
    from taccl_py.runtime.communicator.selection import AlgorithmChoices, Candidate

    ring = ring_algorithm(AR, 2)
    bands = (
        Candidate(None, 0, 1024, "lib", AR, 2),  # native
        Candidate(ring, 1024, 16384, "lib", AR, 2),  # no default size inside: its geometric middle
        Candidate(None, 16384, 1 << 20, "lib", AR, 2),
        Candidate(ring, 1 << 20, None, "lib", AR, 2),
    )
    sizes = (65536, 1 << 20, 4 << 20, 16 << 20)
    assert lazy_sizes(AlgorithmChoices(2, bands), AR, sizes) == (4096, 1 << 20, 4 << 20, 16 << 20)
    assert lazy_sizes(AlgorithmChoices(2, bands), Collective.ALLGATHER, sizes) == ()


def test_a_key_without_hosts_is_written_as_before_hosts(tmp_path: Path) -> None:
    cal = calibration((65536, "ring", 900.0, 300.0))
    write_calibration(cal, tmp_path / "old.json")
    assert "hosts" not in json.loads((tmp_path / "old.json").read_text())["key"]
    assert read_calibration(tmp_path / "old.json") == cal
    with_hosts = replace(cal, key=replace(KEY, hosts="a,b"))
    write_calibration(with_hosts, tmp_path / "new.json")
    assert read_calibration(tmp_path / "new.json") == with_hosts


def test_the_cache_adds_collectives_and_a_bad_or_unwritable_one_is_only_a_miss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from taccl_py.runtime.communicator.calibration_cache import read_cached, write_cached

    path = tmp_path / "cache" / "cal.json"
    reduce = calibration((65536, "ring", 900.0, 300.0))
    gather = calibration((4096, "ring", 1.0, 2.0), collective="allgather")
    write_cached(path, reduce, AR)
    write_cached(path, replace(reduce, points=reduce.points + gather.points), Collective.ALLGATHER)
    assert set(read_cached(path, KEY).points) == set(reduce.points + gather.points)
    assert read_cached(path, replace(KEY, hosts="x")) is None  # another group's file
    path.write_text("{")
    assert read_cached(path, KEY) is None
    (tmp_path / "file").write_text("")
    with caplog.at_level(logging.WARNING, logger="taccl_py.runtime.communicator.calibration_cache"):
        write_cached(tmp_path / "file" / "cal.json", reduce, AR)  # its folder is a file
    assert "could not cache the calibration" in caplog.text
