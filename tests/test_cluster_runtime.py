"""The runtime picks libraries by the live cluster's fingerprint, and falls back to native with one warning.

Toy machines with two NICs that carry PCI bus ids ("duo": two GPUs; "solo": one, so that the gloo
tests need only 2 ranks) make two-node clusters; libraries of ring algorithms are written for the
healthy cluster and for the one with node 1's nic1 down. Fake sysfs trees (one per node) show the
NIC ports the ranks read.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest

from taccl_py.errors import ArgumentError, FormatError, TopologyError
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import (
    AlgorithmLibrary,
    ClusterRecord,
    SizeBand,
    cluster_record,
    generate_library,
    library_cluster_fingerprint,
    parse_library,
    read_library,
)
from taccl_py.runtime.communicator.live_cluster import (
    NicPort,
    declare_cluster,
    declared_from_env,
    live_cluster,
    observe_nics,
    resolve_live_cluster,
    sysfs_root_from_env,
)
from taccl_py.runtime.communicator.selection import collect_algorithms, match_cluster
from taccl_py.synth.bands import write_library
from taccl_py.topology.builtins import load_topology
from taccl_py.topology.cluster import load_cluster
from taccl_py.topology.fingerprint import cluster_fingerprint, node_signatures
from taccl_py.topology.model import Topology

from helpers import ring_algorithm
from mp_utils import Case, assert_no_mismatches, compare, random_input, run_ranks, torch_collective

COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)
# A PCI domain no real machine uses, so that a real sysfs never matches the toy NICs.
NIC_BUS_IDS = {"nic0": "00f1:11:00.0", "nic1": "00f1:12:00.0"}
DUO = {
    "schema": "taccl-topology/1",
    "name": "duo",
    "description": "two GPUs on NVLink, a CPU and two 100 Gb/s NICs",
    "sources": ["hand-written test machine"],
    "vertices": [
        {"name": "gpu0", "kind": "gpu", "local_index": 0},
        {"name": "gpu1", "kind": "gpu", "local_index": 1},
        {"name": "cpu0", "kind": "cpu"},
    ]
    + [
        {
            "name": name,
            "kind": "nic",
            "local_index": index,
            "pci_bus_id": bus,
            "net_kind": "ib",
            "net_bandwidth_GBps": 12.5,
            "net_alpha_us": 0.7,
        }
        for index, (name, bus) in enumerate(NIC_BUS_IDS.items())
    ],
    "links": [{"src": "gpu0", "dst": "gpu1", "kind": "nvlink", "alpha_us": 0.7, "bandwidth_GBps": 25}]
    + [
        {"src": device, "dst": "cpu0", "kind": "pcie", "alpha_us": 0.5, "bandwidth_GBps": 12}
        for device in ("gpu0", "gpu1", *NIC_BUS_IDS)
    ],
}


@pytest.fixture
def duo(tmp_path: Path) -> str:
    """Return the path of the two-GPU toy machine file."""
    path = tmp_path / "duo.json"
    path.write_text(json.dumps(DUO), encoding="utf-8")
    return str(path)


@pytest.fixture
def solo(tmp_path: Path) -> str:
    """Return the path of the one-GPU toy machine file."""
    machine = dict(DUO, name="solo", description="one GPU, a CPU and two 100 Gb/s NICs")
    machine["vertices"] = [v for v in DUO["vertices"] if v["name"] != "gpu1"]
    machine["links"] = [link for link in DUO["links"] if "gpu1" not in (link["src"], link["dst"])]
    path = tmp_path / "solo.json"
    path.write_text(json.dumps(machine), encoding="utf-8")
    return str(path)


def cluster_libraries(folder: Path, topology: Topology) -> Path:
    """Write ring libraries of the three collectives made for ``topology`` into ``folder``; return it."""
    n = topology.num_ranks
    folder.mkdir(parents=True, exist_ok=True)
    for collective in COLLECTIVES:
        algorithm = ring_algorithm(collective, n, inplace=collective is Collective.ALLREDUCE)
        band = SizeBand(0, None, algorithm, "x.json")
        library = AlgorithmLibrary(
            topology.name, topology.nodes, collective, n, (band,), None, cluster_record(topology)
        )
        write_library(library, folder / f"{collective.value}.library.json")
    return folder


def fake_sysfs(root: Path, states: dict[str, tuple[str, str]]) -> Path:
    """Lay out sysfs RDMA ports under ``root``: NIC name -> (state file, rate file); return ``root``."""
    for index, (nic, (state, rate)) in enumerate(states.items()):
        bus = NIC_BUS_IDS[nic]
        device = root / "sys/devices" / f"pci{bus[:7]}" / f"{bus[:7]}:00.0" / bus
        port = device / "infiniband" / f"mlx5_{index}" / "ports" / "1"
        port.mkdir(parents=True)
        for name, value in (("state", state), ("rate", rate), ("link_layer", "InfiniBand")):
            (port / name).write_text(value + "\n")
        (device / "infiniband" / f"mlx5_{index}" / "device").symlink_to(os.path.relpath(device, port.parent.parent))
        entry = root / "sys/class/infiniband" / f"mlx5_{index}"
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.symlink_to(os.path.relpath(device / "infiniband" / f"mlx5_{index}", entry.parent))
    return root


UP = ("4: ACTIVE", "100 Gb/sec (4X EDR)")
DOWN = ("1: DOWN", "10 Gb/sec (4X SDR)")
HALF = ("4: ACTIVE", "50 Gb/sec (2X EDR)")


# -- the library's cluster record ------------------------------------------------------------------


def test_library_records_its_cluster_and_reads_it_back(tmp_path: Path, duo: str) -> None:
    topology = load_cluster(f"{duo}:2", nics_down=["1:nic1"])
    cluster_libraries(tmp_path, topology)
    library = read_library(tmp_path / "allreduce.library.json")
    assert library.cluster == ClusterRecord(
        cluster_fingerprint(topology), node_signatures(topology), topology.description
    )
    assert library.cluster.nodes[0] != library.cluster.nodes[1]  # node 1 lacks a NIC
    assert library_cluster_fingerprint(library) == cluster_fingerprint(topology)
    text = (tmp_path / "allreduce.library.json").read_text()
    assert json.loads(text)["cluster"]["fingerprint"] == cluster_fingerprint(topology)
    assert generate_library(library) == text  # read and written back byte for byte


def test_a_library_without_a_cluster_stands_for_the_builtin_it_names(tmp_path: Path) -> None:
    algorithm = ring_algorithm(Collective.ALLGATHER, 16)
    band = SizeBand(0, None, algorithm, "ag-0.json")
    write_library(AlgorithmLibrary("ndv2", 2, Collective.ALLGATHER, 16, (band,)), tmp_path / "ag.library.json")
    library = read_library(tmp_path / "ag.library.json")
    assert library.cluster is None and "cluster" not in json.loads((tmp_path / "ag.library.json").read_text())
    assert library_cluster_fingerprint(library) == cluster_fingerprint(load_topology("ndv2", 2))
    assert library_cluster_fingerprint(AlgorithmLibrary("not-a-machine", 2, Collective.ALLGATHER, 16, ())) is None


@pytest.mark.parametrize(
    ("cluster", "fault"),
    [
        ([], "cluster: []"),
        (
            {"fingerprint": "ab", "nodes": ["x"], "description": ""},
            "cluster.nodes: 1 signatures; expected one per node",
        ),
        ({"fingerprint": "", "nodes": ["x", "y"]}, "cluster.fingerprint: empty"),
        ({"fingerprint": "ab", "nodes": ["x", 3]}, "cluster.nodes"),
    ],
)
def test_a_malformed_cluster_record_is_refused(tmp_path: Path, cluster: Any, fault: str) -> None:
    text = json.dumps(
        {
            "schema": "taccl-library/1",
            "topology": "t",
            "nodes": 2,
            "collective": "allgather",
            "num_ranks": 4,
            "cluster": cluster,
            "bands": [],
        }
    )
    with pytest.raises(FormatError, match=re.escape(fault)):
        parse_library(text, "lib.json", tmp_path)


def test_synthesize_with_sizes_writes_the_cluster_record(tmp_path: Path) -> None:
    from taccl_py.cli import main

    out = tmp_path / "ag.library.json"
    argv = ["synthesize", "-t", "dgx2", "-c", "allgather", "--sizes", "1KB,1MB", "--time-limit", "1", "-o", str(out)]
    assert main(argv) == 0
    assert read_library(out).cluster == cluster_record(load_topology("dgx2"))


# -- choosing by fingerprint (one process) -----------------------------------------------------------


def test_match_cluster_keeps_what_was_made_for_the_live_cluster(tmp_path: Path, duo: str) -> None:
    healthy, degraded = load_cluster(f"{duo}:2"), load_cluster(f"{duo}:2", nics_down=["1:nic1"])
    choices = collect_algorithms(
        [cluster_libraries(tmp_path / "h", healthy), cluster_libraries(tmp_path / "d", degraded)], 4
    )
    for live, folder in ((healthy, "h"), (degraded, "d")):
        matched = match_cluster(choices, cluster_fingerprint(live))
        assert {Path(c.origin.split(" (")[0]).parent.name for c in matched.candidates} == {folder}
        assert len(matched.candidates) == len(matched.rejected) == 3
        assert matched.rejected_for(Collective.ALLREDUCE, 1 << 20)[0].made_for.fingerprint() != cluster_fingerprint(
            live
        )
    assert match_cluster(choices, None).candidates == ()
    bare = collect_algorithms(ring_algorithm(Collective.ALLGATHER, 4), 4)  # an algorithm carrying no cluster
    assert match_cluster(bare, cluster_fingerprint(healthy)).candidates == ()
    tagged = ring_algorithm(Collective.ALLGATHER, 4).with_metadata(cluster_fingerprint=cluster_fingerprint(healthy))
    assert len(match_cluster(collect_algorithms(tagged, 4), cluster_fingerprint(healthy)).candidates) == 1


def test_shipped_libraries_match_the_healthy_builtin_cluster_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from taccl_py.ir import library as library_module

    (tmp_path / "ndv2" / "n2").mkdir(parents=True)
    band = SizeBand(0, None, ring_algorithm(Collective.ALLGATHER, 16), "x.json")
    write_library(AlgorithmLibrary("ndv2", 2, Collective.ALLGATHER, 16, (band,)), tmp_path / "ndv2/n2/ag.library.json")
    monkeypatch.setattr(library_module, "shipped_library_dir", lambda: tmp_path)
    shipped = collect_algorithms("ndv2", 16)
    assert len(match_cluster(shipped, live_cluster(declare_cluster("ndv2:2"), None).fingerprint).candidates) == 1
    half = live_cluster(declare_cluster("ndv2:2", nic_speed="1:nic0:4.76"), None)
    assert half.name == "ndv2x2-n1nic0at4.76G"
    assert match_cluster(shipped, half.fingerprint).candidates == ()


def test_sysfs_ports_refine_the_declared_cluster(tmp_path: Path, duo: str) -> None:
    declared = declare_cluster(f"{duo}:2")
    up = observe_nics(fake_sysfs(tmp_path / "up", {"nic0": UP, "nic1": UP}))
    down = observe_nics(fake_sysfs(tmp_path / "down", {"nic0": UP, "nic1": DOWN}))
    half = observe_nics(fake_sysfs(tmp_path / "half", {"nic0": HALF, "nic1": UP}))
    assert down == (NicPort("00f1:11:00.0", "ACTIVE", 100.0), NicPort("00f1:12:00.0", "DOWN", 10.0))

    def fingerprint(**overrides: Any) -> str:
        return cluster_fingerprint(load_cluster(f"{duo}:2", **overrides))

    assert live_cluster(declared, [up, up, up, up]).fingerprint == fingerprint()
    refined = live_cluster(declared, [up, up, down, down])
    assert refined.fingerprint == fingerprint(nics_down=["1:nic1"])
    assert "node 1 (ranks 2-3): nic1 down (DOWN)" in refined.source
    # node k takes what its first rank saw
    assert live_cluster(declared, [half, up, up, down]).fingerprint == fingerprint(nic_speeds=["0:nic0:6.25"])
    # a NIC declared down that sysfs shows up is up; no port found anywhere: the declaration stands
    declared_down = declare_cluster(f"{duo}:2", "1:nic1")
    assert live_cluster(declared_down, [up] * 4).fingerprint == fingerprint()
    nothing = live_cluster(declared_down, [(), (), (), ()])
    assert nothing.fingerprint == fingerprint(nics_down=["1:nic1"]) and "the declaration stands" in nothing.source
    dead = observe_nics(fake_sysfs(tmp_path / "dead", {"nic0": DOWN, "nic1": DOWN}))
    unusable = live_cluster(declared, [up, up, dead, dead])
    assert unusable.fingerprint is None and "every NIC is down" in unusable.source
    assert observe_nics(tmp_path / "no-such-root") == () and observe_nics(None) == ()


def test_declared_cluster_errors_and_environment(duo: str) -> None:
    with pytest.raises(TopologyError, match="no NIC 'nic7'"):
        declare_cluster(f"{duo}:2", ["1:nic7"])
    with pytest.raises(ArgumentError, match="node 2 out of range"):
        declare_cluster(f"{duo}:2", "2:nic0")
    with pytest.raises(TopologyError, match="every NIC is down"):
        declare_cluster(f"{duo}:2", "1:nic0,1:nic1")
    with pytest.raises(ArgumentError, match="world_size: duox2 has 4 GPUs, the group 8 ranks"):
        resolve_live_cluster(f"{duo}:2", (), (), None, 8, lambda text: [text])
    with pytest.raises(ArgumentError, match="TACCL_NIC_DOWN: set without TACCL_CLUSTER"):
        declared_from_env({"TACCL_NIC_DOWN": "1:nic0"})
    assert declared_from_env({}) is None
    env = {"TACCL_CLUSTER": f"{duo}:2", "TACCL_NIC_DOWN": "1:nic1", "TACCL_NIC_SPEED": "0:nic0:6"}
    declared = declared_from_env(env)
    assert cluster_fingerprint(declared.topology) == cluster_fingerprint(
        load_cluster(f"{duo}:2", nics_down=["1:nic1"], nic_speeds=["0:nic0:6"])
    )
    assert sysfs_root_from_env({}) == "/" and sysfs_root_from_env({"TACCL_SYSFS_ROOT": "/host"}) == "/host"
    assert sysfs_root_from_env({"TACCL_NIC_PROBE": "off", "TACCL_SYSFS_ROOT": "/host"}) is None


# -- on gloo ranks ----------------------------------------------------------------------------------


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.warnings: list[str] = []
        self.infos: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        (self.warnings if record.levelno >= logging.WARNING else self.infos).append(record.getMessage())


def _listen() -> _Lines:
    handler = _Lines()
    logger = logging.getLogger("taccl_py")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return handler


def _calls(comm: Any, rank: int, seed: int) -> list[str]:
    """Run each collective three times through ``comm``; return its mismatches against torch's."""
    import torch

    problems = []
    for repeat in range(3):
        for collective in COLLECTIVES:
            case = Case(collective.value, "float32", 6, "sum", seed=seed + repeat, real=True)
            blocks = comm.world_size if collective is Collective.REDUCESCATTER else 1
            data = random_input(case, rank, blocks * case.numel)
            kept = data.clone()
            if collective is Collective.ALLGATHER:
                ours = torch.zeros(comm.world_size * case.numel)
                comm.all_gather(ours, data)
            elif collective is Collective.REDUCESCATTER:
                ours = torch.zeros(case.numel)
                comm.reduce_scatter(ours, data)
            else:
                ours = data
                comm.all_reduce(ours)
            problem = compare(case, ours, torch_collective(collective.value, kept, "sum", comm.world_size))
            problems += [f"{collective.value}: {problem}"] if problem else []
    return problems


def _chosen(comm: Any) -> list[str | None]:
    return [None if (a := comm.algorithm_for(c, 96)) is None else a.name for c in COLLECTIVES]


def communicator_worker(
    rank: int, world: int, machine: str, libraries: dict[str, str], roots: dict[str, str]
) -> list[str]:
    """Worker: libraries run only on the cluster they were made for; elsewhere native, one warning each."""
    from taccl_py.runtime.communicator import Communicator

    node = rank
    problems: list[str] = []
    handler = _listen()
    both = [libraries["healthy"], libraries["degraded"]]
    # sysfs shows every NIC up: the healthy cluster's libraries run
    comm = Communicator(None, both, cluster=f"{machine}:2", sysfs_root=roots[f"up{node}"], timeout_s=30)
    if None in _chosen(comm) or comm.cluster.fingerprint != libraries["healthy_fp"]:
        problems.append(f"healthy: chose {_chosen(comm)} on {comm.cluster}")
    problems += _calls(comm, rank, 1)
    # node 1's sysfs shows nic1 down: the degraded cluster's libraries run
    comm = Communicator(None, both, cluster=f"{machine}:2", sysfs_root=roots[f"nic1down{node}"], timeout_s=30)
    if comm.cluster.fingerprint != libraries["degraded_fp"] or None in _chosen(comm):
        problems.append(f"degraded: chose {_chosen(comm)} on {comm.cluster}")
    problems += _calls(comm, rank, 2)
    # only the healthy libraries, on the degraded cluster: native, one warning per collective
    handler.warnings.clear()
    comm = Communicator(None, libraries["healthy"], cluster=f"{machine}:2", nic_down="1:nic1", sysfs_root=None)
    if _chosen(comm) != [None] * 3:
        problems.append(f"mismatch: chose {_chosen(comm)}")
    problems += _calls(comm, rank, 3)
    expected = 3 if rank == 0 else 0  # rank 0 warns for the group; the others log it at DEBUG
    if len(handler.warnings) != expected or not all("solo" in w and "-n1nic1down" in w for w in handler.warnings):
        problems.append(f"expected {expected} warnings naming the live cluster, got {handler.warnings}")
    if not all(libraries["healthy_fp"] in w for w in handler.warnings):
        problems.append(f"warnings do not name what the libraries were made for: {handler.warnings}")
    # no cluster given: no check, as before
    comm = Communicator(None, libraries["degraded"], timeout_s=30)
    if None in _chosen(comm) or comm.cluster is not None:
        problems.append(f"no cluster: chose {_chosen(comm)}")
    if not any("refined by sysfs: node 1 (rank 1): nic1 down" in line for line in handler.infos):
        problems.append(f"no log line says where the fingerprint came from: {handler.infos}")
    return problems


@pytest.fixture
def setup(tmp_path: Path, solo: str) -> tuple[dict[str, str], dict[str, str]]:
    healthy, degraded = load_cluster(f"{solo}:2"), load_cluster(f"{solo}:2", nics_down=["1:nic1"])
    libraries = {
        "healthy": str(cluster_libraries(tmp_path / "healthy", healthy)),
        "degraded": str(cluster_libraries(tmp_path / "degraded", degraded)),
        "healthy_fp": cluster_fingerprint(healthy),
        "degraded_fp": cluster_fingerprint(degraded),
    }
    roots = {}
    for node in (0, 1):
        roots[f"up{node}"] = str(fake_sysfs(tmp_path / f"up{node}", {"nic0": UP, "nic1": UP}))
        nic1 = DOWN if node == 1 else UP
        roots[f"nic1down{node}"] = str(fake_sysfs(tmp_path / f"nic1down{node}", {"nic0": UP, "nic1": nic1}))
    return libraries, roots


@pytest.mark.multiprocess
def test_communicator_runs_the_library_of_the_live_cluster(solo: str, setup: Any) -> None:
    libraries, roots = setup
    assert_no_mismatches(run_ranks(communicator_worker, 2, solo, libraries, roots))


def environment_worker(
    rank: int, world: int, machine: str, libraries: dict[str, str], roots: dict[str, str]
) -> list[str]:
    """Worker: from_env and the taccl backend take the cluster from TACCL_* variables."""
    import datetime

    import torch
    import torch.distributed as dist

    from taccl_py.runtime.backend import register_backend
    from taccl_py.runtime.communicator import Communicator

    problems: list[str] = []
    handler = _listen()
    os.environ.update({"TACCL_CLUSTER": f"{machine}:2", "TACCL_SYSFS_ROOT": roots[f"nic1down{rank}"]})
    comm = Communicator.from_env([libraries["healthy"], libraries["degraded"]], timeout_s=30)
    if comm.cluster.fingerprint != libraries["degraded_fp"] or None in _chosen(comm):
        problems.append(f"from_env: chose {_chosen(comm)} on {comm.cluster}")
    problems += _calls(comm, rank, 4)
    # the backend: the healthy libraries do not fit, every collective goes to gloo with one warning each
    dist.destroy_process_group()
    register_backend(libraries["healthy"])
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world, False, timeout=timeout)
    dist.init_process_group("taccl", store=store, rank=rank, world_size=world, timeout=timeout)
    handler.warnings.clear()
    for _ in range(3):
        tensor = torch.full((8,), float(rank + 1))
        dist.all_reduce(tensor)
        problems += [] if tensor.tolist() == [3.0] * 8 else [f"backend all_reduce gave {tensor.tolist()}"]
        gathered = torch.zeros(8 * world)
        dist.all_gather_into_tensor(gathered, torch.full((8,), float(rank)))
        expected = [float(r) for r in range(world) for _ in range(8)]
        problems += [] if gathered.tolist() == expected else [f"backend all_gather gave {gathered.tolist()}"]
    group = dist.group.WORLD
    if group.routed or group.delegated["allreduce"] != 3 or len(handler.warnings) != (2 if rank == 0 else 0):
        problems.append(f"backend: routed {group.routed}, delegated {group.delegated}, warnings {handler.warnings}")
    # a group made with the degraded cluster's libraries routes through them
    register_backend(libraries["degraded"])
    routed = dist.new_group(backend="taccl")
    tensor = torch.full((8,), float(rank + 1))
    dist.all_reduce(tensor, group=routed)
    problems += [] if tensor.tolist() == [3.0] * 8 else [f"routed all_reduce gave {tensor.tolist()}"]
    if routed.routed["allreduce"] != 1:
        problems.append(f"degraded libraries not routed: {routed.routed}, {routed.delegated}")
    dist.destroy_process_group()
    return problems


@pytest.mark.multiprocess
def test_from_env_and_the_backend_read_the_cluster_from_the_environment(solo: str, setup: Any) -> None:
    libraries, roots = setup
    assert_no_mismatches(run_ranks(environment_worker, 2, solo, libraries, roots, backend=None))


@pytest.mark.multiprocess
def test_bench_runs_native_where_the_library_was_made_for_another_cluster(
    solo: str, setup: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from taccl_py.cli import main

    libraries, _ = setup
    argv = ["bench", "--library", libraries["healthy"], "--collective", "allreduce", "--nproc", "2"]
    argv += ["--sizes", "8KB", "--iters", "1", "--warmup", "0", "--json", "--cluster", f"{solo}:2"]
    assert main([*argv, "--nic-down", "1:nic1"]) == 0
    assert [row["algorithm"] for row in json.loads(capsys.readouterr().out)] == ["torch"]


def test_bench_refuses_a_cluster_of_another_size(tmp_path: Path, solo: str, capsys: pytest.CaptureFixture[str]) -> None:
    from taccl_py.cli import main
    from taccl_py.ir.algorithm_json import write_algorithm

    ring = tmp_path / "ring.json"
    write_algorithm(ring_algorithm(Collective.ALLREDUCE, 2, inplace=True), str(ring))
    assert main(["bench", "--algorithm", str(ring), "--nproc", "2", "--cluster", f"{solo}:3"]) == 2
    assert "--cluster: 3 GPUs; expected one GPU per rank (2)" in capsys.readouterr().err
    assert main(["bench", "--algorithm", str(ring), "--nproc", "2", "--nic-down", "1:nic1"]) == 2
    assert "--nic-down: given without --cluster" in capsys.readouterr().err
