"""Tests of ``taccl topo list|show|import|draw`` run in-process through ``taccl_py.cli.main``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from taccl_py.cli import main
from taccl_py.topology import import_topology, load_topology, read_topology
from taccl_py.topology.draw import draw_topology

from helpers import one_error_line

FIXTURES = Path(__file__).parent / "fixtures"
BAD = FIXTURES / "bad_topologies"
SMI_V100 = FIXTURES / "topo" / "v100-sxm2-8gpu-dgx1-style.txt"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_list(capsys):
    assert main(["topo", "list"]) == 0
    out = capsys.readouterr().out
    names = ("ndv2", "ndv2-teccl", "dgx1", "dgx2", "dgx-a100", "dgx-h100", "dgx-b200", "gb200-nvl72", "pcie-8gpu")
    width = len("gb200-nvl72")  # the name column is as wide as the longest built-in name
    for name in names:
        assert f"\n{name:>{width}}  " in out
    assert "ndv4" in out


def test_show_two_ndv2_names_the_nic_cut(capsys):
    assert main(["topo", "show", "ndv2", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.split()[:2] == ["allgather", "1GB"]]
    assert "52.5 ms" in line and "NIC cut: node 0 (8 GPUs)" in line
    assert "n0.nic0" in out and "0-3" in out  # the NIC and the GPUs next to it
    assert "nvlink" in out and "43.48" in out


def test_show_lists_each_link_class_once_with_the_nics_cheaper_way_back(capsys):
    assert main(["topo", "show", "ndv2", "--nodes", "2", "--sizes", "1MB"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("link class")) + 2
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith(" "))  # rows are right-aligned
    rows = [line.split() for line in lines[start:end]]
    assert [row[0] for row in rows] == ["nvlink", "nvlink", "pcie", "host", "ib"]
    assert rows[-1] == ["ib", "1", "9.524", "0.6", "(0", "back)", "4"]  # NIC -> netswitch and back, 2 NICs
    assert lines[end].startswith("note: 'A (B back)': alpha A one way, B on the way back; a NIC's link into")
    assert main(["topo", "show", "ndv2", "--nodes", "2", "--json", "--sizes", "1MB"]) == 0
    classes = json.loads(capsys.readouterr().out)["link_classes"]
    (ib,) = [c for c in classes if c["kind"] == "ib"]
    assert (ib["alpha_us"], ib["alpha_back_us"], ib["directed_links"]) == (0.6, 0.0, 4)
    assert all(c["alpha_back_us"] == c["alpha_us"] for c in classes if c["kind"] != "ib")


def test_show_one_dgx2_names_the_ingress_cut(capsys):
    assert main(["topo", "show", "dgx2"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.split()[:2] == ["allgather", "1GB"]]
    assert "7.5 ms" in line and "per-GPU ingress cut" in line


def test_show_json(capsys):
    assert main(["topo", "show", "ndv2", "--nodes", "2", "--json", "--sizes", "1GB"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["name"], document["gpus"], document["nodes"]) == ("ndv2x2", 16, 2)
    assert [nic["nearest_gpus"] for nic in document["nics"]] == [[0, 1, 2, 3], [8, 9, 10, 11]]
    bounds = {b["collective"]: b for b in document["lower_bounds"]}
    assert set(bounds) == {"allgather", "reducescatter", "allreduce", "alltoall"}
    assert bounds["allgather"]["cut_only_time_us"] == pytest.approx(52_500, rel=1e-6)  # the old figure
    assert bounds["allreduce"]["cut_only_time_us"] == pytest.approx(105_000, rel=1e-6)
    assert bounds["alltoall"]["cut_only_time_us"] == pytest.approx(420_000, rel=1e-6)  # 8 x 8 blocks of 1GB / 16
    for bound in bounds.values():  # the new figure adds the α of the cheapest route across the cut
        assert bound["cut_alpha_us"] > 0
        assert bound["time_us"] == pytest.approx(bound["bandwidth_time_us"] + bound["cut_alpha_us"], rel=1e-12)
    assert bounds["allreduce"]["kind"] == "reducescatter+allgather class" and bounds["allgather"]["kind"] == "cut"
    assert document["nccl_nvls"] == [] == document["in_network_reduction_bounds"]  # NDv2's NVLinks reduce nothing
    assert sum(c["directed_links"] for c in document["link_classes"]) == len(load_topology("ndv2", nodes=2).links)


def test_show_names_allreduces_bound_as_a_class_bound(capsys):
    assert main(["topo", "show", "ndv2", "--sizes", "1GB"]) == 0
    out = capsys.readouterr().out
    (header,) = [line for line in out.splitlines() if "cut bound" in line and "binding cut" in line]
    columns = ["collective", "size", "bound", "cut bound", "cut alpha", "latency floor", "binding cut"]
    assert re.split(r"\s{2,}", header.strip()) == columns
    (line,) = [line for line in out.splitlines() if line.strip().startswith("allreduce (RS+AG class)")]
    assert "reducescatter + allgather class bound" in line
    assert "note: allreduce: the ReduceScatter+AllGather class bound" in out
    assert "allreduce (in-network)" not in out and "NVLS allreduce" not in out


def test_show_dgx_h100_adds_the_in_network_bound_and_nccls_nvls(capsys):
    assert main(["topo", "show", "dgx-h100", "--nodes", "2", "--sizes", "1GB"]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.strip().startswith("allreduce (in-network)")]
    assert "2.503 ms" in line and "in-network reduction bound: node 0 (8 GPUs): 400 GB/s out" in line
    assert "NCCL NVLS allreduce, modelled (NVLink SHARP on n0.nvswitch: 308.6 GB/s per GPU port" in out
    (row,) = [line for line in out.splitlines() if line.split()[:2] == ["1GB", "nvls-tree"]]
    assert row.split()[2:4] == ["3.655", "ms"] and "4.478 ms" in row  # beats the RS+AG class bound
    assert main(["topo", "show", "dgx-h100", "--json", "--sizes", "1GB"]) == 0
    document = json.loads(capsys.readouterr().out)
    ((nvls),) = document["nccl_nvls"]
    assert nvls["algorithm"] == "nvls" and nvls["time_us"] == pytest.approx(4.06 + 1e9 * 9 / 8 / 308.6e3)
    (allreduce,) = [b for b in document["lower_bounds"] if b["collective"] == "allreduce"]
    ((in_network),) = document["in_network_reduction_bounds"]
    assert (allreduce["kind"], in_network["kind"]) == ("reducescatter+allgather class", "in-network reduction")
    assert in_network["time_us"] == pytest.approx(nvls["in_network_bound_us"])
    assert in_network["time_us"] < allreduce["time_us"]  # NVLS may beat the class bound, never this one


@pytest.mark.parametrize("fixture", sorted(p.name for p in BAD.glob("*.json")))
def test_show_malformed_file_is_one_error_line(fixture, capsys):
    path = BAD / fixture
    assert main(["topo", "show", str(path)]) == 2
    assert one_error_line(capsys).startswith(f"error: {path}: ")


def test_show_unknown_topology(capsys):
    assert main(["topo", "show", "ndv9"]) == 2
    assert "no such built-in topology or file; expected one of dgx-a100" in one_error_line(capsys)


def test_show_bad_sizes(capsys):
    assert main(["topo", "show", "ndv2", "--sizes", "lots"]) == 2
    assert "--sizes: cannot read size 'lots'" in one_error_line(capsys)


def test_import_writes_the_imported_machine(tmp_path, capsys):
    target = tmp_path / "v100.json"
    assert main(["topo", "import", str(SMI_V100), "-o", str(target)]) == 0
    assert "8 GPUs" in capsys.readouterr().out
    expected = import_topology(SMI_V100)
    written = read_topology(target)
    assert (written.vertices, written.links) == (expected.vertices, expected.links)


def test_import_of_our_own_format_rewrites_it(tmp_path, capsys):
    builtin = Path(__file__).parents[1] / "topologies" / "ndv2.json"
    target = tmp_path / "ndv2.json"
    assert main(["topo", "import", str(builtin), "-o", str(target)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {target}: ndv2, 8 GPUs, ")
    written, expected = read_topology(target), read_topology(builtin)
    assert (written.name, written.vertices, written.links) == (expected.name, expected.vertices, expected.links)
    assert main(["topo", "import", str(builtin), "-o", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "ndv2"


def test_import_of_a_malformed_file_of_our_own_format_names_the_field(tmp_path, capsys):
    target = tmp_path / "out.json"
    assert main(["topo", "import", str(BAD / "unknown_vertex_kind.json"), "-o", str(target)]) == 2
    assert "unknown_vertex_kind.json: vertices[2].kind: unknown vertex kind 'tpu'" in one_error_line(capsys)
    assert not target.exists()


def test_import_of_an_unreadable_format_writes_nothing(tmp_path, capsys):
    source = tmp_path / "notes.txt"
    source.write_text("not a topology\n", encoding="utf-8")
    target = tmp_path / "out.json"
    assert main(["topo", "import", str(source), "-o", str(target)]) == 2
    one_error_line(capsys)
    assert not target.exists()


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_draw(tmp_path, capsys, suffix):
    target = tmp_path / f"topo{suffix}"
    assert main(["topo", "draw", "ndv2", "--nodes", "2", "-o", str(target)]) == 0
    data = target.read_bytes()
    assert data.startswith(PNG_MAGIC) if suffix == ".png" else b"<svg" in data
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_draw_two_dgx2(tmp_path):
    target = tmp_path / "dgx2x2.png"
    draw_topology(load_topology("dgx2", nodes=2), target)
    assert target.read_bytes().startswith(PNG_MAGIC) and target.stat().st_size > 10_000


def test_draw_refuses_an_unknown_format(tmp_path, capsys):
    target = tmp_path / "topo.gif"
    assert main(["topo", "draw", "ndv2", "-o", str(target)]) == 2
    assert "unknown image format '.gif'; expected a .png or .svg file name" in one_error_line(capsys)
    assert not target.exists()
