"""Lifting MSCCL++ execution plans into our IR (taccl_py.mscclpp.lift) and ``taccl convert`` of a plan."""

from __future__ import annotations

import json

import pytest

from taccl_py.cli import main
from taccl_py.cli.algo import libraries_to_export
from taccl_py.errors import FormatError, VerificationError
from taccl_py.files import read_any_algorithm
from taccl_py.ir.algorithm import OpType
from taccl_py.mscclpp.files import mscclpp_plan_text
from taccl_py.mscclpp.lift import lift_mscclpp_plan
from taccl_py.mscclpp.parse import parse_mscclpp_plan, read_mscclpp_plan
from taccl_py.simulate import simulate
from taccl_py.topology.builtins import load_topology
from taccl_py.verify import check_algorithm, exported_inplace_form

from helpers import FIXTURES
from shipped_bands import outer_bands, shipped_band, shipped_bands

PLANS = FIXTURES / "mscclpp"
# The lifted schedule moves the same chunks between the same ranks in the same order; only
# landing slots and threadblock numbering differ, so its simulated time matches to 0.1%.
TIME_TOLERANCE = 1e-3
MACHINES = ("ndv2", "dgx-a100", "dgx1")
SIZE_BYTES = 1 << 20
# The default run lifts the first and the last band of each of ndv2's libraries (hybrid cube-mesh;
# threadblocks cut at 64 ops in allgather band 3) and dgx-a100's (NVSwitch); with --runslow also the
# bands between, dgx1's (the same schedule family as ndv2's, band for band), and ndv2's two largest
# (900 and 1800 steps, 7 s of the 26 s sweep).
LARGE_BANDS = {"ndv2": {("allreduce", 4), ("reducescatter", 3)}, "dgx-a100": set()}


def _bands():
    for machine in MACHINES:
        bands = shipped_bands(machine)
        kept = outer_bands(bands, LARGE_BANDS[machine]) if machine in LARGE_BANDS else set()
        for collective, index in bands:
            marks = [] if (collective, index) in kept else [pytest.mark.slow]
            yield pytest.param(machine, collective, index, id=f"{machine}-{collective}-{index}", marks=marks)


def _lift_text(text: str, source: str = "plan"):
    return check_algorithm(lift_mscclpp_plan(parse_mscclpp_plan(text, source)))


def _assert_same_schedule(original, lifted, machine: str) -> None:
    assert (lifted.collective, lifted.num_ranks, lifted.chunks_per_loop, lifted.inplace) == (
        original.collective,
        original.num_ranks,
        original.chunks_per_loop,
        original.inplace,
    )
    assert lifted.meta("source_format") == "mscclpp"
    topology = load_topology(machine)
    want = simulate(original, topology, SIZE_BYTES, model="chunks").time_us
    got = simulate(lifted, topology, SIZE_BYTES, model="chunks").time_us
    assert got == pytest.approx(want, rel=TIME_TOLERANCE)


@pytest.mark.parametrize("machine, collective, index", list(_bands()))
def test_round_trip_of_shipped_bands(machine, collective, index) -> None:
    algorithm = shipped_band(machine, 1, collective, index)
    lifted = _lift_text(mscclpp_plan_text(algorithm), algorithm.name)
    _assert_same_schedule(algorithm, lifted, machine)
    sent = sum(s.op.sends for p in algorithm.ranks for t in p.threadblocks for s in t.steps)
    assert sum(s.op.sends for p in lifted.ranks for t in p.threadblocks for s in t.steps) == sent


def _library_band(machine: str, collective: str, index: int):
    return shipped_band(machine, 1, collective, index)


def test_a_band_read_alone_is_the_librarys() -> None:
    library = next(lib for lib in libraries_to_export("dgx-a100", None) if lib.collective.value == "allgather")
    named = [band for band in shipped_bands("dgx-a100") if band[0] == "allgather"]
    assert named == [("allgather", i) for i, band in enumerate(library.bands) if not band.native]
    assert all(shipped_band("dgx-a100", 1, "allgather", i) == library.bands[i].algorithm for _, i in named)


def test_round_trip_in_place() -> None:
    variant, why_not = exported_inplace_form(_library_band("ndv2", "allreduce", 0))
    assert why_not is None
    lifted = _lift_text(mscclpp_plan_text(variant))
    assert lifted.inplace and lifted.ranks[0].output_chunks == 0
    _assert_same_schedule(variant, lifted, "ndv2")


def test_receives_fuse_with_the_reduction_that_follows() -> None:
    original = _library_band("ndv2", "reducescatter", 1)
    ops = {s.op for p in _lift_text(mscclpp_plan_text(original)).ranks for t in p.threadblocks for s in t.steps}
    assert OpType.RECV_REDUCE_COPY in ops and OpType.REDUCE not in ops


def test_size_band_and_protocol_carry_over() -> None:
    original = _library_band("ndv2", "allgather", 1)
    lifted = _lift_text(mscclpp_plan_text(original))
    assert (lifted.min_bytes, lifted.max_bytes, lifted.protocol) == (
        original.min_bytes,
        original.max_bytes,
        "Simple",
    )


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("allreduce", "GPU 0 tb 0 op 3 (rres): reduces a peer's memory read directly"),
        ("allreduce_pipeline", "GPU 0 tb 0 op 0 (pipeline): a pipeline cuts chunks"),
        ("reduce", "GPU 0 tb 0 op 6 (rres): reduces a peer's memory read directly"),
        ("reduce_nvls", "(glres): a switch (NVLS) reduction has no send/receive form"),
        ("reduce_nvls_pipeline", "(pipeline): a pipeline cuts chunks"),
        ("reduce_pack_tbg", "GPU 0 tb 0 op 0 (ppkt): a thread-block group cuts chunks"),
        ("transfer_pack_tbg", "GPU 0 tb 0 op 0 (ppkt): a thread-block group cuts chunks"),
    ],
)
def test_mscclpp_fixture_plans_without_two_sided_form_are_refused(name, fragment) -> None:
    plan = read_mscclpp_plan(PLANS / f"{name}.json")
    with pytest.raises(FormatError, match="expected only put/pws/pwsf") as info:
        lift_mscclpp_plan(plan)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_fixture_plan_that_fails_verification_is_not_lifted() -> None:
    with pytest.raises(VerificationError, match="race"):
        read_any_algorithm(PLANS / "reduce_tbg.json")


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: ")
    return err[0]


def _write_plan(tmp_path, algorithm) -> str:
    path = tmp_path / "plan.json"
    path.write_text(mscclpp_plan_text(algorithm))
    return str(path)


def test_cli_convert_plan_to_xml_then_verify(tmp_path, capsys) -> None:
    plan = _write_plan(tmp_path, _library_band("ndv2", "allgather", 0))
    out = tmp_path / "x.xml"
    assert main(["convert", plan, "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().err
    assert main(["verify", str(out)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


def test_cli_convert_plan_to_json(tmp_path, capsys) -> None:
    original = _library_band("ndv2", "reducescatter", 0)
    out = tmp_path / "x.json"
    assert main(["convert", _write_plan(tmp_path, original), "-o", str(out)]) == 0
    _assert_same_schedule(original, read_any_algorithm(out), "ndv2")


def _broken_plan(tmp_path) -> str:
    """Return a plan whose first put is gone: a chunk never reaches its receiver."""
    document = json.loads(mscclpp_plan_text(_library_band("ndv2", "allgather", 0)))
    for gpu in document["gpus"]:
        for tb in gpu["threadblocks"]:
            puts = [i for i, op in enumerate(tb["ops"]) if op["name"] == "put"]
            if puts:
                tb["ops"][puts[0]] = {"name": "nop"}
                path = tmp_path / "broken.json"
                path.write_text(json.dumps(document))
                return str(path)
    raise AssertionError("no put")


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda tmp: str(PLANS / "reduce_nvls.json"), "(glres): a switch (NVLS) reduction"),
        (_broken_plan, "incorrect: "),
        (lambda tmp: _text(tmp, '{"name": "x", "gpus": [{"threadblocks": []}]}'), "plan.json: "),
    ],
    ids=["refused", "unverified", "malformed"],
)
def test_cli_convert_faults_write_nothing(tmp_path, capsys, make, fragment) -> None:
    source = make(tmp_path)
    out = tmp_path / "out" / "x.xml"
    out.parent.mkdir()
    assert main(["convert", source, "-o", str(out)]) == 2
    assert fragment in _error_line(capsys)
    assert list(out.parent.iterdir()) == []


def _text(tmp_path, text: str) -> str:
    path = tmp_path / "plan.json"
    path.write_text(text)
    return str(path)
