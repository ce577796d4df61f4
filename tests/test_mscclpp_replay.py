"""The MSCCL++ replay's fast order checks give the verdicts of the plain transitive closure they replace.

``_reference_races`` is the race check as first written (an ancestor bit set per event, every
access pair asked); the replay must name the same faults, in the same words, on random graphs and
on random mutations of real plans, racy and deadlocked ones included.
"""

from __future__ import annotations

import functools
import json
import random
from collections import defaultdict
from pathlib import Path

import pytest

from taccl_py.baselines import ring_algorithm
from taccl_py.errors import FormatError
from taccl_py.ir.collectives import Collective
from taccl_py.mscclpp import check_mscclpp_plan, parse_mscclpp_plan, replay, replay_graph
from taccl_py.mscclpp.event_order import in_forced_order, reached_neighbours, reaching_pairs, topological_order
from taccl_py.mscclpp.export import generate_mscclpp_plan
from taccl_py.mscclpp.replay_graph import Event, ReplayGraph, describe_location, violation_at
from taccl_py.topology import load_topology

FIXTURES = Path(__file__).parent / "fixtures" / "mscclpp"
SEEDS = range(40)


def _reference_ancestors(predecessors: list[set[int]], order: list[int]) -> list[int]:
    reach = [0] * len(predecessors)
    for node in order:
        bits = 1 << node
        for pred in predecessors[node]:
            bits |= reach[pred]
        reach[node] = bits
    return reach


def _reference_races(graph: ReplayGraph, order: list[int]) -> list:
    """Return the races as the first replay found them: full ancestor sets, every pair in turn."""
    seen_by = _reference_ancestors(graph.visible, order)
    after = _reference_ancestors(graph.order, order)
    position = {node: i for i, node in enumerate(order)}
    accesses = defaultdict(list)
    for node in order:
        for dst_locs, sources in graph.events[node].writes:
            for loc in (loc for locs in sources for loc in locs):
                accesses[loc].append((node, False))
            for loc in dst_locs:
                accesses[loc].append((node, True))
    problems = []
    for loc, items in accesses.items():
        for early, late, late_writes in _reference_conflicts(items, position):
            writes_early = any(writes for other, writes in items if other == early)
            relation = after if late_writes and not writes_early else seen_by
            packet_edge = loc[3] and early in graph.order[late] and not late_writes
            if relation[late] >> early & 1 or packet_edge:
                continue
            other = graph.events[early].label
            if late_writes:
                message = f"writes {describe_location(loc)} while {other} may still use it"
            else:
                message = f"reads {describe_location(loc)} before it is guaranteed written by {other}"
            problems.append(violation_at(graph.events[late], "race", message))
            break
    return sorted(problems, key=lambda problem: "reads " not in problem.message)


def _reference_conflicts(items, position):
    for i, (first, first_writes) in enumerate(items):
        for second, second_writes in items[i + 1 :]:
            if first != second and (first_writes or second_writes):
                early, late = (first, second) if position[first] < position[second] else (second, first)
                yield early, late, (second_writes if late == second else first_writes)


def _random_graph(rng: random.Random, size: int) -> ReplayGraph:
    """Return a random acyclic replay graph: random edges, some not publishing, accesses to a few locations."""
    graph = ReplayGraph()
    locations = [(rng.randrange(2), "s", rng.randrange(3), rng.random() < 0.3) for _ in range(6)]
    for node in range(size):
        event = Event(node % 3, node % 4, node, f"event {node}")
        for _ in range(rng.randrange(3)):
            destination = [rng.choice(locations)]
            event.writes.append((destination, [[rng.choice(locations)] for _ in range(rng.randrange(3))]))
        graph.add(event)
        for before in rng.sample(range(node), min(node, rng.randrange(3))):
            graph.edge(before, node, publishes=rng.random() < 0.7)
    return graph


@pytest.mark.parametrize("seed", SEEDS)
def test_races_match_the_full_closure_on_random_graphs(seed):
    rng = random.Random(seed)
    graph = _random_graph(rng, rng.randrange(2, 40))
    order = topological_order(graph.order)
    assert replay._races(graph, order) == _reference_races(graph, order)


def test_random_graphs_have_races_and_race_free_ones():
    found = []
    for seed in SEEDS:
        rng = random.Random(seed)
        graph = _random_graph(rng, rng.randrange(2, 40))
        found.append(bool(replay._races(graph, topological_order(graph.order))))
    assert any(found) and not all(found)


@pytest.mark.parametrize("seed", SEEDS)
def test_reaching_pairs_is_reachability(seed):
    rng = random.Random(seed)
    graph = _random_graph(rng, rng.randrange(2, 40))
    order = topological_order(graph.order)
    reach = _reference_ancestors(graph.order, order)
    pairs = [(rng.randrange(len(order)), rng.randrange(len(order))) for _ in range(50)]
    assert reaching_pairs(graph.order, order, pairs) == {(a, b) for a, b in pairs if reach[b] >> a & 1}


@pytest.mark.parametrize("seed", SEEDS)
def test_known_paths_do_not_change_the_forced_order(seed):
    rng = random.Random(seed)
    graph = _random_graph(rng, rng.randrange(2, 40))
    order = topological_order(graph.order)
    position = {node: place for place, node in enumerate(order)}
    groups = [event.tb for event in graph.events]
    events = rng.sample(range(len(order)), rng.randrange(1, min(6, len(order)) + 1))
    known = reached_neighbours(graph.order, order, groups, [events])
    assert in_forced_order(graph.order, groups, events, position, known) == in_forced_order(
        graph.order, groups, events, position
    )


@functools.cache
def _exported(name: str, nodes: int, collective: Collective) -> str:
    topology = load_topology(name, nodes=nodes)
    return json.dumps(generate_mscclpp_plan(ring_algorithm(topology, collective), topology if nodes > 1 else None))


def _fixtures() -> list[str]:
    return [path.read_text() for path in sorted(FIXTURES.glob("*.json"))]


def _mutate(document: dict, rng: random.Random) -> None:
    """Drop, swap or relax one or two ops of random threadblocks."""
    for _ in range(rng.randrange(1, 3)):
        gpu = rng.choice(document["gpus"])
        ops = rng.choice(gpu["threadblocks"])["ops"]
        if not ops:
            continue
        index, change = rng.randrange(len(ops)), rng.choice(("drop", "swap", "relax"))
        if change == "drop":
            del ops[index]
        elif change == "swap" and index + 1 < len(ops):
            ops[index], ops[index + 1] = ops[index + 1], ops[index]
        elif ops[index]["name"] in ("signal", "wait"):
            ops[index]["name"] = "rlx" + ops[index]["name"]


def _reference_check(plan, monkeypatch) -> list:
    with monkeypatch.context() as patch:
        patch.setattr(replay, "_races", _reference_races)
        patch.setattr(replay_graph, "reached_neighbours", lambda *_args: set())
        return check_mscclpp_plan(plan)


def _assert_same_verdicts(texts: list[str], seed: int, mutations: int, monkeypatch) -> set[str]:
    """Check mutations of each plan in ``texts`` against the reference; return the kinds of fault seen."""
    rng, kinds = random.Random(seed), set()
    for text in texts:
        for _ in range(mutations):
            document = json.loads(text)
            _mutate(document, rng)
            try:
                plan = parse_mscclpp_plan(json.dumps(document), "mutated.json")
            except FormatError:
                continue
            problems = check_mscclpp_plan(plan)
            assert problems == _reference_check(plan, monkeypatch)
            kinds |= {problem.kind for problem in problems}
    return kinds


# two seeds in the default run (about 3 s each), six more with --runslow
@pytest.mark.parametrize("seed", [*range(2), *(pytest.param(s, marks=pytest.mark.slow) for s in range(2, 8))])
def test_verdicts_match_the_full_closure_on_mutated_plans(seed, monkeypatch):
    # the ring's threadblocks are cut at 64 ops, so pieces share channels: the forced-order search runs
    texts = _fixtures() + [_exported("ndv2", 1, Collective.ALLREDUCE)]
    kinds = _assert_same_verdicts(texts, seed, 3, monkeypatch)
    assert {"race", "deadlock"} & kinds


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_verdicts_match_the_full_closure_on_mutated_port_plans(seed, monkeypatch):
    _assert_same_verdicts([_exported("dgx-a100", 2, Collective.ALLGATHER)], seed, 4, monkeypatch)


def _flush_then_reuse_plan(flush_outputs: bool) -> str:
    """Return a 2-GPU AllGather whose port put reads a scratch chunk that a copy overwrites after a ``flush``.

    The flush waits for the proxy's read only where it names the put in ``dst_buff``: the executor
    flushes ``nOutputs`` channels (``handleFlush``), counted from ``dst_buff`` alone.
    """

    def ref(kind: str, index: int) -> list[dict]:
        return [{"type": kind, "index": index, "size": 1}]

    gpus = []
    for rank in range(2):
        remote = [{"buffer_id": 0, "index": rank, "size": 1}]
        port = {"channel_type": "port", "channel_ids": [0]}
        flush = {"name": "flush", **port} | ({"dst_buff": remote} if flush_outputs else {})
        ops = [
            {"name": "copy", "src_buff": ref("i", 0), "dst_buff": ref("o", rank)},
            {"name": "copy", "src_buff": ref("i", 0), "dst_buff": ref("s", 0)},
            {"name": "nop"},
            {"name": "put", "src_buff": ref("s", 0), "dst_buff": remote, **port},
            {"name": "signal", **port},
            flush,
            {"name": "nop"},
            {"name": "copy", "src_buff": ref("o", rank), "dst_buff": ref("s", 0)},  # reuses the put's source
            {"name": "wait", **port},
        ]
        threadblock = {
            "id": 0,
            "ops": ops,
            "channels": [{"channel_type": "port", "channel_ids": [0]}],
            "remote_buffer_refs": [{"access_channel_type": "port", "remote_buffer_ids": [0]}],
        }
        gpus.append(
            {
                "id": rank,
                "input_chunks": 1,
                "output_chunks": 2,
                "scratch_chunks": 1,
                "threadblocks": [threadblock],
                "channels": [{"channel_type": "port", "connected_to": [1 - rank]}],
                "remote_buffers": [{"rank": 1 - rank, "type": "o", "access_channel_types": ["port"]}],
                "semaphores": [],
            }
        )
    document = {"name": "flush", "collective": "allgather", "protocol": "Simple", "inplace": False, "gpus": gpus}
    return json.dumps(document)


def test_a_flush_without_outputs_flushes_nothing_as_in_the_executor():
    # W4: the DSL writes a flush with channel_ids alone, which the executor runs as no flush at all
    assert check_mscclpp_plan(parse_mscclpp_plan(_flush_then_reuse_plan(True), "flush.json")) == []
    problems = check_mscclpp_plan(parse_mscclpp_plan(_flush_then_reuse_plan(False), "flush.json"))
    assert problems and {problem.kind for problem in problems} == {"race"}
    # the proxy's read of the put's source may come after the copy over it
    assert all("s slice 0" in p.message and "op 7 (copy)" in p.message for p in problems), problems
