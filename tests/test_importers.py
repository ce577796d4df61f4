"""Tests of taccl_py.topology.importers over real nvidia-smi, NCCL XML and TACCL samples.

Expected values are the ones the files (and shared/research/topo-data/README.md) state; the
fixtures are copies listed in tests/fixtures/README.md.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from taccl_py.errors import ArgumentError, FormatError, TopologyError
from taccl_py.topology import generate_topology, import_topology, load_topology, route
from taccl_py.topology.importers import (
    TopologyFormat,
    detect_topology_format,
    parse_nccl_topology_xml,
    parse_nvidia_smi_topo,
    parse_taccl_profile,
)
from taccl_py.topology.model import LinkKind, Topology, VertexKind

TOPO = Path(__file__).parent / "fixtures" / "topo"
BAD = Path(__file__).parent / "fixtures" / "bad_topologies_import"

# The DGX-1 / NDv2 pairs in TACCL's numbering (taccl/topologies/generic.py ndv2, docs/design.md).
TACCL_NDV2_DOUBLE = {(0, 1), (0, 4), (1, 3), (2, 3), (2, 6), (4, 5), (5, 7), (6, 7)}
TACCL_NDV2_SINGLE = {(0, 2), (0, 3), (1, 2), (1, 5), (3, 7), (4, 6), (4, 7), (5, 6)}


def load(name: str) -> Topology:
    return import_topology(TOPO / name)


def gpu_links(topo: Topology, kind: LinkKind = LinkKind.NVLINK) -> dict[tuple[int, int], tuple[int, float]]:
    """Return {(rank a, rank b): (count, GB/s)} of direct GPU-GPU links of ``kind`` (a < b), checking symmetry."""
    out = {}
    for link in topo.links:
        if link.kind is kind and link.src.startswith("gpu") and link.dst.startswith("gpu"):
            a, b = topo.vertex(link.src).rank, topo.vertex(link.dst).rank
            reverse = topo.link(link.dst, link.src)
            assert reverse is not None and (reverse.count, reverse.bandwidth_GBps) == (link.count, link.bandwidth_GBps)
            out[(min(a, b), max(a, b))] = (link.count, link.bandwidth_GBps)
    return out


def pcie_reach(topo: Topology, start: str) -> set[str]:
    """Return the vertices reachable from ``start`` through PCIe switches only (not CPUs)."""
    seen, stack = {start}, [start]
    while stack:
        for nxt in topo.graph.successors(stack.pop()):
            if nxt not in seen:
                seen.add(nxt)
                if topo.vertex(nxt).kind is VertexKind.PCIE_SWITCH:
                    stack.append(nxt)
    return seen


def nic_affinity(topo: Topology) -> dict[str, list[int]]:
    """Return, per NIC, the ranks of the GPUs sharing its PCIe switch tree."""
    return {
        nic.name: sorted(
            topo.vertex(v).rank for v in pcie_reach(topo, nic.name) if topo.vertex(v).kind is VertexKind.GPU
        )
        for nic in topo.nics()
    }


def nearest_gpus(topo: Topology, nic: str) -> list[int]:
    """Return the ranks of GPUs on the same (leaf) PCIe switch as ``nic``."""
    (switch,) = [v for v in topo.graph.successors(nic) if topo.vertex(v).kind is VertexKind.PCIE_SWITCH]
    return sorted(topo.vertex(v).rank for v in topo.graph.successors(switch) if topo.vertex(v).kind is VertexKind.GPU)


def switch_ports(topo: Topology) -> set[tuple[int, float]]:
    """Return the distinct (count, GB/s) of GPU <-> nvswitch0 links, checking every GPU has both directions."""
    ports = set()
    for gpu in topo.gpus:
        up, down = topo.link(gpu.name, "nvswitch0"), topo.link("nvswitch0", gpu.name)
        assert up is not None and down is not None and up.kind is LinkKind.NVSWITCH
        ports |= {(up.count, up.bandwidth_GBps), (down.count, down.bandwidth_GBps)}
    return ports


# -- nvidia-smi topo -m ----------------------------------------------------------------------------


def test_v100_dgx1_style_has_the_files_nvlink_pairs():
    topo = load("v100-sxm2-8gpu-dgx1-style.txt")
    assert topo.num_ranks == 8 and topo.nodes == 1 and not topo.nics()
    pairs = gpu_links(topo)
    # NV2 and NV1 cells of the file (rows GPU0..GPU7, upper triangle).
    assert {p for p, (count, _) in pairs.items() if count == 2} == {
        (0, 3),
        (0, 4),
        (1, 2),
        (1, 5),
        (2, 3),
        (4, 7),
        (5, 6),
        (6, 7),
    }
    assert {p for p, (count, _) in pairs.items() if count == 1} == {
        (0, 1),
        (0, 2),
        (1, 3),
        (2, 6),
        (3, 7),
        (4, 5),
        (4, 6),
        (5, 7),
    }
    # 6 NVLinks per GPU -> V100; NCCL's SM70 rate is 20 GB/s per link.
    assert {bw for count, bw in pairs.values() if count == 2} == {40.0}
    assert [gpu.numa for gpu in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert "nvswitch0" not in {v.name for v in topo.vertices}
    # GPU0-GPU5 is SYS: the route crosses the host link between the two NUMA nodes.
    assert LinkKind.HOST in {link.kind for link in route(topo, 0, 5).links}


def test_v100_matrix_is_taccl_ndv2_under_the_readme_mapping():
    # topo-data README: msccl-tools (= TACCL) GPU i is nvidia-smi GPU (0,3,1,2,4,7,5,6)[i].
    smi = gpu_links(load("v100-sxm2-8gpu-dgx1-style.txt"))
    taccl = gpu_links(load("topo-ndv2-1MB.json"))
    perm = (0, 3, 1, 2, 4, 7, 5, 6)
    mapped = {tuple(sorted((perm[a], perm[b]))): count for (a, b), (count, _) in taccl.items()}
    assert mapped == {pair: count for pair, (count, _) in smi.items()}


def test_dgx_a100_nv12_goes_through_one_nvswitch_and_10_nics():
    topo = load("dgx-a100-8gpu-10nic.txt")
    assert topo.num_ranks == 8
    assert not gpu_links(topo)  # every pair NV12: 8 x 7 x 12 links cannot be direct cabling
    assert switch_ports(topo) == {(12, 240.0)}  # 12 NVLink3 x NCCL's SM80 20 GB/s
    assert len(topo.nics()) == 10
    assert nic_affinity(topo) == {
        "nic0": [0, 1],
        "nic1": [0, 1],
        "nic2": [2, 3],
        "nic3": [2, 3],
        "nic4": [4, 5],
        "nic5": [4, 5],
        "nic6": [6, 7],
        "nic7": [6, 7],
        "nic8": [],
        "nic9": [],
    }
    assert [gpu.numa for gpu in topo.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert "nic0=mlx5_0" in topo.description and "nic9=mlx5_9" in topo.description
    assert route(topo, 0, 7).bandwidth_GBps == 240.0


def test_h100_nv18_13_nics_with_pix_and_pxb_affinity():
    topo = load("h100-sxm-8gpu-13nic.txt")
    assert topo.num_ranks == 8
    assert sorted(switch_ports(topo)) == [(18, pytest.approx(18 * 20.6))]  # NVLink4, NCCL's SM90 20.6 GB/s
    nics = topo.nics()
    assert len(nics) == 13
    assert [nic.net_kind for nic in nics] == [LinkKind.IB] * 8 + [LinkKind.ETHERNET] * 5
    affinity = nic_affinity(topo)
    assert affinity == {f"nic{j}": [2 * (j // 2), 2 * (j // 2) + 1] for j in range(8)} | {
        f"nic{j}": [] for j in range(8, 13)
    }
    # PIX: NIC0 sits on GPU0's switch, NIC1 on GPU1's; the other GPU of the pair is PXB away.
    assert [nearest_gpus(topo, f"nic{j}") for j in range(8)] == [[j] for j in range(8)]
    assert {nic.numa for nic in nics[8:]} == {1}  # the Ethernet ports are NODE to GPUs 4-7


def test_nvidia_smi_tabs_overrides_and_old_format():
    text = (TOPO / "v100-sxm2-8gpu-dgx1-style.txt").read_text()
    tabbed = "\n".join("\t".join(line.split("    ")) for line in text.splitlines())
    topo = parse_nvidia_smi_topo(tabbed, "tabbed", nvlink_GBps=25.0)
    assert gpu_links(topo)[(0, 3)] == (2, 50.0)
    old = (
        "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\n"
        "GPU0\t X \tPIX\tPIX\t0-11\n"
        "GPU1\tPIX\t X \tPIX\t0-11\n"
        "mlx5_0\tPIX\tPIX\t X \t\n"
    )
    topo = parse_nvidia_smi_topo(old, "old", pcie_bandwidth_GBps=16.0, net_bandwidth_GBps=50.0, net_alpha_us=3.0)
    assert nic_affinity(topo) == {"nic0": [0, 1]}
    (nic,) = topo.nics()
    assert (nic.net_kind, nic.net_bandwidth_GBps, nic.net_alpha_us) == (LinkKind.IB, 50.0, 3.0)
    r = route(topo, 0, 1)
    assert [link.kind for link in r.links] == [LinkKind.PCIE, LinkKind.PCIE] and r.bandwidth_GBps == 16.0
    with pytest.raises(ArgumentError, match="nvlink_GBps"):
        parse_nvidia_smi_topo(old, "old", nvlink_GBps=0.0)


# -- NCCL topology XML -----------------------------------------------------------------------------


def test_ibm_gx3d_h100_dump():
    topo = load("ibm-gx3d-8xh100-topo-dump.xml")
    assert topo.num_ranks == 8 and not gpu_links(topo)
    assert sorted(switch_ports(topo)) == [(18, pytest.approx(18 * 20.6))]  # 5+5+4+4 NVLinks to 4 NVSwitches, SM90
    nics = topo.nics()
    assert len(nics) == 8 and {nic.net_bandwidth_GBps for nic in nics} == {25.0}  # 200000 Mb/s / 8000
    # Each bridge holds GPU dev g and NIC mlx5_(7-g).
    assert nic_affinity(topo) == {f"nic{j}": [7 - j] for j in range(8)}
    assert [gpu.numa for gpu in topo.gpus] == [0] * 4 + [1] * 4
    assert topo.gpu(0).pci_bus_id == "0000:a4:00.0"
    assert topo.link("gpu0", "pcie0").bandwidth_GBps == 48.0  # 32 GT/s, width 0 read as 16: 16*240/80
    assert topo.link("cpu0", "cpu1").bandwidth_GBps == 22.0  # Sapphire Rapids (modelid 143)


def test_azure_ndv4_partial_file_keeps_pcie_affinity(caplog):
    with caplog.at_level(logging.WARNING):
        topo = load("azure-ndv4-topo.xml")
    assert "no NVLink information" in caplog.text
    assert topo.num_ranks == 8 and not gpu_links(topo) and "nvswitch0" not in {v.name for v in topo.vertices}
    assert len(topo.nics()) == 8 and {nic.net_kind for nic in topo.nics()} == {LinkKind.IB}  # class 0x020700
    # GPUs ranked in bus order (0001, 0002, 0003, ...); NICs too (0101, 0102, ...).
    assert nic_affinity(topo) == {f"nic{j}": [2 * (j // 2), 2 * (j // 2) + 1] for j in range(8)}
    assert [gpu.numa for gpu in topo.gpus] == [1, 1, 0, 0, 3, 3, 2, 2]
    assert topo.link("gpu0", "pcie1").bandwidth_GBps == 24.0  # 16 GT/s x16
    assert topo.link("cpu0", "cpu1").bandwidth_GBps == 16.0  # AMD family 23 (Rome)


def test_azure_ndv2_partial_file(caplog):
    with caplog.at_level(logging.WARNING):
        topo = load("azure-ndv2-topo.xml")
    assert "no NVLink information" in caplog.text
    (nic,) = topo.nics()
    assert nic.numa == 0 and [g.rank for g in topo.gpus if g.numa == 0] == [0, 1, 2, 3]
    assert topo.link("nic0", "cpu0") is not None and topo.link("cpu0", "cpu1").bandwidth_GBps == 10.0  # Skylake


def test_azure_ncv4_ignores_self_nvlinks(caplog):
    with caplog.at_level(logging.WARNING):
        topo = load("azure-ncv4-topo.xml")
    assert "no NVLink information" not in caplog.text  # the file has <gpu> elements: no NVLink is a fact here
    assert topo.num_ranks == 4 and not gpu_links(topo)
    (nic,) = topo.nics()
    assert (nic.net_kind, nic.net_bandwidth_GBps, nic.numa) == (LinkKind.ETHERNET, 12.5, 0)


def test_nccl_xml_direct_nvlinks_sum_counts():
    xml = """<system version="1"><cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
      <pci busid="0000:01:00.0" class="0x030200" link_speed="8.0 GT/s PCIe" link_width="16">
        <gpu dev="1" sm="70" rank="1" gdr="1"><nvlink target="0000:02:00.0" count="1" tclass="0x030200"/>
          <nvlink target="0000:02:00.0" count="1" tclass="0x030200"/></gpu></pci>
      <pci busid="0000:02:00.0" class="0x030200" link_speed="8.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="70" rank="0" gdr="1"><nvlink target="0000:01:00.0" count="2" tclass="0x030200"/></gpu></pci>
    </cpu></system>"""
    topo = parse_nccl_topology_xml(xml, "inline", name="two")
    assert topo.name == "two" and topo.gpu(0).pci_bus_id == "0000:02:00.0"  # ranked by dev
    assert gpu_links(topo) == {(0, 1): (2, 40.0)}
    assert topo.link("gpu0", "cpu0").bandwidth_GBps == 12.0  # Gen3 x16


def test_nccl_xml_unknown_numa_cpu_nvlink_and_unknown_nic_speed():
    xml = """<system version="1"><cpu numaid="-1" arch="ppc64">
      <pci busid="0000:04:00.0" class="0x030200" link_speed="" link_width="0">
        <gpu dev="0" sm="70" rank="0" gdr="1"><nvlink target="0000:00:00.0" count="3" tclass="0x068001"/></gpu></pci>
      <pci busid="0000:05:00.0" class="0x020700" link_speed="16 GT/s" link_width="8">
        <nic><net name="mlx5_0" dev="0" speed="-1" port="1" latency="1.5" guid="0x1" maxconn="1" gdr="1"/></nic></pci>
    </cpu><cpu numaid="0" arch="ppc64"/></system>"""
    topo = parse_nccl_topology_xml(xml)
    assert {v.name: v.numa for v in topo.vertices if v.kind is VertexKind.CPU} == {"cpu1": None, "cpu0": 0}
    to_cpu = topo.link("gpu0", "cpu1")  # POWER9: the NVLink to the CPU replaces the PCIe link
    assert (to_cpu.kind, to_cpu.count, to_cpu.bandwidth_GBps) == (LinkKind.NVLINK, 3, 60.0)
    (nic,) = topo.nics()
    assert (nic.net_kind, nic.net_bandwidth_GBps, nic.net_alpha_us) == (LinkKind.IB, 1.25, 1.5)  # NCCL's 10 Gb/s
    assert topo.link("nic0", "cpu1").bandwidth_GBps == 12.0  # 16 GT/s x8 = 8*120/80
    assert topo.link("cpu1", "cpu0").bandwidth_GBps == 32.0  # NCCL's P9_BW


def test_rccl_xml_reads_xgmi_at_the_rate_of_the_gpus_gcn_and_not_sm_as_a_compute_capability():
    # as RCCL dumps an MI250 pair: sm is the CU count, gcn the full arch name, two xGMI links each way
    gpu = """<pci busid="0000:{bus}:00.0" class="0x038000" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="{dev}" sm="110" gcn="gfx90a:sramecc+:xnack-" arch="{arch}" rank="{dev}" gdr="1">
          <xgmi target="0000:{peer}:00.0" count="2" tclass="0x038000"/></gpu></pci>"""
    xml = (
        '<system version="1"><cpu numaid="0" arch="x86_64" vendor="AuthenticAMD" familyid="25" modelid="1">'
        + gpu.format(bus="c1", dev=0, peer="c6", arch=1234)
        + gpu.format(bus="c6", dev=1, peer="c1", arch=1234)
        + "</cpu></system>"
    )
    topo = parse_nccl_topology_xml(xml, "mi250.xml")
    assert gpu_links(topo, LinkKind.XGMI) == {(0, 1): (2, 72.0)}  # 2 x MI200_XGMI_WIDTH 36
    assert topo.link("gpu0", "gpu1").alpha_us == 0.8 and "up to 2 xGMI links per GPU" in topo.description


# -- TACCL profiles ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["topo-ndv2-1MB.json", "topo-ndv2-32KB.json", "topo-ndv2-1KB.json"])
def test_ndv2_profiles_mean_the_same_machine(name):
    topo = load(name)
    pairs = gpu_links(topo)
    assert {p for p, (c, _) in pairs.items() if c == 2} == TACCL_NDV2_DOUBLE
    assert {p for p, (c, _) in pairs.items() if c == 1} == TACCL_NDV2_SINGLE
    # 1 MB: 23 and 46 µs/MB -> 1e3/23 GB/s; the scaled 1 KB and 32 KB files agree within 0.5 %.
    assert pairs[(0, 1)][1] == pytest.approx(1e3 / 23, rel=5e-3)
    assert pairs[(0, 2)][1] == pytest.approx(1e3 / 46, rel=5e-3)
    assert topo.link("gpu0", "gpu1").alpha_us == pytest.approx(0.3)
    (nic,) = topo.nics()
    assert nic.net_alpha_us == pytest.approx(2.6) and nic.net_bandwidth_GBps == pytest.approx(1e3 / 105, rel=5e-3)
    assert nic_affinity(topo) == {"nic0": [0, 1, 2, 3]}


def test_dgx2_profiles():
    topo = load("topo-dgx2-1MB.json")
    assert topo.num_ranks == 16 and switch_ports(topo) == {(6, 125.0)}  # 8 µs/MB per switch port
    assert route(topo, 0, 15).alpha_us == pytest.approx(0.3)
    assert nic_affinity(topo) == {f"nic{j}": [2 * j, 2 * j + 1] for j in range(8)}
    small = load("topo-dgx2-1KB.json")
    assert sorted({nic.net_bandwidth_GBps for nic in small.nics()}) == [pytest.approx(1e3 / 105, rel=5e-3)]
    # The 1 KB file rounds the port's 0.78 (x100) to 1: 10.24 µs/MB, as the file states.
    assert sorted(switch_ports(small)) == [(6, pytest.approx(1e3 / 10.24))]


def test_custom_matrix_and_mi300x_profiles():
    akmu = load("akmu-A-GPU4-P2P-1-GDRLEVEL-SYS-GDRREAD-1-1MB.json")
    pairs = gpu_links(akmu)
    assert set(pairs) == {(a, b) for a in range(4) for b in range(a + 1, 4)}
    assert sorted({bw for _, bw in pairs.values()}) == [pytest.approx(1e3 / 89.7)]
    assert akmu.link("gpu0", "gpu1").alpha_us == pytest.approx(108.82)
    (nic,) = akmu.nics()
    assert nic.net_alpha_us == pytest.approx(148.77) and nic.net_bandwidth_GBps == pytest.approx(1e3 / 110.03)
    mi300x = load("topo-mi300x.json")
    assert len(gpu_links(mi300x, LinkKind.XGMI)) == 28 and not gpu_links(mi300x)
    assert nic_affinity(mi300x) == {f"nic{j}": [j] for j in range(8)}


def test_taccl_profile_units_can_be_given(caplog):
    text = (TOPO / "topo-ndv2-32KB.json").read_text().replace("NDv2_32KB", "NDv2")
    given = parse_taccl_profile(text, "renamed", chunk_size_bytes=32 * 1024, time_scale=10)
    assert given.link("gpu0", "gpu1").bandwidth_GBps == pytest.approx(
        load("topo-ndv2-32KB.json").link("gpu0", "gpu1").bandwidth_GBps
    )
    with caplog.at_level(logging.WARNING):
        parse_taccl_profile(text, "renamed", chunk_size_bytes=4096)
    assert "no known time scale" in caplog.text
    with pytest.raises(ArgumentError, match="time_scale"):
        parse_taccl_profile(text, "renamed", time_scale=0)


# -- sniffing and malformed inputs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        ('"alpha": 0.3', '"alpha": NaN', r"alpha: nan is not finite"),
        ('"alpha": 0.3', '"alpha": 1e999', r"alpha: inf is not finite"),
        ('"node_betas_list": [23', '"node_betas_list": [1' + "0" * 400, r"node_betas_list\[0\]: 10+ is not a finite"),
        ('"name": "NDv2_1MB"', '"name": "NDv2_' + "1" * 5000 + 'MB"', None),
        # counts expand into count² links: a huge one exhausted memory before it was refused
        ('"gpus_per_node": 8', '"gpus_per_node": 100000000', r"gpus_per_node: 100000000 is out of range"),
        ('"nics_per_node": 1', '"nics_per_node": 100000000', r"nics_per_node: 100000000 is out of range"),
    ],
)
def test_profile_numbers_python_cannot_hold(old, new, match):
    text = (TOPO / "topo-ndv2-1MB.json").read_text()
    assert old in text
    if match is None:  # a size suffix too long to be one: the profile is read at the reference chunk size
        assert parse_taccl_profile(text.replace(old, new), "p.json").num_ranks == 8
        return
    with pytest.raises(TopologyError, match=r"^p\.json: " + match):
        parse_taccl_profile(text.replace(old, new), "p.json")


def test_import_topology_names_and_formats(tmp_path):
    assert import_topology(TOPO / "topo-ndv2-1MB.json").name == "NDv2_1MB"
    assert import_topology(TOPO / "dgx-a100-8gpu-10nic.txt", name="dgxa100").name == "dgxa100"
    assert detect_topology_format((TOPO / "azure-ndv4-topo.xml").read_text()) is TopologyFormat.NCCL_XML
    with pytest.raises(FormatError, match="cannot read"):
        import_topology(tmp_path / "missing.txt")
    ours = tmp_path / "ours.json"
    ours.write_text('{"name": "x", "vertices": [], "links": []}')
    with pytest.raises(TopologyError, match=r"ours.json: schema: missing field"):
        import_topology(ours)
    ours.write_text(generate_topology(load_topology("ndv2")))
    assert detect_topology_format(ours.read_text()) is TopologyFormat.TACCL_TOPOLOGY
    imported, builtin = import_topology(ours), load_topology("ndv2")
    assert (imported.name, imported.vertices, imported.links) == (builtin.name, builtin.vertices, builtin.links)
    assert import_topology(ours, name="mine").name == "mine"


@pytest.mark.parametrize(
    ("name", "error", "match"),
    [
        ("smi-row-wrong-length.txt", FormatError, r"line 5: row GPU3 has 10 cells; expected 11"),
        ("smi-unknown-token.txt", FormatError, r"line 4: unknown cell token 'QPI'"),
        ("smi-gpu-twice.txt", TopologyError, r"line 4: GPU1 listed twice"),
        ("smi-no-gpu-rows.txt", TopologyError, r"no GPU rows"),
        ("smi-asymmetric.txt", TopologyError, r"line 3: GPU1-GPU0 is NV2 but GPU0-GPU1 is NV1"),
        ("xml-truncated.xml", FormatError, r"line 34: malformed XML"),
        ("xml-gpu-twice-busid.xml", TopologyError, r"line 6: busid 0000:a4:00.0 listed twice"),
        ("xml-gpu-twice-dev.xml", TopologyError, r"line 7: gpu dev 0 listed twice"),
        ("xml-negative-count.xml", TopologyError, r"line 5: <nvlink> count=-4 is below 1"),
        ("xml-bad-sm.xml", TopologyError, r"line 4: <gpu> sm='ninety' is not an integer"),
        ("xml-nvlink-unknown-target.xml", TopologyError, r"line 10: nvlink to unknown target '0000:03:00.0'"),
        ("xml-unknown-link-speed.xml", TopologyError, r"line 3: unknown link_speed 'fast'"),
        ("taccl-truncated.json", FormatError, r"line 7: invalid JSON"),
        ("taccl-missing-alpha.json", TopologyError, r"alpha: missing"),
        ("taccl-three-betas.json", TopologyError, r"node_betas_list: 3 betas"),
        ("taccl-ndv2-four-gpus.json", TopologyError, r"gpus_per_node: 4 GPUs with two node betas"),
        ("taccl-matrix-shape.json", TopologyError, r"links: 3 rows; expected 4"),
        ("taccl-zero-beta.json", TopologyError, r"betas\[1\]\[2\]: 0 \(infinite bandwidth\)"),
        ("unknown-format.txt", FormatError, r"unknown topology format"),
    ],
)
def test_malformed_inputs_name_file_and_place(name, error, match):
    with pytest.raises(error, match=match) as info:
        import_topology(BAD / name)
    assert str(info.value).startswith(str(BAD / name))


def test_nccl_graph_file_is_not_a_topology():
    with pytest.raises(FormatError, match="NCCL graph file"):
        load("azure-ncv4-graph.xml")
