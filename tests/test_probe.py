"""The live probe: every source parsed from recorded outputs, NVML and sysfs faked from real data.

Fixtures (tests/fixtures/probe, provenance in tests/fixtures/README.md): `nvidia-smi nvlink -s`,
`nvidia-smi topo -m` and `--query-gpu` outputs, ibstatus lines (the sysfs port files verbatim),
sysfs PCIe link files and a resolved sysfs path, and an NCCL dump of an 8x H100 VM from which a
fake NVML and a fake sysfs tree are built.
"""

from __future__ import annotations

import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from taccl_py.cli import main
from taccl_py.errors import FormatError, TopologyError
from taccl_py.placement import place_pipeline
from taccl_py.topology import compose_nodes, read_topology, route
from taccl_py.topology.importers.nccl_xml import parse_nccl_topology_xml
from taccl_py.topology.importers.nvidia_smi_matrix import parse_topo_matrix
from taccl_py.topology.model import LinkKind, Topology, VertexKind
from taccl_py.topology.nccl_export import generate_nccl_topology_xml
from taccl_py.topology.probe import collect_nvml, probe_machine, probe_topology
from taccl_py.topology.probe.build import nvlink_version_of_rate
from taccl_py.topology.probe.sources import (
    normalize_pci_bus_id,
    parse_gpu_query_csv,
    parse_ib_rate_gbps,
    parse_ib_state,
    parse_nvlink_status,
    parse_pcie_speed_gts,
    pcie_bandwidth_GBps,
    read_pci_device,
    read_sysfs_nics,
)

FIXTURES = Path(__file__).parent / "fixtures" / "probe"


def _text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


# -- nvidia-smi nvlink -s ------------------------------------------------------------------------


def test_nvlink_status_v100_with_inactive_links() -> None:
    (gpu,) = parse_nvlink_status(_text("nvlink-s-v100-azhpc-diagnostics-73.txt"))
    assert (gpu.index, gpu.name) == (3, "Tesla V100-SXM2-32GB")
    assert gpu.links == ((0, 25.781), (1, 25.781), (2, 25.781), (3, None), (4, 25.781), (5, None))
    assert nvlink_version_of_rate(gpu.active_rates_GBps[0]) == "2.0"


def test_nvlink_status_a100_with_tab_indent_and_elision() -> None:
    gpus = parse_nvlink_status(_text("nvlink-s-a100-nccl-tests-228.txt"))
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[0].name == "NVIDIA A100-SXM4-80GB"
    assert len(gpus[0].active_rates_GBps) == 12 and set(gpus[0].active_rates_GBps) == {25.0}
    assert len(gpus[2].links) == 1
    assert nvlink_version_of_rate(25.0) == "3.0"


def test_nvlink_status_gb200_and_rtx_a6000() -> None:
    gb200 = parse_nvlink_status(_text("nvlink-s-gb200-k8s-test-infra-371.txt"))
    assert len(gb200[0].active_rates_GBps) == 18 and nvlink_version_of_rate(gb200[0].active_rates_GBps[0]) == "5.0"
    a6000 = parse_nvlink_status(_text("nvlink-s-rtx-a6000-siboehm-bench.txt"))
    assert [len(g.links) for g in a6000] == [4, 4, 0]  # GPU 2: "NVML: Unable to retrieve NVLink information"
    assert nvlink_version_of_rate(a6000[0].active_rates_GBps[0]) == "3.1"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("\t Link 0: 25 GB/s\n", "line 1: link line before any GPU line"),
        ("GPU 0: NVIDIA A100 (UUID: GPU-1)\n\t Link 0: fast\n", "line 2: cannot read link rate 'fast'"),
        ("NVIDIA-SMI has failed\n", "no 'GPU <i>: <name>' line"),
    ],
)
def test_nvlink_status_faults(text: str, match: str) -> None:
    with pytest.raises(FormatError, match=match):
        parse_nvlink_status(text)


# -- nvidia-smi topo -m and --query-gpu ------------------------------------------------------------


def test_topo_matrix_dgx_a100() -> None:
    matrix = parse_topo_matrix(_text("topo-m-dgx-a100-8gpu-10nic.txt"))
    assert matrix.gpus == tuple(f"GPU{i}" for i in range(8)) and len(matrix.nics) == 10
    assert matrix.nic_names["NIC0"] == "mlx5_0" and matrix.nic_names["NIC9"] == "mlx5_9"
    assert matrix.nvlinks("GPU0", "GPU7") == 12
    assert matrix.numa["GPU0"] == 3 and matrix.numa["GPU6"] == 5
    assert matrix.cells[("GPU0", "NIC1")] == "PXB" and matrix.cells[("GPU0", "NIC2")] == "SYS"


def test_topo_matrix_v100_hybrid_cube_mesh_and_h100() -> None:
    v100 = parse_topo_matrix(_text("topo-m-v100-dgx1.txt"))
    assert (v100.nvlinks("GPU0", "GPU3"), v100.nvlinks("GPU0", "GPU1"), v100.nvlinks("GPU0", "GPU5")) == (2, 1, 0)
    assert v100.nics == () and v100.numa["GPU4"] == 1
    h100 = parse_topo_matrix(_text("topo-m-h100-8gpu-13nic.txt"))
    assert h100.nic_names["NIC0"] == "mlx5_ib0" and h100.cells[("GPU1", "NIC1")] == "PIX"
    assert h100.nvlinks("GPU2", "GPU5") == 18


def test_topo_matrix_without_header() -> None:
    with pytest.raises(FormatError, match="no header row starting with GPU0"):
        parse_topo_matrix("Failed to run topology matrix\n")


def test_query_gpu_csv_without_and_with_header() -> None:
    rows = parse_gpu_query_csv(_text("query-gpu-xmrig-nvidia-69.csv"), ("name", "pci.bus_id"))
    assert [normalize_pci_bus_id(r["pci.bus_id"]) for r in rows][-1] == "0000:08:00.0"
    assert rows[1]["name"] == "GeForce GTX 750 Ti"
    rows = parse_gpu_query_csv(_text("query-gpu-nuxhash-10.csv"), ("name", "pci.bus", "index", "uuid"))
    assert len(rows) == 5 and rows[4]["index"] == "4" and rows[1]["name"] == "GeForce GTX 1080 Ti"
    with pytest.raises(FormatError, match="line 1: 4 fields"):
        parse_gpu_query_csv(_text("query-gpu-nuxhash-10.csv"), ("index", "pci.bus_id", "name"))


@pytest.mark.parametrize("bad", ["07:00.0", "0000:07:00", "zz:07:00.0"])
def test_bad_pci_bus_id(bad: str) -> None:
    with pytest.raises(FormatError, match="cannot read PCI bus id"):
        normalize_pci_bus_id(bad)


# -- sysfs ---------------------------------------------------------------------------------------


def _ibstatus_values(port: int = 0) -> dict[str, str]:
    """Return the state/rate/link_layer lines of the recorded ibstatus (sysfs files verbatim)."""
    block = _text("ibstatus-nccl-1866.txt").split("\n\n")[port]
    return {
        key: value.strip() for key, value in re.findall(r"^\s+(state|rate|link_layer):\s+(.*)$", block, re.MULTILINE)
    }


def _pci_link_values() -> dict[tuple[str, str], str]:
    found = re.findall(r"==> /sys/bus/pci/devices/(\S+)/(\w+) <==\n(.*)\n", _text("pci-link-nokyan-resources-512.txt"))
    return {(device, name): value for device, name, value in found}


def _make_pci(
    root: Path, chain: list[str], numa: int | None = None, speed: str | None = None, width: str | None = None
) -> Path:
    """Create sys/devices/<chain...> and the sys/bus/pci/devices/<bus id> link to it."""
    directory = root.joinpath("sys/devices", *chain)
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in (("numa_node", numa), ("max_link_speed", speed), ("max_link_width", width)):
        if value is not None:
            (directory / name).write_text(f"{value}\n")
    link = root / "sys/bus/pci/devices" / chain[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(os.path.relpath(directory, link.parent))
    return directory


def _make_ib(root: Path, device: Path, name: str, rate: str, state: str, layer: str) -> None:
    """Create <device>/infiniband/<name>/ports/1/{rate,state,link_layer} and its class links."""
    directory = device / "infiniband" / name
    port = directory / "ports" / "1"
    port.mkdir(parents=True)
    for key, value in (("rate", rate), ("state", state), ("link_layer", layer)):
        (port / key).write_text(f"{value}\n")
    (directory / "device").symlink_to(os.path.relpath(device, directory))
    entry = root / "sys/class/infiniband" / name
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.symlink_to(os.path.relpath(directory, entry.parent))


def test_ib_rate_and_state_from_recorded_port_files() -> None:
    values = _ibstatus_values()
    assert parse_ib_rate_gbps(values["rate"]) == 100.0
    assert parse_ib_state(values["state"]) == "ACTIVE"
    with pytest.raises(FormatError, match="cannot read port rate"):
        parse_ib_rate_gbps("fast")
    with pytest.raises(FormatError, match="cannot read port state"):
        parse_ib_state("ACTIVE")


def test_pcie_link_files() -> None:
    values = _pci_link_values()
    assert parse_pcie_speed_gts(values[("0000:01:00.0", "max_link_speed")]) == 32.0
    assert parse_pcie_speed_gts(values[("0000:01:00.0", "current_link_speed")]) == 16.0
    assert pcie_bandwidth_GBps(32.0, int(values[("0000:03:00.0", "max_link_width")])) == 48.0
    assert pcie_bandwidth_GBps(16.0, int(values[("0000:01:00.0", "current_link_width")])) == 12.0


def test_rdma_port_found_on_its_recorded_pci_path(tmp_path: Path) -> None:
    recorded = re.search(r"</sys/devices/(\S+?)/infiniband/(mlx5_\d+)/", _text("sysfs-path-netdata-9091.txt"))
    chain, name = recorded.group(1).split("/"), recorded.group(2)
    values = _ibstatus_values()
    device = _make_pci(tmp_path, chain, numa=0, speed="16.0 GT/s PCIe", width="16")
    _make_ib(tmp_path, device, name, values["rate"], values["state"], values["link_layer"])
    (nic,) = read_sysfs_nics(tmp_path)
    assert (nic.name, nic.port, nic.rate_gbps, nic.state, nic.link_layer) == ("mlx5_0", 1, 100.0, "ACTIVE", "Ethernet")
    assert nic.device.chain == ("pci0000:5d", "0000:5d:00.0", "0000:5e:00.0")
    assert nic.device.bus_id == "0000:5e:00.0" and nic.device.bandwidth_GBps == 24.0
    assert read_pci_device(tmp_path, "0000:5e:00.0").numa == 0
    assert read_pci_device(tmp_path, "0000:99:00.0") is None


def test_net_devices_without_pci_device_and_rdma_netdevs_are_left_out(tmp_path: Path) -> None:
    device = _make_pci(tmp_path, ["pci0000:00", "0000:00:01.0", "0000:01:00.0"])
    _make_ib(tmp_path, device, "mlx5_0", "200 Gb/sec (4X HDR)", "4: ACTIVE", "InfiniBand")
    for name, target in (("lo", None), ("ib0", device), ("eno1", _make_pci(tmp_path, ["pci0000:00", "0000:00:1f.6"]))):
        entry = tmp_path / "sys/class/net" / name
        entry.mkdir(parents=True)
        (entry / "speed").write_text("1000\n")
        (entry / "operstate").write_text("up\n")
        if target is not None:
            (entry / "device").symlink_to(os.path.relpath(target, entry))
    names = [(nic.name, nic.rdma) for nic in read_sysfs_nics(tmp_path)]
    assert names == [("mlx5_0", True), ("eno1", False)]


# -- end to end: NVML and sysfs from the NCCL dump of an 8x H100 VM --------------------------------


def _dump() -> tuple[list[dict], list[dict]]:
    """Return the GPUs and NICs of the recorded NCCL dump with their bridge, NUMA and link."""
    gpus, nics = [], []
    for cpu in ET.fromstring(_text("nccl-dump-ibm-gx3d-8xh100.xml")).findall("cpu"):
        for bridge in cpu.findall("pci"):
            for pci in bridge.findall("pci"):
                common = {
                    "bus": pci.get("busid"),
                    "bridge": bridge.get("busid"),
                    "numa": int(cpu.get("numaid")),
                    "speed": pci.get("link_speed"),
                    "width": pci.get("link_width"),
                }
                if pci.find("gpu") is not None:
                    gpu = pci.find("gpu")
                    nvlinks = [(n.get("target"), int(n.get("count"))) for n in gpu.findall("nvlink")]
                    gpus.append(common | {"dev": int(gpu.get("dev")), "nvlinks": nvlinks})
                else:
                    net = pci.find("nic").find("net")
                    nics.append(common | {"name": net.get("name"), "mbps": int(net.get("speed"))})
    return sorted(gpus, key=lambda g: g["dev"]), nics


class FakeNvml:
    """A pynvml stand-in serving the dump's GPUs; records every call."""

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 36  # as nvidia-ml-py 13 exports: slots past a GPU's links fail

    class NVMLError(Exception):
        """pynvml's error root."""

    def __init__(self, gpus: list[dict], fail_init: str | None = None) -> None:
        self.gpus = gpus
        self.fail_init = fail_init
        self.calls: list[tuple] = []
        self.slots = [[target for target, count in g["nvlinks"] for _ in range(count)] for g in gpus]

    def _log(self, *call: object) -> None:
        self.calls.append(call)

    def nvmlInit(self) -> None:
        self._log("nvmlInit")
        if self.fail_init:
            raise self.NVMLError(self.fail_init)

    def nvmlShutdown(self) -> None:
        self._log("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._log("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        self._log("nvmlDeviceGetHandleByIndex", index)
        return ("handle", index)

    def nvmlDeviceGetPciInfo(self, handle: tuple[str, int]) -> SimpleNamespace:
        self._log("nvmlDeviceGetPciInfo", handle[1])
        return SimpleNamespace(busId=("0000" + self.gpus[handle[1]]["bus"].upper()).encode())  # NVML: 8-digit domain

    def nvmlDeviceGetName(self, handle: tuple[str, int]) -> str:
        self._log("nvmlDeviceGetName", handle[1])
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetNvLinkState(self, handle: tuple[str, int], link: int) -> int:
        self._log("nvmlDeviceGetNvLinkState", handle[1], link)
        if link >= len(self.slots[handle[1]]):
            raise self.NVMLError("Not Supported")
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: tuple[str, int], link: int) -> SimpleNamespace:
        self._log("nvmlDeviceGetNvLinkRemotePciInfo", handle[1], link)
        return SimpleNamespace(busId="0000" + self.slots[handle[1]][link])

    def nvmlDeviceGetNvLinkVersion(self, handle: tuple[str, int], link: int) -> int:
        self._log("nvmlDeviceGetNvLinkVersion", handle[1], link)
        return 6  # NVML_NVLINK_VERSION_4_0


def _dump_sysfs(root: Path) -> None:
    """Lay the dump's GPUs and NICs out as sysfs: pci<domain:bus of bridge>/<bridge>/<device>."""
    gpus, nics = _dump()
    for device in gpus + nics:
        chain = [f"pci{device['bridge'][:7]}", device["bridge"], device["bus"]]
        path = _make_pci(root, chain, numa=device["numa"], speed=device["speed"], width=device["width"])
        if "name" in device:
            _make_ib(root, path, device["name"], f"{device['mbps'] // 1000} Gb/sec (4X HDR)", "4: ACTIVE", "InfiniBand")


def _pcie_parent(topology: Topology, name: str) -> str:
    return next(link.dst for link in topology.links if link.src == name and link.kind is LinkKind.PCIE)


def test_nvml_calls_follow_the_documented_api() -> None:
    gpus, _ = _dump()
    nvml = FakeNvml(gpus)
    found, nvlinks = collect_nvml(nvml)
    assert nvml.calls[0] == ("nvmlInit",) and nvml.calls[-1] == ("nvmlShutdown",)
    assert [c[1] for c in nvml.calls if c[0] == "nvmlDeviceGetHandleByIndex"] == list(range(8))
    assert [g.pci_bus_id for g in found] == [g["bus"] for g in gpus]
    assert sum(1 for c in nvml.calls if c[0] == "nvmlDeviceGetNvLinkState") == 8 * 36
    assert sum(1 for c in nvml.calls if c[0] == "nvmlDeviceGetNvLinkRemotePciInfo") == 8 * 18
    assert {(n.gpu_index, n.count) for n in nvlinks if n.gpu_index == 0} == {(0, 5), (0, 4)}
    assert all(n.peer_index is None and n.version == "4.0" for n in nvlinks)


def test_probe_from_nvml_and_sysfs_builds_the_h100_machine(tmp_path: Path) -> None:
    gpus, nics = _dump()
    _dump_sysfs(tmp_path)
    topology = probe_topology(root=tmp_path, nvml=FakeNvml(gpus), name="h100-vm")
    assert topology.num_ranks == 8 and len(topology.nics()) == 8
    assert [topology.gpu(r).pci_bus_id for r in range(8)] == [g["bus"] for g in gpus]
    assert [topology.gpu(r).numa for r in range(8)] == [g["numa"] for g in gpus]
    to_switch = topology.link("gpu0", "nvswitch")
    assert to_switch.count == 18 and to_switch.bandwidth_GBps == pytest.approx(18 * 20.6)
    assert all(nic.net_kind is LinkKind.IB and nic.net_bandwidth_GBps == 25.0 for nic in topology.nics())
    nic_by_bus = {nic.pci_bus_id: nic.name for nic in topology.nics()}
    for gpu in gpus:  # each GPU shares its bridge, hence a PCIe switch, with the NIC the dump pairs it with
        (nic,) = [n for n in nics if n["bridge"] == gpu["bridge"]]
        assert _pcie_parent(topology, f"gpu{gpu['dev']}") == _pcie_parent(topology, nic_by_bus[nic["bus"]])
        assert topology.vertex(_pcie_parent(topology, f"gpu{gpu['dev']}")).kind is VertexKind.PCIE_SWITCH


def test_probed_topology_feeds_the_rest_of_taccl_py(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpus, _ = _dump()
    _dump_sysfs(tmp_path / "root")
    topology = probe_topology(root=tmp_path / "root", nvml=FakeNvml(gpus), name="h100-vm")
    reimported = parse_nccl_topology_xml(generate_nccl_topology_xml(topology))
    assert [v.pci_bus_id for v in reimported.gpus] == [g["bus"] for g in gpus]
    assert reimported.link("gpu3", "nvswitch0").count == 18
    result = place_pipeline(compose_nodes(topology, 2), 16)
    (crossing,) = [h for h in result.hops if h.src_rank // 8 != h.dst_rank // 8]
    assert (
        "host" not in crossing.link_kinds
        and len(route(compose_nodes(topology, 2), crossing.src_rank, crossing.dst_rank).links) == 6
    )


def test_probe_falls_back_to_nvidia_smi(tmp_path: Path) -> None:
    """nvidia-smi outputs recorded on DGX A100s; the --query-gpu rows are test input in its format."""
    buses = ["07", "0f", "47", "4e", "87", "90", "b7", "bd"]
    outputs = {
        "--query-gpu=index,pci.bus_id,name": "".join(
            f"{i}, 00000000:{b.upper()}:00.0, NVIDIA A100-SXM4-80GB\n" for i, b in enumerate(buses)
        ),
        "topo": _text("topo-m-dgx-a100-8gpu-10nic.txt"),
        "nvlink": _text("nvlink-s-a100-nccl-tests-228.txt"),
    }
    commands: list[list[str]] = []

    def run(argv: list[str]) -> str:
        commands.append(argv)
        return outputs[argv[1]]

    for k in range(10):  # the NICs only: the GPUs' sysfs entries are hidden, as in some containers
        device = _make_pci(tmp_path, ["pci0000:00", "0000:00:01.0", f"0000:{0x10 + k:02x}:00.0"])
        _make_ib(tmp_path, device, f"mlx5_{k}", "200 Gb/sec (4X HDR)", "4: ACTIVE", "InfiniBand")
    nvml = FakeNvml([], fail_init="Driver Not Loaded")
    probe = probe_machine(root=tmp_path, nvml=nvml, run=run)
    assert [argv[1] for argv in commands] == ["--query-gpu=index,pci.bus_id,name", "topo", "nvlink"]
    assert probe.gpus[7].pci_bus_id == "0000:bd:00.0" and probe.gpus[0].numa == 3
    assert probe.nic_affinity[:2] == ((0, "mlx5_0"), (0, "mlx5_1"))
    topology = probe_topology(root=tmp_path, nvml=nvml, run=run, name="dgx")
    link = topology.link("gpu0", "nvswitch")
    assert (link.count, link.bandwidth_GBps) == (12, 240.0)  # NVLink 3.0 at NCCL's 20 GB/s per link
    nic0 = next(n.name for n in topology.nics() if n.pci_bus_id == "0000:10:00.0")
    assert _pcie_parent(topology, "gpu0") == _pcie_parent(topology, "gpu1") == _pcie_parent(topology, nic0)


def test_probe_without_gpus_names_every_source(tmp_path: Path) -> None:
    def run(argv: list[str]) -> str:
        raise FileNotFoundError(argv[0])

    with pytest.raises(
        TopologyError, match=r"^probe: gpus: no NVIDIA GPU found \(NVML: Driver Not Loaded; nvidia-smi: not found\)"
    ):
        probe_machine(root=tmp_path, nvml=FakeNvml([], fail_init="Driver Not Loaded"), run=run)


def test_cli_probe_without_gpus_exits_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    out = tmp_path / "topo.json"
    assert main(["topo", "probe", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("error: probe: gpus: no NVIDIA GPU found (pynvml: not installed; nvidia-smi: not found)")
    assert not out.exists()


def test_cli_probe_writes_a_topology_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus, _ = _dump()
    _dump_sysfs(tmp_path / "root")
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus))
    out = tmp_path / "topo.json"
    assert main(["topo", "probe", "-o", str(out), "--name", "h100-vm", "--sysfs-root", str(tmp_path / "root")]) == 0
    assert "8 GPUs, 8 NIC ports, NVSwitch" in capsys.readouterr().out
    topology = read_topology(out)
    assert topology.name == "h100-vm" and topology.num_ranks == 8 and len(topology.nics()) == 8


def test_unreadable_or_down_ports_are_left_out(tmp_path: Path) -> None:
    gpus, _ = _dump()
    device = _make_pci(tmp_path, ["pci0000:00", "0000:00:01.0", "0000:01:00.0"])
    _make_ib(tmp_path, device, "mlx5_0", "", "4: ACTIVE", "InfiniBand")  # rate unreadable
    device = _make_pci(tmp_path, ["pci0000:00", "0000:00:02.0", "0000:02:00.0"])
    _make_ib(tmp_path, device, "mlx5_1", "100 Gb/sec (4X EDR)", "1: DOWN", "InfiniBand")
    assert [(n.name, n.state) for n in read_sysfs_nics(tmp_path)] == [("mlx5_0", "UNKNOWN"), ("mlx5_1", "DOWN")]
    assert probe_machine(root=tmp_path, nvml=FakeNvml(gpus)).nics == ()
