"""Process groups: Megatron layouts, placements, the group topology with shared links, group libraries, the CLI."""

from __future__ import annotations

import json

import pytest

from taccl_py.baselines.nccl import nccl_best_times
from taccl_py.bounds import lower_bound
from taccl_py.cli import main
from taccl_py.errors import ArgumentError, FormatError
from taccl_py.ir.algorithm_json import read_algorithm
from taccl_py.ir.library import GroupRecord, parse_library, read_library
from taccl_py.placement.groups import group_topology, link_sharing, placement_classes, record_topology
from taccl_py.placement.parallel import parallel_groups, parse_parallel, parse_ranks, placed, read_placement
from taccl_py.synth import write_library
from taccl_py.synth.groups import group_topologies, synthesize_groups
from taccl_py.topology import load_topology
from taccl_py.topology.model import VertexKind, route

from helpers import assert_valid_algorithm

RAILS_X4 = [tuple(gpu + 8 * node for node in range(4)) for gpu in range(8)]


def test_megatron_order_tensor_parallel_fastest():
    tp, dp = parallel_groups({"tp": 4, "dp": 2}, 8)
    assert (tp.kind, tp.groups) == ("tp", ((0, 1, 2, 3), (4, 5, 6, 7)))
    assert (dp.kind, dp.groups) == ("dp", ((0, 4), (1, 5), (2, 6), (3, 7)))
    tp, dp, pp = parallel_groups({"tp": 2, "dp": 2, "pp": 2}, 8)
    assert tp.groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert dp.groups == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert pp.groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    (dp_only,) = parallel_groups({"tp": 1, "dp": 8}, 8)  # a kind of one rank per group has no collective
    assert dp_only.groups == (tuple(range(8)),)


@pytest.mark.parametrize(
    "text, fault",
    [("tp=3,dp=2", "makes 6 ranks"), ("tp=8,ep=2", "KIND=SIZE"), ("tp=4,tp=2", "KIND=SIZE"), ("tp=0,dp=8", "KIND")],
)
def test_parallel_spec_faults(text, fault):
    with pytest.raises(ArgumentError, match=fault):
        parallel_groups(parse_parallel(text), 8)


def test_ranks_are_sorted_as_torch_sorts_them():
    assert parse_ranks("24,0,16,8") == (0, 8, 16, 24)
    for bad in ("0", "0,0", "0,x", "-1,2"):
        with pytest.raises(ArgumentError):
            parse_ranks(bad)


def test_placement_file(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"schema": "taccl-placement/1", "gpus": [1, 0, 3, 2]}))
    placement = read_placement(path, 4)
    assert placed([(0, 1), (2, 3)], placement) == [(1, 0), (3, 2)]
    path.write_text(json.dumps({"schema": "taccl-placement/1", "gpus": [0, 0, 1, 2]}))
    with pytest.raises(FormatError, match="gpus"):
        read_placement(path, 4)


def test_rail_keeps_its_own_nic_whole_on_dgx_h100():
    topology = load_topology("dgx-h100", nodes=4)
    sharing = link_sharing(topology, RAILS_X4)
    assert max(sharing.values()) == 1, "each rail crosses only its own NIC"
    group = group_topology(topology, RAILS_X4[3], sharing)
    assert (group.num_ranks, group.nodes) == (4, 4)
    assert [gpu.name for gpu in group.gpus] == [f"n{node}.gpu3" for node in range(4)]
    assert route(group, 0, 1).bandwidth_GBps == route(topology, 3, 11).bandwidth_GBps
    assert sum(v.kind is VertexKind.GPU for v in group.vertices) == 4, "the other GPUs are left out"


def test_ndv2_nic_is_shared_by_all_eight_rails():
    topology = load_topology("ndv2", nodes=4)
    sharing = link_sharing(topology, RAILS_X4)
    alone = group_topology(topology, RAILS_X4[0])
    shared = group_topology(topology, RAILS_X4[0], sharing)
    assert route(shared, 0, 1).bandwidth_GBps == pytest.approx(route(alone, 0, 1).bandwidth_GBps / 8)
    size = 64 << 20
    assert lower_bound(shared, "allreduce", size).time_us > 7 * lower_bound(alone, "allreduce", size).time_us
    classes = placement_classes(topology, RAILS_X4, sharing)
    assert sorted(len(c) for c in classes) == [4, 4], "GPUs under the NIC's CPU and under the other one"


def test_group_topology_faults():
    topology = load_topology("dgx-h100", nodes=2)
    with pytest.raises(ArgumentError, match="the same number"):
        group_topology(topology, (0, 1, 8))
    with pytest.raises(ArgumentError, match="machine by machine"):
        group_topology(topology, (8, 0))
    with pytest.raises(ArgumentError, match="at least two"):
        group_topology(topology, (3,))


def test_ndv2_data_parallel_pairs_split_by_nvlink_width():
    topology = load_topology("ndv2")
    (_, dp) = parallel_groups({"tp": 4, "dp": 2}, 8)
    classes = group_topologies(topology, dp)
    assert [record.groups for record, _ in classes] == [((0, 4), (2, 6)), ((1, 5), (3, 7))]
    assert [record.members for record, _ in classes] == [(0, 4), (1, 5)]


def test_group_library_round_trip_and_faults(tmp_path):
    topology = load_topology("ndv2")
    (tp, _) = parallel_groups({"tp": 4, "dp": 2}, 8)
    (outcome,) = synthesize_groups(topology, "allgather", tp, sizes=(1 << 16, 1 << 22), machine="ndv2")
    library = outcome.library
    assert (library.topology, library.nodes, library.num_ranks) == ("ndv2", 1, 4)
    assert library.group == GroupRecord("tp", 8, (0, 1, 2, 3), ((0, 1, 2, 3), (4, 5, 6, 7)))
    assert record_topology(topology, library.group).num_ranks == 4
    assert library.group.serves([4, 5, 6, 7]) and not library.group.serves([0, 2, 4, 6])
    path = tmp_path / "allgather.library.json"
    write_library(library, path)
    assert read_library(path).group == library.group
    obj = json.loads(path.read_text())
    obj["group"]["members"] = [0, 1, 2, 5]
    with pytest.raises(FormatError, match="group.groups"):
        parse_library(json.dumps(obj), "lib.json", tmp_path)
    obj["group"]["members"] = [0, 1, 2]
    with pytest.raises(FormatError, match="num_ranks"):
        parse_library(json.dumps(obj), "lib.json", tmp_path)


def test_shared_data_parallel_library_never_behind_nccl():
    topology = load_topology("ndv2", nodes=2)
    (dp,) = (k for k in parallel_groups({"tp": 8, "dp": 2}, 16) if k.kind == "dp")
    sizes = (1 << 20, 1 << 26)
    for outcome in synthesize_groups(topology, "allreduce", dp, sizes=sizes):
        nccl = nccl_best_times(outcome.topology, "allreduce", sizes)
        for choice, best in zip(outcome.result.choices, nccl):
            assert choice.native or choice.chosen_result.time_us <= best.time_us * 1.000001
            assert choice.chosen_result.fraction_of_bound <= 1.0


def test_cli_parallel_writes_a_library_per_class(tmp_path, capsys):
    out = tmp_path / "groups"
    argv = ["synthesize", "-t", "ndv2", "-c", "allreduce", "--parallel", "tp=4,dp=2", "--sizes", "1MB", "-j", "1"]
    assert main([*argv, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "dp groups of 2: 2 alike, members 1,5" in printed
    assert sorted(p.name for p in out.iterdir()) == ["dp-0", "dp-1", "tp-0"]
    argv[argv.index("allreduce")] = "allgather"
    assert main([*argv, "-o", str(out)]) == 0, "the folder takes every collective's libraries"
    assert (out / "tp-0" / "allgather.library.json").is_file() and (out / "tp-0" / "allreduce.library.json").is_file()
    for folder in out.iterdir():
        library = read_library(folder / "allreduce.library.json")
        assert library.group is not None and library.group.kind == folder.name.split("-")[0]
        assert library.provenance.command.startswith("taccl synthesize")
        for band in library.bands:
            assert band.native or assert_valid_algorithm(band.algorithm)
    capsys.readouterr()
    assert main(["simulate", str(out / "dp-1" / "allreduce.library.json"), "--sizes", "1MB"]) == 0
    assert "2 ranks on ndv2[dp 1,5]" in capsys.readouterr().out, "a group library runs on its group's part"
    exported = tmp_path / "xml"
    for kind in ("tp-0", "dp-0", "dp-1"):  # one folder for the job: each group's files keep their own names
        assert main(["export-msccl", str(out / kind / "allreduce.library.json"), "-o", str(exported)]) == 0
        assert main(["export-mscclpp", str(out / kind / "allreduce.library.json"), "-o", str(tmp_path / "pp")]) == 0
    for folder, ext in ((exported, ".xml"), (tmp_path / "pp", ".json")):
        names = sorted(p.name for p in folder.iterdir())
        assert {name.split("-allreduce")[0] for name in names} == {"ndv2-n1-tp-0", "ndv2-n1-dp-0", "ndv2-n1-dp-1"}
        assert all(main(["verify", str(folder / name)]) == 0 for name in names if name.endswith(ext))


def test_cli_ranks_one_group(tmp_path, capsys):
    out = tmp_path / "a.json"
    argv = ["synthesize", "-t", "ndv2", "--nodes", "2", "-c", "allgather", "--ranks", "0,8", "--size", "1MB", "-j", "1"]
    assert main([*argv, "-o", str(out)]) == 0
    algorithm = read_algorithm(str(out))
    assert algorithm.num_ranks == 2
    assert_valid_algorithm(algorithm)


@pytest.mark.parametrize(
    "extra, fault",
    [
        (["--ranks", "0,99", "-o", "a.json"], "rank 99"),
        (["--parallel", "tp=3,dp=2", "-o", "dir"], "makes 6 ranks"),
        (["--parallel", "tp=4,dp=2", "-o", "a.json"], "a folder of libraries"),
    ],
)
def test_cli_group_faults(extra, fault, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["synthesize", "-t", "ndv2", "-c", "allreduce", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and fault in err[-1]
    assert not list(tmp_path.iterdir()), "nothing written on failure"
