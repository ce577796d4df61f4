"""Calibration: the Communicator runs the group's own collective where it measured faster."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_communicator import run_collective

from taccl_py.errors import ArgumentError, FormatError
from taccl_py.ir.collectives import Collective
from taccl_py.runtime.calibration import (
    NATIVE,
    Calibration,
    CalibrationKey,
    CalibrationPoint,
    read_calibration,
    write_calibration,
)
from taccl_py.runtime.communicator import Communicator

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
    from taccl_py.runtime.calibration import calibrated_library

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
