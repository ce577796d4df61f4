"""NCCL topology XML export: round trip through the importer for every built-in, CLI."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import networkx as nx
import pytest

from taccl_py.cli import main
from taccl_py.errors import ArgumentError
from taccl_py.topology import import_topology, load_topology
from taccl_py.topology.importers.nccl_xml import parse_nccl_topology_xml
from taccl_py.topology.model import LinkKind, Topology, VertexKind
from taccl_py.topology.nccl_export import generate_nccl_topology_xml, write_nccl_topology_xml

BUILTINS = ["ndv2", "dgx2", "dgx-a100", "dgx-h100", "pcie-8gpu"]


def _nvlinks(topology: Topology) -> dict[tuple[int, int | str], int]:
    """Return NVLink counts GPU -> GPU by rank, and GPU -> NVSwitch under ``"nvswitch"``."""
    counts: dict[tuple[int, int | str], int] = {}
    for link in topology.links:
        src, dst = topology.vertex(link.src), topology.vertex(link.dst)
        if src.kind is VertexKind.GPU and link.kind is LinkKind.NVLINK and dst.kind is VertexKind.GPU:
            counts[(src.rank, dst.rank)] = link.count
        elif src.kind is VertexKind.GPU and link.kind is LinkKind.NVSWITCH:
            counts[(src.rank, "nvswitch")] = link.count
    return counts


def _nic_affinity(topology: Topology) -> dict[int, tuple[frozenset[int], int | None]]:
    """Return, per NIC, the GPUs reachable through PCIe switches alone (no CPU) and its NUMA node."""
    graph = nx.Graph()
    for link in topology.links:
        ends = (topology.vertex(link.src), topology.vertex(link.dst))
        if link.kind is LinkKind.PCIE and all(v.kind is not VertexKind.CPU for v in ends):
            graph.add_edge(link.src, link.dst)
    result = {}
    for nic in topology.nics():
        near = nx.node_connected_component(graph, nic.name) if nic.name in graph else {nic.name}
        gpus = frozenset(topology.vertex(n).rank for n in near if topology.vertex(n).kind is VertexKind.GPU)
        result[nic.local_index] = (gpus, nic.numa)
    return result


@pytest.mark.parametrize("name", BUILTINS)
def test_round_trip_through_the_importer(name: str) -> None:
    topology = load_topology(name)
    back = parse_nccl_topology_xml(generate_nccl_topology_xml(topology), f"{name}.xml")
    assert back.num_ranks == topology.num_ranks
    assert _nvlinks(back) == _nvlinks(topology)
    assert _nic_affinity(back) == _nic_affinity(topology)
    for mine, theirs in zip(topology.nics(), back.nics()):
        assert theirs.net_kind is mine.net_kind
        assert theirs.net_bandwidth_GBps == pytest.approx(mine.net_bandwidth_GBps, rel=1e-4)


def test_xml_is_well_formed_with_unique_bus_ids_and_stable() -> None:
    topology = load_topology("dgx2")
    text = generate_nccl_topology_xml(topology)
    assert text == generate_nccl_topology_xml(topology)
    root = ET.fromstring(text)
    assert root.tag == "system" and root.get("version") == "1"
    buses = [pci.get("busid") for pci in root.iter("pci")]
    assert len(buses) == len(set(buses))
    gpus = [gpu for gpu in root.iter("gpu")]
    assert [int(g.get("dev")) for g in gpus] == sorted(int(g.get("dev")) for g in gpus)
    assert {g.get("sm") for g in gpus} == {"70"}  # 6 NVLinks at 20.8 GB/s each: a V100


def test_real_bus_ids_are_kept() -> None:
    topology = load_topology("dgx-a100")
    root = ET.fromstring(generate_nccl_topology_xml(topology, sm=80))
    bus_of_dev = {
        int(pci.find("gpu").get("dev")): pci.get("busid") for pci in root.iter("pci") if pci.find("gpu") is not None
    }
    assert bus_of_dev == {r: topology.gpu(r).pci_bus_id for r in range(8)}
    assert {g.get("sm") for g in root.iter("gpu")} == {"80"}


def test_amd_gpus_are_written_as_rccl_reads_them_and_keep_their_xgmi_mesh() -> None:
    topology = load_topology("mi300x")
    text = generate_nccl_topology_xml(topology)
    root = ET.fromstring(text)
    bus_of_gpu = {
        pci.find("gpu").get("dev"): pci.get("busid") for pci in root.iter("pci") if pci.find("gpu") is not None
    }
    for gpu in root.iter("gpu"):
        assert gpu.get("gcn") == "gfx942" and gpu.get("sm") is None  # RCCL reads sm as a CU count
        links = [(x.get("target"), x.get("count"), x.get("tclass")) for x in gpu]
        peers = {bus for dev, bus in bus_of_gpu.items() if dev != gpu.get("dev")}
        assert [child.tag for child in gpu] == ["xgmi"] * 7 and {t for t, _, _ in links} == peers
        assert {(count, tclass) for _, count, tclass in links} == {("1", "0x030200")}
    back = parse_nccl_topology_xml(text, "mi300x.xml")
    xgmi = {(link.src, link.dst): link for link in back.links if link.kind is LinkKind.XGMI}
    assert len(xgmi) == 56 and {(link.bandwidth_GBps, link.count) for link in xgmi.values()} == {(48.0, 1)}
    assert all(len({dst for src, dst in xgmi if src == gpu.name}) == 7 for gpu in back.gpus)
    assert xgmi.keys() == {(link.src, link.dst) for link in topology.links if link.kind is LinkKind.XGMI}


def test_cli_exports_mi300x_by_its_azure_name_and_lists_the_alias(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "topo.xml"
    assert main(["topo", "export-nccl", "NDmi300xV5", "-o", str(out)]) == 0
    assert 'gcn="gfx942"' in out.read_text() and "<nvlink" not in out.read_text()
    assert main(["topo", "list"]) == 0
    (row,) = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["mi300x"]]
    assert row[1] == "ndmi300xv5"


def test_multi_node_topology_is_refused() -> None:
    with pytest.raises(ArgumentError, match="nodes: topology spans 2 nodes"):
        generate_nccl_topology_xml(load_topology("ndv2", nodes=2))


def test_write_and_import_back(tmp_path: Path) -> None:
    path = tmp_path / "ndv2.xml"
    write_nccl_topology_xml(load_topology("ndv2"), path)
    assert import_topology(path).num_ranks == 8


def test_cli_export_nccl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "topo.xml"
    assert main(["topo", "export-nccl", "dgx-h100", "-o", str(out)]) == 0
    assert "NCCL_TOPO_FILE=" in capsys.readouterr().out
    assert _nvlinks(import_topology(out)) == _nvlinks(load_topology("dgx-h100"))


def test_cli_export_nccl_unknown_topology(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "topo.xml"
    assert main(["topo", "export-nccl", "no-such-machine", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "no-such-machine" in err[0]
    assert not out.exists()
