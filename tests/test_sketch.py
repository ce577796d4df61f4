"""Sketches: TACCL's sketch files, our format, the automatic sketch, and faults."""

from __future__ import annotations

import re

import pytest

from taccl_py.errors import InfeasibleError, SketchError
from taccl_py.stages.logical import build_logical_graph
from taccl_py.stages.sketch import auto_sketch, check_sketch, generate_sketch, parse_sketch, read_sketch
from taccl_py.stages.sketch.auto import find_symmetry, nic_relays
from taccl_py.stages.sketch.model import IntranodeStrategy, Sketch, SwitchPolicy, rotate_rank
from taccl_py.stages.sketch.taccl import parse_taccl_sketch
from taccl_py.topology import load_topology

from helpers import FIXTURES

SKETCHES = FIXTURES / "taccl_sketch"
TACCL_SKETCH_FILES = sorted(p.name for p in SKETCHES.glob("sk*.json"))


def test_every_taccl_sketch_fixture_is_present():
    assert len(TACCL_SKETCH_FILES) == 9


@pytest.mark.parametrize("name", TACCL_SKETCH_FILES)
def test_taccl_sketches_parse(name):
    sketch = read_sketch(str(SKETCHES / name))
    assert sketch.nodes in (1, 2, 4)
    assert sketch.chunkup >= 1
    assert sketch.symmetry is not None
    if sketch.nodes > 1:
        assert sketch.internode_conn


@pytest.mark.parametrize("name", ["mi300x-n2.json", "sk-akmu-n2-gpu4.json"])
def test_sketches_of_taccl_users_parse(name):
    sketch = read_sketch(str(SKETCHES / "third_party" / name))
    assert sketch.nodes == 2 and sketch.chunkup == 1 and sketch.internode_conn


def test_taccl_dgx2_two_node_fields():
    sketch = read_sketch(str(SKETCHES / "sk1-dgx2-n2.json"))
    assert sketch.intranode is IntranodeStrategy.SWITCH
    assert sketch.switches == (tuple(range(16)),)
    assert sketch.switch_policies == (SwitchPolicy.UC_MIN,)
    assert sketch.internode_conn == tuple((2 * i + 1, 2 * i) for i in range(8))
    assert dict(sketch.relay_roots)[1] == (0, 1)
    assert sketch.symmetry == ((2, 16), (16, 32))
    assert sketch.chunkup == 2


@pytest.mark.parametrize("name, pairs", [("sk2-ndv2-n2.json", 64), ("sk3-ndv2-n2.json", 8)])
def test_connection_keywords_expand(name, pairs):
    sketch = check_sketch(read_sketch(str(SKETCHES / name)), load_topology("ndv2", nodes=2))
    assert len(sketch.internode_conn) == pairs


def test_our_format_round_trips():
    sketch = Sketch(
        name="mine",
        nodes=2,
        intranode=IntranodeStrategy.SWITCH,
        switches=((0, 1, 2, 3),),
        switch_policies=(SwitchPolicy.UC_MAX,),
        internode_conn=((0, 1), (2, 3)),
        relay_roots=((0, (0, 1)),),
        symmetry=((2, 4), (4, 8)),
        chunkup=3,
        source="mine.json",
    )
    again = parse_sketch(generate_sketch(sketch), "mine.json")
    assert again == sketch


def test_auto_keywords_round_trip():
    again = parse_sketch(generate_sketch(Sketch(name="a")), "a.json")
    assert again.internode_conn is None and again.symmetry is None and again.chunkup is None


def test_rotation():
    assert [rotate_rank(r, 2, 4) for r in range(8)] == [2, 3, 0, 1, 6, 7, 4, 5]


def test_auto_sketch_ndv2_two_nodes():
    sketch = auto_sketch(load_topology("ndv2", nodes=2))
    assert sketch.symmetry == ((8, 16),)  # the NIC on NUMA 0 breaks the mesh's rotation by 4
    assert sketch.internode_conn == ((0, 0), (0, 1))


def test_auto_sketch_dgx2_relays_pairs():
    topology = load_topology("dgx2", nodes=2)
    assert find_symmetry(topology) == ((2, 16), (16, 32))
    assert nic_relays(topology) == tuple((2 * i, 2 * i + j) for i in range(8) for j in range(2))


def test_pcie_machine_sends_from_every_gpu_near_the_nic():
    pairs = nic_relays(load_topology("pcie-8gpu", nodes=2))
    assert {a for a, _ in pairs} == set(range(8))


def test_single_node_symmetry_found():
    assert find_symmetry(load_topology("ndv2")) == ((4, 8),)
    assert find_symmetry(load_topology("dgx-a100")) == ((1, 8),)


def test_logical_graph_of_ndv2_uses_nvlinks_only():
    graph = build_logical_graph(load_topology("ndv2"), Sketch())
    assert len(graph.links) == 32
    assert all(len(link.resources) == 1 for link in graph.links)


def test_reversed_graph_keeps_costs():
    graph = build_logical_graph(load_topology("ndv2", nodes=2), Sketch())
    back = graph.reverse()
    assert back.reversed and {(l.dst, l.src) for l in back.links} == {(l.src, l.dst) for l in graph.links}


# -- faults -----------------------------------------------------------------------------------------


def test_invalid_json():
    with pytest.raises(SketchError, match=r"bad.json: line 1: invalid JSON"):
        parse_sketch("{", "bad.json")


def test_wrong_field_type():
    with pytest.raises(SketchError, match=r"x.json: nnodes: 'two' is not an integer >= 1"):
        parse_taccl_sketch('{"nnodes": "two"}', "x.json")


def test_unknown_strategy():
    with pytest.raises(SketchError, match=r"intranode_sketch.strategy: unknown value 'ring'"):
        parse_taccl_sketch('{"intranode_sketch": {"strategy": "ring"}}', "x.json")


@pytest.mark.parametrize(
    "text, field",
    [
        (
            '{"nnodes": 1, "symetry_offsets": [[1, 8]]}',
            "symetry_offsets: unknown field 'symetry_offsets'; "
            "expected one of nnodes, intranode_sketch, internode_sketch, symmetry_offsets, hyperparameters",
        ),
        (
            '{"intranode_sketch": {"strategy": "switch", "switches": [[0, 1]], "switch_hyperedge": ["uc-max"]}}',
            "intranode_sketch.switch_hyperedge: unknown field 'switch_hyperedge'",
        ),
        (
            '{"nnodes": 2, "internode_sketch": {"strategy": "relay", "internode_con": {"0": [1]}}}',
            "internode_sketch.internode_con: unknown field 'internode_con'",
        ),
        (
            '{"hyperparameters": {"input_chunkup": 2, "heuristic": 5}}',
            "hyperparameters.heuristic: unknown field 'heuristic'; expected one of input_chunkup",
        ),
        ('{"schema": "taccl-sketch/1", "chunk_up": 2}', "chunk_up: unknown field 'chunk_up'"),
        (
            '{"schema": "taccl-sketch/1", "intranode": {"strategy": "auto", "switch": [[0, 1]]}}',
            "intranode.switch: unknown field 'switch'",
        ),
    ],
)
def test_unknown_key_names_file_and_key(tmp_path, text, field):
    path = tmp_path / "sketch.json"
    path.write_text(text)
    with pytest.raises(SketchError, match="^" + re.escape(f"{path}: {field}")):
        read_sketch(str(path))


def test_wrong_shapes_of_nested_objects():
    with pytest.raises(SketchError, match=r"x.json: hyperparameters: 3; expected an object"):
        parse_taccl_sketch('{"hyperparameters": 3}', "x.json")
    with pytest.raises(SketchError, match=r"x.json: intranode_sketch.switches: 4 is not a list"):
        parse_taccl_sketch('{"intranode_sketch": {"strategy": "switch", "switches": 4}}', "x.json")
    with pytest.raises(SketchError, match=r"x.json: internode_sketch: \[\]; expected an object"):
        parse_taccl_sketch('{"internode_sketch": []}', "x.json")


def test_wrong_schema():
    with pytest.raises(SketchError, match=r"schema: 'taccl-sketch/9'"):
        parse_sketch('{"schema": "taccl-sketch/9"}', "x.json")


def test_sketch_for_wrong_gpu_count():
    sketch = read_sketch(str(SKETCHES / "sk1-dgx2-n2.json"))
    with pytest.raises(SketchError, match=r"local GPU \d+ out of range \(the topology has 8 GPUs per node\)"):
        check_sketch(sketch, load_topology("ndv2", nodes=2))


def test_sketch_for_wrong_node_count():
    sketch = read_sketch(str(SKETCHES / "sk1-ndv2-n2.json"))
    with pytest.raises(SketchError, match=r"nnodes: sketch for 2 nodes but the topology has 4"):
        check_sketch(sketch, load_topology("ndv2", nodes=4))


def test_symmetry_that_does_not_fit():
    sketch = Sketch(symmetry=((1, 8),), source="rot.json")
    with pytest.raises(SketchError, match=r"rot.json: symmetry_offsets: rotation \[1, 8\] maps link"):
        build_logical_graph(load_topology("ndv2"), sketch)


def test_infeasible_relays():
    sketch = parse_taccl_sketch(
        '{"nnodes": 2, "internode_sketch": {"strategy": "relay", "internode_conn": {"0": [1]}, '
        '"gpus_to_sender_rev_map": {"0": [0]}}}',
        "relay.json",
    )
    with pytest.raises(InfeasibleError, match=r"relay.json: infeasible sketch: chunks of rank 1 cannot reach rank 8"):
        build_logical_graph(load_topology("ndv2", nodes=2), sketch)
