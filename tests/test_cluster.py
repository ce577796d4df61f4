"""Clusters: the taccl-cluster/1 file, the command line's shorthand and overrides, and their faults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taccl_py.bounds import binding_cut
from taccl_py.cli import main
from taccl_py.errors import ArgumentError, TopologyError
from taccl_py.topology import load_topology
from taccl_py.topology.cluster import (
    MAX_CLUSTER_NODES,
    describe_cluster,
    load_cluster,
    node_statuses,
    parse_cluster,
    read_cluster,
)
from taccl_py.topology.fingerprint import cluster_fingerprint
from taccl_py.topology.model import LinkKind
from taccl_py.topology.schema import write_topology

from helpers import one_error_line

A100_NICS = ", ".join(f"nic{i}" for i in range(8))


def _links(topology):
    return sorted((link.src, link.dst, link.kind.value, link.alpha_us, link.bandwidth_GBps) for link in topology.links)


# -- the file ---------------------------------------------------------------------------------------


def _write_cluster(tmp_path: Path) -> Path:
    """Write a cluster file naming one machine by a topology file relative to the cluster file."""
    (tmp_path / "machines").mkdir()
    write_topology(load_topology("dgx-h100"), tmp_path / "machines" / "h100.json")
    document = {
        "schema": "taccl-cluster/1",
        "description": "two A100s and an H100 with a slow NIC",
        "nodes": [
            {"machine": "dgx-a100", "count": 2, "nics_down": ["nic3"]},
            {"machine": "machines/h100.json", "nic_speed_GBps": {"nic0": 12.5}},
        ],
        "network": {"alpha_us": 2.0},
    }
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(document))
    return path


def test_cluster_file_builds_every_change(tmp_path):
    topology = load_cluster(str(_write_cluster(tmp_path)))
    assert (topology.nodes, topology.num_ranks, topology.name) == (
        3,
        24,
        "dgx-a100x2+dgx-h100x1-n0nic3down-n1nic3down-n2nic0at12.5G",
    )
    assert topology.description == "two A100s and an H100 with a slow NIC"
    names = {v.name for v in topology.vertices}
    assert "n0.nic3" not in names and "n1.nic3" not in names and "n2.nic3" in names
    assert not any("nic3" in (link.src + link.dst) for link in topology.links if link.src.startswith(("n0.", "n1.")))
    to_switch = {link.src: link for link in topology.links if link.dst == "netswitch"}
    assert to_switch["n2.nic0"].bandwidth_GBps == 12.5 and to_switch["n2.nic1"].bandwidth_GBps == 50.0
    assert {link.alpha_us for link in to_switch.values()} == {2.0}  # network.alpha_us replaces every NIC's
    # the speed is the network port's: the NIC's PCIe link keeps the machine's figure
    assert (
        topology.link("n2.nic0", "n2.pcie0").bandwidth_GBps
        == load_topology("dgx-h100").link("nic0", "pcie0").bandwidth_GBps
    )
    statuses = node_statuses(topology, read_cluster(tmp_path / "cluster.json"))
    assert [(s.machine, s.nics_down) for s in statuses] == [("dgx-a100", ("nic3",))] * 2 + [("dgx-h100", ())]
    assert dict(statuses[2].nics_up)["nic0"] == 12.5 and len(statuses[0].nics_up) == 7


def test_unchanged_copies_are_exactly_the_composed_machine():
    cluster = load_cluster("dgx-a100:2")
    composed = load_topology("dgx-a100", nodes=2)
    assert cluster.name == composed.name and _links(cluster) == _links(composed)
    same = parse_cluster(json.dumps({"schema": "taccl-cluster/1", "nodes": [{"machine": "dgx-a100", "count": 2}]}))
    assert [node.machine for node in same.nodes] == ["dgx-a100", "dgx-a100"]


def test_shorthand_and_repeated_overrides():
    topology = load_cluster(
        "dgx-a100:2,dgx-h100:2", nics_down=["1:nic3", "1:nic4"], nic_speeds=["3:nic0:12.5", "2:nic7:40"]
    )
    assert topology.name == "dgx-a100x2+dgx-h100x2-n1nic3down-n1nic4down-n2nic7at40G-n3nic0at12.5G"
    assert len(topology.nics(1)) == 6 and len(topology.nics(0)) == 8
    speeds = {nic.name: nic.net_bandwidth_GBps for nic in topology.nics()}
    assert speeds["n3.nic0"] == 12.5 and speeds["n2.nic7"] == 40.0 and speeds["n0.nic0"] == 25.0
    # the fingerprint follows NICs up and their speeds
    assert cluster_fingerprint(topology) != cluster_fingerprint(load_cluster("dgx-a100:2,dgx-h100:2"))
    assert cluster_fingerprint(load_cluster(topology="dgx-a100", nodes=2)) == cluster_fingerprint(
        load_cluster("dgx-a100:2")
    )


def _document(**changes) -> str:
    document = {"schema": "taccl-cluster/1", "nodes": [{"machine": "dgx-a100", "count": 2}]}
    document.update(changes)
    return json.dumps(document)


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("[1]", None, "a JSON list"),
        ("{", "line 1", "invalid JSON"),
        (_document(schema="taccl-topology/1"), "schema", "'taccl-topology/1'; expected 'taccl-cluster/1'"),
        (_document(nodes=[]), "nodes", "expected a non-empty list"),
        (_document(extra=1), "extra", "unknown field; expected one of schema, name"),
        (_document(nodes=[{"machine": "dgx-a100", "gpus": 8}]), "nodes[0].gpus", "unknown field"),
        (_document(network={"alpha": 1}), "network.alpha", "unknown field; expected one of alpha_us"),
        (_document(network={"alpha_us": -1}), "network.alpha_us", "expected a number >= 0"),
        (_document(nodes=[{"machine": "dgx-a100", "count": 0}]), "nodes[0].count", "expected an integer >= 1"),
        (_document(nodes=[{"machine": "dgx-a100", "count": True}]), "nodes[0].count", "expected an integer >= 1"),
        (_document(nodes=[{"count": 2}]), "nodes[0].machine", "expected a built-in machine name"),
        (_document(nodes=[{"machine": "dgx-a100", "nics_down": "nic3"}]), "nodes[0].nics_down", "a list of NIC"),
        (
            _document(nodes=[{"machine": "dgx-a100", "nic_speed_GBps": {"nic0": 0}}]),
            "nodes[0].nic_speed_GBps.nic0",
            "expected a number > 0",
        ),
        (
            _document(nodes=[{"machine": "dgx-a100", "nic_speed_GBps": {"nic0": 1e30}}]),
            "nodes[0].nic_speed_GBps.nic0",
            "expected a number > 0 and at most 10000",
        ),
        (
            _document(nodes=[{"machine": "dgx-a100", "count": 2, "nics_down": ["nic3", "nic3"]}]),
            "nodes[0].nics_down",
            "'nic3' listed twice; expected each NIC once",
        ),
        (
            _document(nodes=[{"machine": "dgx-a100", "count": MAX_CLUSTER_NODES + 1}]),
            "nodes[0].count",
            f"expected at most {MAX_CLUSTER_NODES}",
        ),
    ],
)
def test_malformed_file_names_the_field(text, field, message):
    with pytest.raises(TopologyError) as caught:
        parse_cluster(text, "c.json")
    assert caught.value.field == field and message in str(caught.value)


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (
            {"machine": "dgx-a100", "count": 2, "nics_down": ["nic9"]},
            f"no NIC 'nic9' on dgx-a100; expected one of {A100_NICS}",
        ),
        ({"machine": "ndv2", "count": 2, "nics_down": ["nic0"]}, "node 0 (ndv2) cannot communicate: every NIC is down"),
        ({"machine": "dgx-a100", "nic_speed_GBps": {"mlx5_0": 3}}, "nodes[0].nic_speed_GBps: no NIC 'mlx5_0'"),
        ({"machine": "dgx9"}, "nodes[0].machine: no such built-in machine or file"),
    ],
)
def test_file_faults_found_building_the_topology(tmp_path, node, message):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"schema": "taccl-cluster/1", "nodes": [node, {"machine": "dgx-a100"}]}))
    with pytest.raises(TopologyError) as caught:
        load_cluster(str(path))
    assert message in str(caught.value)


def test_machines_must_have_equal_gpu_counts():
    with pytest.raises(TopologyError, match=r"node 1 \(dgx2\) has 16 GPUs, node 0 \(dgx-a100\) 8"):
        load_cluster("dgx-a100,dgx2")


# -- the command line ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", "dgx9:2"], "error: dgx9:2: --cluster: no such built-in machine or file 'dgx9'; expected one of"),
        (
            ["--cluster", "dgx-a100:2", "--nic-down", "1:nic9"],
            f"no NIC 'nic9' on node 1 (dgx-a100); expected one of {A100_NICS}",
        ),
        (["--cluster", "dgx-a100:2", "--nic-speed", "0:eth0:10"], "--nic-speed: no NIC 'eth0' on node 0"),
        (["--cluster", "dgx-a100:2", "--nic-down", "2:nic0"], "--nic-down: node 2 out of range (the cluster has 2)"),
        (["ndv2", "--nodes", "2", "--nic-down", "1:nic0"], "node 1 (ndv2) cannot communicate: every NIC is down"),
        (["--cluster", "dgx-a100:two"], "--cluster: count 'two' of dgx-a100; expected an integer >= 1"),
        (["--cluster", "dgx-a100,,ndv2"], "--cluster: empty machine"),
        (["--cluster", "dgx-a100:2", "--nic-down", "one:nic0"], "--nic-down: node 'one'"),
        (["--cluster", "dgx-a100:2", "--nic-down", "1:"], "--nic-down: no NIC name"),
        (["--cluster", "dgx-a100:2", "--nic-speed", "0:nic0"], "expected NODE:NIC:GBPS"),
        (["--cluster", "dgx-a100:2", "--nic-speed", "0:nic0:fast"], "--nic-speed: speed 'fast'"),
        (["dgx-a100", "--cluster", "dgx-a100:2"], "--cluster: given with --topology"),
        (["--cluster", "dgx-a100:2", "--nodes", "3"], "--cluster: given with --nodes"),
        (
            ["--cluster", "missing-cluster.json"],
            "error: missing-cluster.json: --cluster: no such built-in machine or file 'missing-cluster.json'",
        ),
        (
            ["--cluster", "dgx-a100:2", "--nic-speed", "0:nic0:1e30"],
            "error: 0:nic0:1e30: --nic-speed: speed '1e30'; expected GB/s per direction > 0 and at most 10000",
        ),
        (
            ["dgx-a100", "--nodes", "2", "--nic-down", "0:nic0", "--nic-down", "0:nic0"],
            "error: 0:nic0: --nic-down: NIC nic0 of node 0 is named twice; expected each NIC once",
        ),
        (
            ["dgx-a100", "--nodes", "2", "--nic-speed", "0:nic0:10", "--nic-speed", "0:nic0:12"],
            "error: 0:nic0: --nic-speed: NIC nic0 of node 0 is given two speeds; expected one speed per NIC",
        ),
    ],
)
def test_bad_cluster_options_are_one_error_line(args, message, capsys):
    assert main(["topo", "show", *args, "--sizes", "1MB"]) == 2
    assert message in one_error_line(capsys)


def test_every_nic_down_across_file_and_option(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(_document(nodes=[{"machine": "dgx1", "count": 2, "nics_down": ["nic0", "nic1", "nic2"]}]))
    with pytest.raises(ArgumentError, match=r"node 1 \(dgx1\) cannot communicate"):
        describe_cluster(str(path), nics_down=["1:nic3"])
    assert main(["topo", "show", "--cluster", str(path), "--nic-down", "0:nic3"]) == 2
    assert "node 0 (dgx1) cannot communicate: every NIC is down" in one_error_line(capsys)


def test_show_lists_each_machine_and_names_the_binding_node(capsys):
    assert main(["topo", "show", "dgx-a100", "--nodes", "4", "--nic-down", "1:nic3", "--sizes", "1GB"]) == 0
    out = capsys.readouterr().out
    rows = {
        line.split()[0]: line for line in out.splitlines() if line.split()[:2] in (["0", "dgx-a100"], ["1", "dgx-a100"])
    }
    assert rows["1"].split()[2:] == ["8-15", "nic0,nic1,nic2,nic4,nic5,nic6,nic7", "@25", "nic3"]
    assert rows["0"].split()[-1] == "-"
    (line,) = [line for line in out.splitlines() if line.split()[:2] == ["allgather", "1GB"]]
    assert "node cut: node 1 (8 GPUs): 168 GB/s entering over 7 pcie links" in line


def test_the_one_node_name_keeps_the_bound():
    topology = load_cluster(topology="dgx-a100", nodes=4, nics_down=["1:nic3"])
    for reverse, crossing in ((False, "entering"), (True, "leaving")):
        cut = binding_cut(topology, reverse)
        # the set is nodes 0, 2, 3 with the switch: their 24 GPUs over node 1's 7 working NICs' PCIe links
        assert (cut.cut_gpus, cut.capacity_GBps) == (24, pytest.approx(7 * 24.0))
        assert cut.description == f"node cut: node 1 (8 GPUs): 168 GB/s {crossing} over 7 pcie links"
    # two nodes: the set is one node, named as before
    assert binding_cut(load_topology("ndv2", nodes=2)).description.startswith(
        "NIC cut: node 0 (8 GPUs): 9.524 GB/s leaving"
    )


def test_show_json_lists_each_machine(capsys):
    args = ["--cluster", "dgx-a100:1,dgx-h100:1", "--nic-speed", "1:nic0:12.5", "--nic-down", "0:nic5"]
    assert main(["topo", "show", *args, "--json", "--sizes", "16MB"]) == 0
    document = json.loads(capsys.readouterr().out)
    first, second = document["machines"]
    assert (first["machine"], first["ranks"], first["nics_down"]) == ("dgx-a100", list(range(8)), ["nic5"])
    assert [nic["name"] for nic in first["nics_up"]] == ["nic0", "nic1", "nic2", "nic3", "nic4", "nic6", "nic7"]
    assert second["machine"] == "dgx-h100" and second["nics_up"][0] == {"name": "nic0", "net_bandwidth_GBps": 12.5}
    assert document["fingerprint"] == cluster_fingerprint(
        load_cluster(args[1], nics_down=["0:nic5"], nic_speeds=["1:nic0:12.5"])
    )
    assert all(bound["description"] for bound in document["lower_bounds"])


def test_commands_that_take_a_topology_take_a_cluster(tmp_path, capsys):
    output = tmp_path / "ring.json"
    args = [
        "baseline",
        "ring",
        "-c",
        "allgather",
        "--cluster",
        "ndv2:2",
        "--nic-speed",
        "1:nic0:4.76",
        "-o",
        str(output),
    ]
    assert main(args) == 0, capsys.readouterr().err
    assert output.exists()
    assert main(["place", "--cluster", "dgx1:2", "--nic-down", "1:nic0", "--nic-down", "1:nic1", "--stages", "16"]) == 0
    assert "rank list: 1,3,2,6,7,5,4,0,12," in capsys.readouterr().out  # node 1 is entered next to nic2 (GPU 4)
    assert main(["topo", "draw", "--cluster", "ndv2:2", "--nic-down", "0:nic0", "-o", str(tmp_path / "x.svg")]) == 2
    assert "node 0 (ndv2) cannot communicate" in one_error_line(capsys)


def test_one_machine_with_a_nic_down_is_named_after_it():
    topology = load_cluster(topology="dgx-a100", nics_down=["0:nic3"])
    assert topology.name == "dgx-a100-n0nic3down" and len(topology.nics()) == 7 and topology.nodes == 1
    assert load_cluster(topology="dgx-a100").name == "dgx-a100"
    assert LinkKind.PCIE in {link.kind for link in topology.links}


def test_a_nic_down_in_the_file_and_again_as_an_option_is_named_twice(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(_document(nodes=[{"machine": "dgx-a100", "count": 2, "nics_down": ["nic3"]}]))
    with pytest.raises(ArgumentError, match=r"^1:nic3: --nic-down: NIC nic3 of node 1 is named twice"):
        describe_cluster(str(path), nics_down=["1:nic3"])


@pytest.mark.parametrize("nodes", [0, MAX_CLUSTER_NODES + 1])
def test_a_node_count_out_of_range_is_refused_before_building(nodes):
    from taccl_py.topology.compose import compose_nodes

    expected = f"{nodes} nodes; expected an integer from 1 to {MAX_CLUSTER_NODES}"
    with pytest.raises(ArgumentError, match=f"^nodes: {expected}$"):
        load_topology("dgx2", nodes=nodes)
    with pytest.raises(ArgumentError, match=f"^ndv2: nodes: {expected}$"):
        compose_nodes(load_topology("ndv2"), nodes)
    with pytest.raises(ArgumentError, match=f"^--nodes: {expected}$"):
        describe_cluster(topology="dgx2", nodes=nodes)
