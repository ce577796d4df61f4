"""``taccl export-mscclpp`` and ``taccl verify`` on MSCCL++ plans: every exported plan reads back and verifies."""

from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from taccl_py.baselines import ring_algorithm as baseline_ring
from taccl_py.cli import main
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary, SizeBand, read_library, shipped_library_paths, shipped_node_counts
from taccl_py.mscclpp import check_mscclpp_plan, read_mscclpp_plan
from taccl_py.mscclpp.export import generate_mscclpp_plan
from taccl_py.mscclpp.files import generate_library_plans
from taccl_py.mscclpp.sizes import largest_addressable_size, refused_sizes
from taccl_py.synth import write_library
from taccl_py.topology import builtin_topology_names, load_topology

from helpers import FIXTURES, LARGE_BUILTINS, ring_algorithm

MSCCLPP_FIXTURES = FIXTURES / "mscclpp"
MIB = 1 << 20
NDV2_ALLGATHER = ["export-mscclpp", "ndv2", "--collective", "allgather", "--no-baselines"]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_export_writes_both_placements_of_every_band_and_each_verifies(tmp_path, capsys) -> None:
    out = tmp_path / "plans"
    # every size of every band (--all-sizes): which sizes NCCL takes is test_export_leaves_to_nccl_...,
    # which baseline's plan replaces a band's is test_export_writes_a_faster_baselines_plan_...
    args = ["export-mscclpp", "ndv2", "--collective", "reducescatter", "--all-sizes", "--no-baselines"]
    assert main([*args, "-o", str(out)]) == 0
    library = read_library(next(p for p in shipped_library_paths("ndv2", 1) if "reducescatter" in p.name))
    bands = [index for index, band in enumerate(library.bands) if not band.native]
    names = sorted(path.name for path in out.iterdir())
    expected = sorted(f"ndv2-n1-reducescatter-{i}{suffix}.json" for i in bands for suffix in ("", "-inplace"))
    assert names == expected
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"wrote {len(expected)} MSCCL++ execution plans to {out}"
    # 16-byte units of 8 output chunks per rank: band 0 serves from 128 bytes, the rest of its band is NCCL's
    narrowed = [f"ndv2-n1-reducescatter-0{s}.json: serves from 128 bytes, 0-127 left to NCCL" for s in ("", "-inplace")]
    assert [line.split(" (")[0] for line in err if "left to NCCL" in line] == narrowed
    assert err[-2].startswith("ndv2 n1 reducescatter: plans take multiples of 128 B (2), 256 B (2), every")
    for index in bands:
        band = library.bands[index]
        for suffix, inplace in (("", False), ("-inplace", True)):
            path = out / f"ndv2-n1-reducescatter-{index}{suffix}.json"
            plan = json.loads(path.read_text())
            assert plan["inplace"] is inplace and plan["min_message_size"] == (band.min_bytes or 128)
            largest = largest_addressable_size(read_mscclpp_plan(path))  # the last band's scratch: about 2.1 GiB
            assert plan["max_message_size"] == (largest if band.max_bytes is None else band.max_bytes - 1)
            assert main(["verify", str(path)]) == 0
            captured = capsys.readouterr()
            assert captured.out.startswith("ok: ndv2-n1-reducescatter-") and captured.err == ""  # no warning


def test_export_writes_a_faster_baselines_plan_instead_and_names_it(tmp_path, capsys) -> None:
    # One ring on NDv2 from 1 MiB: the best baseline that takes powers of two simulates faster
    slow = baseline_ring(load_topology("ndv2"), Collective.ALLGATHER, channels=1)
    bands = (SizeBand(0, MIB, None, "native"), SizeBand(MIB, None, slow, "1.json"))
    write_library(AlgorithmLibrary("ndv2", 1, Collective.ALLGATHER, 8, bands), tmp_path / "ag.library.json")
    args = ["export-mscclpp", str(tmp_path / "ag.library.json"), "--all-sizes", "-o"]  # NCCL's 6 rings beat both
    assert main([*args, str(tmp_path / "plans")]) == 0
    err = capsys.readouterr().err.splitlines()
    lines = [line for line in err if "baseline" in line]
    assert sorted(line.split(":")[0] for line in lines) == [
        "ndv2-n1-allgather-1-inplace.json",
        "ndv2-n1-allgather-1.json",
    ]
    rival = re.search(r"baseline (\S+) simulates \d\.\d\dx faster", lines[0])[1]
    assert rival != "ring-6ch-1p"  # faster, but it takes no power of two
    names = {p.name: json.loads(p.read_text())["name"] for p in (tmp_path / "plans").iterdir()}
    assert names["ndv2-n1-allgather-1.json"] == f"ndv2-n1-allgather-1-{rival}"
    assert names["ndv2-n1-allgather-1-inplace.json"] == f"ndv2-n1-allgather-1-{rival}-inplace"
    for path in (tmp_path / "plans").iterdir():
        assert refused_sizes(read_mscclpp_plan(path)) == (), path.name
    assert main([*args, str(tmp_path / "own"), "--no-baselines"]) == 0
    assert "baseline" not in capsys.readouterr().err
    names = {p.name: json.loads(p.read_text())["name"] for p in (tmp_path / "own").iterdir()}
    assert names["ndv2-n1-allgather-1.json"] == "ndv2-n1-allgather-1"


def test_export_leaves_to_nccl_the_sizes_where_nccls_own_rings_are_faster(tmp_path, capsys) -> None:
    # NDv2: NCCL runs 6 rings natively (48 chunks per loop, which no plan that takes powers of two has);
    # --no-baselines: NCCL is still timed, only no baseline's plan is tried (test_export_writes_a_faster_...)
    # NDv2's AllGather library from before its bands left those sizes to NCCL (issue 47): the export finds them
    out = tmp_path / "plans"
    before = FIXTURES / "libraries" / "ndv2-n1-allgather-before-native" / "allgather.library.json"
    assert main(["export-mscclpp", str(before), "--no-baselines", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "ndv2-n1-allgather-3.json: sizes 8192KB and up left to NCCL: nccl ring-6ch-1p modelled" in err
    plans = [read_mscclpp_plan(path) for path in out.iterdir()]
    for size in (MIB, 4 * MIB, 16 * MIB, 1 << 30):  # the model has NCCL faster at each
        assert not [plan.name for plan in plans if plan.min_message_size <= size <= plan.max_message_size], size
    assert any(plan.min_message_size <= 64 * 1024 <= plan.max_message_size for plan in plans)
    for plan in plans:
        assert refused_sizes(plan) == (), plan.name


def test_plans_across_machines_use_port_channels_and_verify(tmp_path) -> None:
    # the 2-node DGX-A100 AllGather library's first band and its last (976 steps; the two between are
    # the first's 496 again): every shipped 2-node library exports and verifies with --runslow
    (path,) = (p for p in shipped_library_paths("dgx-a100", 2) if p.name == "allgather.library.json")
    shipped = read_library(path)
    first, last = shipped.bands[0], shipped.bands[-1]
    bands = (first, replace(last, min_bytes=first.max_bytes, algorithm_file="1.json"))
    write_library(replace(shipped, bands=bands), tmp_path / "ag.library.json")
    out = tmp_path / "plans"
    assert main(["export-mscclpp", str(tmp_path / "ag.library.json"), "--no-baselines", "-o", str(out)]) == 0
    assert len(list(out.iterdir())) == 4  # both placements of both bands
    kinds = set()
    for path in sorted(out.iterdir()):
        plan = read_mscclpp_plan(path)
        assert check_mscclpp_plan(plan) == [], path.name
        kinds |= {channel.channel_type.value for gpu in plan.gpus for channel in gpu.channels}
    assert kinds == {"memory", "port"}


# The default run exports dgx-a100's libraries (5 s); every other machine's (5-36 s each on 2 cores)
# runs with --runslow. ndv2's point-to-point plans run in test_mscclpp_executor_script.
SLOW_EXPORTS = frozenset({"dgx2", "ndv2-teccl", "dgx1", "pcie-8gpu", "ndv2", "dgx-h100", "mi300x"}) | LARGE_BUILTINS


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_EXPORTS else n for n in builtin_topology_names()]
)
def test_every_shipped_library_of_one_machine_exports_and_verifies(name) -> None:
    topology = load_topology(name)
    for path in shipped_library_paths(name, 1):
        plans = generate_library_plans(read_library(path), topology)  # each plan is read back and verified
        assert plans.skipped == (), plans.skipped
        assert plans.files


@pytest.mark.slow
@pytest.mark.parametrize("name", builtin_topology_names())
def test_shipped_libraries_of_two_machines_export_and_verify(name) -> None:
    if 2 not in shipped_node_counts(name):
        pytest.skip(f"{name} ships no 2-node libraries")
    topology = load_topology(name, nodes=2)
    for path in shipped_library_paths(name, 2):
        plans = generate_library_plans(read_library(path), topology)
        # Every band fits MSCCL++'s limits in both placements, dgx2 x2 AllReduce bands 5 and 6, ndv2 x2
        # band 7 and ndv2-teccl x2 band 5 included (they needed 102-109 threadblocks before lanes were merged).
        assert plans.skipped == (), plans.skipped
        assert plans.files


@pytest.fixture(scope="module")
def simple_ndv2_allgather(tmp_path_factory) -> tuple[Path, str]:
    """The NDv2 AllGather library's plans written in Simple (--protocol Simple), and what the export printed."""
    out = tmp_path_factory.mktemp("export") / "Simple"
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert main([*NDV2_ALLGATHER, "--protocol", "Simple", "-o", str(out)]) == 0
    return out, err.getvalue()


def test_export_keeps_simple_where_ll_is_not_faster_and_writes_a_forced_protocol(
    tmp_path, capsys, simple_ndv2_allgather
) -> None:
    args = [*NDV2_ALLGATHER, "-o"]
    assert main([*args, str(tmp_path / "auto")]) == 0
    err = capsys.readouterr().err.splitlines()
    protocols = {p.name: json.loads(p.read_text())["protocol"] for p in (tmp_path / "auto").iterdir()}
    # On NDv2 LL's half-data lines cost more than the one handshake α it saves (tests of
    # choose_plan_protocol show where it wins); a line is printed only for an LL plan.
    assert set(protocols.values()) == {"Simple"} and not any("LL" in line for line in err)
    assert main([*args, str(tmp_path / "LL"), "--protocol", "LL"]) == 0
    forced = [(tmp_path / "LL", capsys.readouterr().err), simple_ndv2_allgather]
    for protocol, (out, err) in zip(("LL", "Simple"), forced):
        assert "simulates" not in err and "wrote" in err  # nothing was chosen
        assert {json.loads(p.read_text())["protocol"] for p in out.iterdir()} == {protocol}
    for path in sorted((tmp_path / "LL").iterdir()):
        assert main(["verify", str(path)]) == 0, path.name
    capsys.readouterr()


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [4, 8])
@pytest.mark.parametrize("name", builtin_topology_names())
def test_shipped_libraries_of_four_and_eight_machines_export_and_verify(name, nodes) -> None:
    if nodes not in shipped_node_counts(name):
        pytest.skip(f"{name} ships no {nodes}-node libraries")
    topology = load_topology(name, nodes=nodes)
    for path in shipped_library_paths(name, nodes):
        library = read_library(path)
        plans = generate_library_plans(library, topology)
        # dgx1 x4 AllReduce band 5 and dgx2 x4 band 4 fit 64 threadblocks only with gates gathered
        assert plans.skipped == (), plans.skipped
        assert plans.files


@pytest.mark.parametrize("fixture", ["allreduce.json", "allreduce_packet.json", "allreduce_pipeline.json"])
def test_verify_reads_mscclpps_own_plans(fixture, capsys) -> None:
    assert main(["verify", str(MSCCLPP_FIXTURES / fixture)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


def _declare_max(node) -> None:
    """Make every op of a plan document that declares a reduction declare ``max``."""
    if isinstance(node, dict):
        if "reduce_op" in node:
            node["reduce_op"] = "max"
        node = list(node.values())
    for value in node if isinstance(node, list) else ():
        _declare_max(value)


def test_verify_warns_where_mscclpps_executor_runs_a_correct_plan_otherwise(tmp_path, capsys) -> None:
    document = json.loads((MSCCLPP_FIXTURES / "allreduce.json").read_text())  # MSCCL++'s own: every size, sum
    _declare_max(document)
    path = tmp_path / "max.json"
    path.write_text(json.dumps(document))
    assert main(["verify", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("ok: ")
    assert captured.err.splitlines() == [
        f"warning: {path}: declares reduce_op max; MSCCL++ never reads it and sums",
        f"warning: {path}: MSCCL++ refuses 8 sizes frameworks pass in its range (1, 2, 4, 8, ... bytes): "
        "it takes multiples of 256 B (every power of two from 256 B)",
        f"warning: {path}: max_message_size 18446744073709551615 passes 4294967295 bytes, "
        "where a 32-bit offset would wrap",
    ]
    six_rings = baseline_ring(load_topology("ndv2"), Collective.ALLREDUCE)
    plan = generate_mscclpp_plan(replace(six_rings, min_bytes=MIB, max_bytes=8 * MIB))
    path.write_text(json.dumps(plan))
    assert main(["verify", str(path)]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {path}: MSCCL++ refuses 3 sizes frameworks pass in its range (1048576, 2097152, 4194304 bytes): "
        "it takes multiples of 768 B (no power of two)"
    ]


def test_verify_reads_a_plan_from_stdin(monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO((MSCCLPP_FIXTURES / "allreduce_packet.json").read_text()))
    assert main(["verify", "-"]) == 0
    assert capsys.readouterr().out.strip() == "ok: allreduce_pkt: allreduce, 2 ranks"


def _without_first(plan: dict, op_name: str) -> dict:
    """Return ``plan`` with the first op named ``op_name`` (on any GPU) removed."""
    for gpu in plan["gpus"]:
        for tb in gpu["threadblocks"]:
            for index, op in enumerate(tb["ops"]):
                if op["name"] == op_name:
                    del tb["ops"][index]
                    return plan
    raise AssertionError(f"no {op_name} op")


def test_verify_refuses_an_exported_plan_missing_one_put(tmp_path, capsys, simple_ndv2_allgather) -> None:
    out, _ = simple_ndv2_allgather
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(_without_first(json.loads((out / "ndv2-n1-allgather-0.json").read_text()), "put")))
    assert main(["verify", str(broken)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("FAILED: ndv2-n1-allgather-0: allgather, 8 ranks: ")
    assert "chunk" in lines[1] or "never written" in lines[1], lines


def test_verify_names_a_cycle_of_waits(tmp_path, capsys) -> None:
    plan = json.loads((MSCCLPP_FIXTURES / "allreduce_packet.json").read_text())
    # Both GPUs wait before they put: each waits for the other's first packet.
    for gpu in plan["gpus"]:
        ops = gpu["threadblocks"][0]["ops"]
        ops.insert(0, {"name": "wait", "channel_ids": [0], "channel_type": "memory"})
    path = tmp_path / "cycle.json"
    path.write_text(json.dumps(plan))
    assert main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert "deadlock" in out and "wait" in out


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda plan: plan["gpus"][0].pop("input_chunks"), "gpus[0].input_chunks: missing field"),
        (lambda plan: plan["gpus"][0]["remote_buffers"][0].update(rank=5), "rank"),
        (lambda plan: plan.update(protocol="LL999"), "protocol"),
    ],
)
def test_verify_refuses_a_malformed_plan_with_one_error_line(tmp_path, capsys, edit, fragment) -> None:
    plan = json.loads((MSCCLPP_FIXTURES / "allreduce_packet.json").read_text())
    edit(plan)
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(plan))
    assert main(["verify", str(path)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"error: {path}: ") and fragment in line


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["ndv2", "--nodes", "3"], "no shipped libraries at 3 nodes"),
        (["no-such-machine"], "no such library file or built-in machine"),
    ],
)
def test_export_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, fragment) -> None:
    out = tmp_path / "plans"
    assert main(["export-mscclpp", *args, "-o", str(out)]) == 2
    assert fragment in _error_line(capsys)
    assert not out.exists()


def test_export_of_a_collective_the_library_lacks_is_refused(tmp_path, capsys) -> None:
    source = next(p for p in shipped_library_paths("ndv2", 1) if "allgather" in p.name)
    out = tmp_path / "plans"
    assert main(["export-mscclpp", str(source), "--collective", "allreduce", "-o", str(out)]) == 2
    assert "no allreduce library" in _error_line(capsys)
    assert not out.exists()


def test_export_into_an_earlier_export_removes_its_stale_plans_only(tmp_path, capsys) -> None:
    ring = ring_algorithm(Collective.ALLGATHER, 2)
    folder = tmp_path / "plans"
    for name, edges in (("old", (0, 1000, None)), ("new", (0, None))):
        (tmp_path / name).mkdir()
        bands = tuple(SizeBand(low, high, ring, f"{i}.json") for i, (low, high) in enumerate(zip(edges, edges[1:])))
        write_library(AlgorithmLibrary("toy", 1, Collective.ALLGATHER, 2, bands), tmp_path / name / "ag.library.json")
    argv = ["export-mscclpp", "--no-baselines", "-o", str(folder)]
    assert main([*argv, str(tmp_path / "old" / "ag.library.json")]) == 0
    (folder / "toy-n1-allreduce-1.json").write_text("{}")  # another collective's plan: not this export's to remove
    capsys.readouterr()
    assert main([*argv, str(tmp_path / "new" / "ag.library.json")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert (
        f"removed 2 plans of an earlier export from {folder}: toy-n1-allgather-1-inplace.json, toy-n1-allgather-1.json"
        in err
    )
    names = sorted(path.name for path in folder.iterdir())
    assert names == ["toy-n1-allgather-0-inplace.json", "toy-n1-allgather-0.json", "toy-n1-allreduce-1.json"]
    # an open band ends where the output, the whole message, would pass 2^32 bytes
    assert json.loads((folder / "toy-n1-allgather-0.json").read_text())["max_message_size"] == 2**32 - 1
