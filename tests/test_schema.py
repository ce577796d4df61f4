"""Tests of the taccl-topology/1 file format: round trips and one fixture per malformed class."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from taccl_py.errors import ArgumentError, TopologyError
from taccl_py.topology import LinkKind, builtin_topology_names, load_topology
from taccl_py.topology.builtins import builtin_topology_dir
from taccl_py.topology.schema import SCHEMA_ID, generate_topology, parse_topology, read_topology, write_topology

BAD = Path(__file__).parent / "fixtures" / "bad_topologies"
PAIR = Path(__file__).parent / "fixtures" / "cli_topo" / "pair.json"

# One fixture per malformed class, with the field and fault its message must name.
MALFORMED = {
    "invalid_json.json": r"line \d+ column \d+: invalid JSON: ",
    "missing_field.json": r"links\[2\]\.bandwidth_GBps: missing field; expected a value for 'bandwidth_GBps'",
    "unknown_vertex_kind.json": r"vertices\[2\]\.kind: unknown vertex kind 'tpu'; expected one of gpu, nic, "
    "nvswitch, pcie_switch, net_switch, cpu",
    "unknown_link_kind.json": r"links\[3\]\.kind: unknown link kind 'nvlnk'; expected one of nvlink, nvswitch, pcie, "
    "host, ib, ethernet, xgmi",
    "duplicate_gpu_name.json": r"vertices\[2\]\.name: vertex 'gpu1' listed twice \(also vertices\[1\]\)",
    "duplicate_gpu_index.json": r"vertices\[2\]\.local_index: gpu local_index 1 listed twice \(also vertices\[1\]\)",
    "zero_bandwidth.json": r"links\[0\]\.bandwidth_GBps: bandwidth 0 is not positive; expected a number > 0",
    "negative_bandwidth.json": r"links\[1\]\.bandwidth_GBps: bandwidth -12 is not positive",
    "negative_alpha.json": r"links\[1\]\.alpha_us: alpha -0\.5 is negative; expected a number >= 0",
    "unknown_vertex.json": r"links\[2\]\.dst: unknown vertex 'cpu9'; expected a name listed under vertices",
    "wrong_schema.json": r"schema: unknown schema 'taccl-topology/2'; expected 'taccl-topology/1'",
}


def test_every_malformed_fixture_is_covered():
    assert sorted(path.name for path in BAD.glob("*.json")) == sorted(MALFORMED)


@pytest.mark.parametrize(("fixture", "message"), sorted(MALFORMED.items()))
def test_malformed_file_names_the_file_and_the_field(fixture, message):
    path = BAD / fixture
    with pytest.raises(TopologyError, match="^" + re.escape(str(path)) + ": " + message):
        read_topology(path)


@pytest.mark.parametrize("name", builtin_topology_names())
def test_builtin_round_trips_and_is_stored_in_canonical_form(name):
    topology = load_topology(name)
    text = generate_topology(topology)
    again = parse_topology(text, source=name)
    assert again.vertices == topology.vertices
    assert again.links == topology.links
    assert (again.name, again.description, again.sources) == (topology.name, topology.description, topology.sources)
    assert generate_topology(again) == text
    assert (builtin_topology_dir() / f"{name}.json").read_text(encoding="utf-8") == text


@pytest.mark.parametrize("name", builtin_topology_names())
def test_builtin_says_where_its_figures_come_from(name):
    topology = load_topology(name)
    assert topology.sources and topology.description
    assert all(nic.net_kind is LinkKind.IB and nic.net_bandwidth_GBps > 0 for nic in topology.nics())


def test_bidirectional_expands_to_two_directed_links():
    topology = read_topology(PAIR)
    assert topology.num_ranks == 2 and len(topology.links) == 8
    back = topology.link("gpu1", "gpu0")
    assert (back.kind, back.alpha_us, back.bandwidth_GBps) == (LinkKind.NVLINK, 0.7, 25.0)
    nic = topology.vertex("nic0")
    assert (nic.net_kind, nic.net_bandwidth_GBps, nic.net_alpha_us) == (LinkKind.IB, 12.5, 0.7)


def test_one_way_link_round_trips_as_bidirectional_false():
    document = json.loads(PAIR.read_text(encoding="utf-8"))
    document["links"][0]["bidirectional"] = False
    topology = parse_topology(json.dumps(document))
    assert topology.link("gpu0", "gpu1") is not None and topology.link("gpu1", "gpu0") is None
    text = generate_topology(topology)
    assert '"bidirectional": false' in text
    assert parse_topology(text).links == topology.links


def test_generated_text_is_one_vertex_or_link_per_line():
    text = generate_topology(read_topology(PAIR))
    assert text.startswith('{\n  "schema": "taccl-topology/1",\n')
    assert '    {"src": "gpu0", "dst": "gpu1", "kind": "nvlink", "alpha_us": 0.7, "bandwidth_GBps": 25.0},\n' in text
    lines = text.splitlines()
    assert sum(line.startswith('    {"name": ') for line in lines) == len(read_topology(PAIR).vertices)
    assert sum(line.startswith('    {"src": ') for line in lines) == 4  # the file's 4 bidirectional entries


def test_multi_node_topology_is_not_written(tmp_path):
    target = tmp_path / "pair.json"
    with pytest.raises(ArgumentError, match="nodes: topology spans 2 nodes; expected one machine per file"):
        write_topology(load_topology("ndv2", nodes=2), target)
    assert not target.exists()


def test_write_then_read_gives_the_machine_back(tmp_path):
    target = tmp_path / "sub" / "dgx2.json"
    target.parent.mkdir()
    write_topology(load_topology("dgx2"), target)
    assert read_topology(target).links == load_topology("dgx2").links
    assert [p.name for p in target.parent.iterdir()] == ["dgx2.json"]  # no temporary file left


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["links"][0].update(bandwith_GBps=3), r"links\[0\]\.bandwith_GBps: unknown field 'bandwith_GBps'"),
        (lambda d: d.update(extra=1), r"extra: unknown field 'extra'"),
        (lambda d: d["vertices"][0].pop("local_index"), r"vertices\[0\]\.local_index: missing field"),
        (
            lambda d: d["vertices"][0].update(local_index=True),
            r"vertices\[0\]\.local_index: found True; expected an integer >= 0",
        ),
        (lambda d: d["vertices"][1].update(local_index=3), r"vertices: GPU local indices \[0, 3\] have gaps"),
        (lambda d: d["vertices"][2].update(net_kind="ib"), r"vertices\[2\]\.net_kind: network field on a cpu vertex"),
        (
            lambda d: d["vertices"][3].update(net_kind="nvlink"),
            r"vertices\[3\]\.net_kind: unknown network kind 'nvlink'; expected one of ib, ethernet",
        ),
        (
            lambda d: d["links"].append(dict(d["links"][0], src="gpu1", dst="gpu0")),
            r"links\[4\]: link gpu1->gpu0 listed twice \(also links\[0\]\)",
        ),
        (lambda d: d["links"][0].update(dst="gpu0"), r"links\[0\]: link from 'gpu0' to itself"),
        (lambda d: d["links"][0].update(count=0), r"links\[0\]\.count: found 0; expected an integer >= 1"),
        (
            lambda d: d["links"][0].update(bidirectional="yes"),
            r"links\[0\]\.bidirectional: found 'yes'; expected true or false",
        ),
        (lambda d: d.update(vertices={}), r"vertices: found dict; expected a list of vertex objects"),
        (lambda d: d.update(name=""), r"name: found ''; expected a non-empty string"),
    ],
)
def test_other_faults_name_their_field(edit, message):
    document = json.loads(PAIR.read_text(encoding="utf-8"))
    edit(document)
    with pytest.raises(TopologyError, match="^mine.json: " + message):
        parse_topology(json.dumps(document), source="mine.json")


def test_non_finite_number_is_refused():
    text = PAIR.read_text(encoding="utf-8").replace('"bandwidth_GBps": 25', '"bandwidth_GBps": NaN')
    with pytest.raises(TopologyError, match="NaN is not a JSON number"):
        parse_topology(text)


def test_integer_beyond_float_range_is_refused():
    text = PAIR.read_text(encoding="utf-8").replace('"bandwidth_GBps": 25', '"bandwidth_GBps": 1' + "0" * 400)
    with pytest.raises(TopologyError, match=r"bandwidth_GBps: found 10+; expected a finite number"):
        parse_topology(text)


def test_top_level_must_be_an_object():
    with pytest.raises(TopologyError, match=r"^<string>: found list; expected a JSON object$"):
        parse_topology("[]")


def test_unreadable_file_is_a_topology_error(tmp_path):
    with pytest.raises(TopologyError, match="cannot read"):
        read_topology(tmp_path / "missing.json")


def test_schema_id_is_the_documented_one():
    assert SCHEMA_ID == "taccl-topology/1"
    assert f'"schema": "{SCHEMA_ID}"' in (Path(__file__).parents[1] / "docs" / "topology-format.md").read_text(
        encoding="utf-8"
    )


def _reducing_star(**switch: object) -> str:
    """Return the text of two GPUs on an NVSwitch whose vertex carries ``switch``'s extra fields."""
    document = {
        "schema": SCHEMA_ID,
        "name": "star",
        "vertices": [
            {"name": "gpu0", "kind": "gpu", "local_index": 0},
            {"name": "gpu1", "kind": "gpu", "local_index": 1},
            {"name": "sw", "kind": "nvswitch", **switch},
        ],
        "links": [
            {"src": f"gpu{i}", "dst": "sw", "kind": "nvswitch", "alpha_us": 0.5, "bandwidth_GBps": 100} for i in (0, 1)
        ],
    }
    return json.dumps(document)


def test_a_reducing_switch_round_trips_and_old_files_load_without_it():
    topology = parse_topology(_reducing_star(reduce_bandwidth_GBps=80, reduce_alpha_us=2))
    switch = topology.vertex("sw")
    assert (switch.reduce_bandwidth_GBps, switch.reduce_alpha_us, switch.reduces_in_network) == (80.0, 2.0, True)
    text = generate_topology(topology)
    assert '"reduce_bandwidth_GBps": 80.0, "reduce_alpha_us": 2.0' in text
    assert parse_topology(text).vertices == topology.vertices
    plain = parse_topology(_reducing_star())
    assert not plain.vertex("sw").reduces_in_network and "reduce_" not in generate_topology(plain)
    assert load_topology("dgx-h100").vertex("nvswitch").reduces_in_network
    assert not any(v.reduces_in_network for v in load_topology("dgx-a100").vertices)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"reduce_bandwidth_GBps": 80}, r"vertices\[2\]\.reduce_alpha_us: missing field; expected reduce_alpha_us"),
        (
            {"reduce_bandwidth_GBps": 0, "reduce_alpha_us": 1},
            r"vertices\[2\]\.reduce_bandwidth_GBps: bandwidth 0 is not positive",
        ),
        ({"reduce_bandwidth_GBps": 80, "reduce_alpha_us": -1}, r"vertices\[2\]\.reduce_alpha_us: alpha -1 is negative"),
    ],
)
def test_reduction_faults_name_their_field(fields, message):
    with pytest.raises(TopologyError, match="^mine.json: " + message):
        parse_topology(_reducing_star(**fields), source="mine.json")


def test_reduction_fields_belong_on_an_nvswitch():
    document = json.loads(_reducing_star())
    document["vertices"][0].update(reduce_bandwidth_GBps=80, reduce_alpha_us=1)
    with pytest.raises(TopologyError, match=r"vertices\[0\]\.reduce_bandwidth_GBps: reduction field on a gpu vertex"):
        parse_topology(json.dumps(document), source="mine.json")
