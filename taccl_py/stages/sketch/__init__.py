"""Communication sketches: the hints that shape the synthesizer's logical topology.

A sketch says which GPU-to-GPU transfers the synthesizer may use and how to cut the problem:

* ``intranode``: ``auto`` (direct links, plus switch or PCIe routes nearly as fast as the GPU's
  best one), ``none`` (TACCL's name for the same), ``switch`` (``switches`` lists groups of local
  GPUs on one switch; every pair inside a group may talk through it) or ``maxmin``/``minmax``
  (accepted from TACCL, treated as ``auto``). ``switch_policies`` (``uc-min``/``uc-max``, one per
  switch) asks for few or many distinct peers per GPU on that switch.
* ``internode_conn``: which local GPU of a machine sends to which local GPU of another
  (``None``: automatic, from NIC affinity: the GPUs nearest each NIC relay through it to the GPUs
  nearest the same NIC elsewhere). ``relay_roots`` restricts what a sender relays: the local GPUs
  whose chunks it may send across (TACCL's ``gpus_to_sender_rev_map``).
* ``node_relays``: per ordered machine pair (src, dst), the (sender, receiver) pairs that replace
  ``internode_conn`` between those two machines; filled automatically on clusters whose
  machines differ (a NIC down, another kind of machine), where one pattern cannot fit every pair.
* ``symmetry``: rotations ``(offset, group)``: rank r maps to ``group * (r // group) +
  (r + offset) % group``; the routes of a chunk's images are the images of its route. ``None``
  means: find them from the topology (``find_symmetry``).
* ``chunkup``: how many chunks each rank's input is cut into for routing (TACCL's
  ``input_chunkup``); ``None`` lets the synthesizer try several.

Two file forms are read: ours (JSON with ``"schema": "taccl-sketch/1"``, written by
``generate_sketch``) and TACCL's sketch JSON unchanged (``parse_taccl_sketch``; fields in
TACCL's README: ``nnodes``, ``intranode_sketch``, ``internode_sketch``, ``symmetry_offsets``,
``hyperparameters.input_chunkup``). ``auto_sketch(topology)`` derives a sketch so that no user
has to write one.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from taccl_py._io import read_text, write_text_atomic
from taccl_py.errors import SketchError
from taccl_py.stages.sketch.auto import cluster_relays, find_symmetry
from taccl_py.stages.sketch.fields import (
    check_keys,
    connections_field,
    int_field,
    intranode_field,
    json_object,
    node_relays_field,
    relay_roots_field,
    symmetry_field,
)
from taccl_py.stages.sketch.model import DIRECT_MAP, FULLY_CONNECTED, KEYWORD_PAIRS, Sketch
from taccl_py.stages.sketch.taccl import parse_taccl_sketch
from taccl_py.topology.model import Topology

__all__ = [
    "SKETCH_KEYS",
    "SKETCH_SCHEMA",
    "auto_sketch",
    "check_sketch",
    "generate_sketch",
    "parse_sketch",
    "read_sketch",
    "write_sketch",
]

SKETCH_SCHEMA = "taccl-sketch/1"
# The keys of a taccl-sketch/1 object, as generate_sketch writes them; any other is refused.
SKETCH_KEYS = (
    "schema",
    "name",
    "nodes",
    "intranode",
    "internode_conn",
    "relay_roots",
    "node_relays",
    "symmetry",
    "chunkup",
)


def parse_sketch(text: str, source: str = "<string>") -> Sketch:
    """Return the sketch in ``text``: our ``taccl-sketch/1`` JSON, or else TACCL's sketch JSON."""
    obj = json_object(text, source)
    if "schema" not in obj:
        return parse_taccl_sketch(text, source)
    if obj["schema"] != SKETCH_SCHEMA:
        raise SketchError(source, "schema", f"{obj['schema']!r}", repr(SKETCH_SCHEMA))
    check_keys(obj, SKETCH_KEYS, source)
    nodes = obj.get("nodes")
    strategy, switches, policies = intranode_field(obj.get("intranode", {"strategy": "auto"}), source, "intranode")
    conn_raw = obj.get("internode_conn", "auto")
    conn = None if conn_raw == "auto" else connections_field(conn_raw, source, "internode_conn")
    symmetry_raw = obj.get("symmetry", "auto")
    chunkup = obj.get("chunkup")
    return Sketch(
        name=str(obj.get("name", source)),
        nodes=None if nodes is None else int_field(nodes, source, "nodes", 1),
        intranode=strategy,
        switches=switches,
        switch_policies=policies,
        internode_conn=KEYWORD_PAIRS[conn] if isinstance(conn, str) else conn,
        relay_roots=relay_roots_field(obj.get("relay_roots"), source, "relay_roots"),
        node_relays=node_relays_field(obj.get("node_relays", []), source, "node_relays"),
        symmetry=None if symmetry_raw == "auto" else symmetry_field(symmetry_raw, source, "symmetry"),
        chunkup=None if chunkup is None else int_field(chunkup, source, "chunkup", 1),
        source=source,
    )


def read_sketch(path: str) -> Sketch:
    """Return the sketch in the file at ``path`` (ours or TACCL's)."""
    return parse_sketch(read_text(path, SketchError), str(path))


def generate_sketch(sketch: Sketch) -> str:
    """Return the ``taccl-sketch/1`` JSON text of ``sketch``."""
    obj: dict[str, Any] = {"schema": SKETCH_SCHEMA, "name": sketch.name, "nodes": sketch.nodes}
    obj["intranode"] = {
        "strategy": sketch.intranode.value,
        "switches": [list(group) for group in sketch.switches],
        "switch_hyperedge_strategy": [p.value for p in sketch.switch_policies],
    }
    if sketch.internode_conn is None:
        obj["internode_conn"] = "auto"
    else:
        obj["internode_conn"] = _connection_object(sketch.internode_conn)
    if sketch.relay_roots is not None:
        obj["relay_roots"] = {str(sender): list(roots) for sender, roots in sketch.relay_roots}
    if sketch.node_relays:
        obj["node_relays"] = [
            {"from": src, "to": dst, "conn": _connection_object(pairs)} for src, dst, pairs in sketch.node_relays
        ]
    obj["symmetry"] = "auto" if sketch.symmetry is None else [list(pair) for pair in sketch.symmetry]
    obj["chunkup"] = sketch.chunkup
    return json.dumps(obj, indent=2) + "\n"


def _connection_object(pairs: tuple[tuple[int, int], ...]) -> dict[str, list[int]]:
    conn: dict[str, list[int]] = {}
    for sender, receiver in pairs:
        conn.setdefault(str(sender), []).append(receiver)
    return conn


def write_sketch(sketch: Sketch, path: str) -> None:
    """Write ``sketch`` as ``taccl-sketch/1`` JSON to ``path`` atomically."""
    write_text_atomic(path, generate_sketch(sketch))


# -- checking against a topology ------------------------------------------------------------------


def _check_local(ids: tuple[int, ...], gpn: int, source: str, field: str) -> None:
    for gpu in ids:
        if gpu >= gpn:
            raise SketchError(
                source,
                field,
                f"local GPU {gpu} out of range (the topology has {gpn} GPUs per node)",
                f"local GPU ids 0..{gpn - 1}",
            )


def check_sketch(sketch: Sketch, topology: Topology) -> Sketch:
    """Return ``sketch`` checked against ``topology``, keywords expanded and gaps filled automatically.

    Raises ``SketchError`` when the sketch is for another node count or GPU count (a local GPU
    id out of range, a symmetry group that does not divide the ranks).
    """
    gpn, source = topology.gpus_per_node, sketch.source
    if sketch.nodes is not None and sketch.nodes != topology.nodes:
        raise SketchError(
            source,
            "nnodes",
            f"sketch for {sketch.nodes} nodes but the topology has {topology.nodes}",
            f"nnodes {topology.nodes}",
        )
    for index, group in enumerate(sketch.switches):
        _check_local(group, gpn, source, f"intranode_sketch.switches[{index}]")
    conn, node_relays = sketch.internode_conn, sketch.node_relays
    if conn == FULLY_CONNECTED:
        conn = tuple((a, b) for a in range(gpn) for b in range(gpn))
    elif conn == DIRECT_MAP:
        conn = tuple((a, a) for a in range(gpn))
    elif conn is None and topology.nodes > 1:
        conn, found = cluster_relays(topology)
        node_relays = node_relays or found
    for sender, receiver in conn or ():
        _check_local((sender, receiver), gpn, source, "internode_sketch.internode_conn")
    for index, (src, dst, pairs) in enumerate(node_relays):
        if src == dst or max(src, dst) >= topology.nodes:
            raise SketchError(
                source,
                f"node_relays[{index}]",
                f"machine pair ({src}, {dst}) for a topology of {topology.nodes} machines",
                f"two different machines 0..{topology.nodes - 1}",
            )
        for sender, receiver in pairs:
            _check_local((sender, receiver), gpn, source, f"node_relays[{index}].conn")
    for sender, roots in sketch.relay_roots or ():
        _check_local((sender,) + roots, gpn, source, "internode_sketch.gpus_to_sender_rev_map")
    symmetry = sketch.symmetry
    for offset, group in symmetry or ():
        if group > topology.num_ranks or topology.num_ranks % group or offset % group == 0 and offset:
            raise SketchError(
                source,
                "symmetry_offsets",
                f"rotation [{offset}, {group}] does not fit {topology.num_ranks} ranks",
                "groups that divide the rank count",
            )
    if symmetry is None:
        symmetry = find_symmetry(topology)
    return replace(
        sketch,
        nodes=topology.nodes,
        internode_conn=conn if topology.nodes > 1 else (),
        node_relays=node_relays if topology.nodes > 1 else (),
        symmetry=symmetry,
    )


# -- the automatic sketch -------------------------------------------------------------------------


def auto_sketch(topology: Topology) -> Sketch:
    """Return the sketch the synthesizer uses when none is given: NIC relays and symmetry found.

    >>> from taccl_py.topology import load_topology
    >>> s = auto_sketch(load_topology("ndv2", nodes=2))
    >>> s.symmetry, s.internode_conn
    (((8, 16),), ((0, 0), (0, 1)))
    """
    return check_sketch(
        Sketch(name=f"auto-{topology.name}", nodes=topology.nodes, source=f"<auto sketch for {topology.name}>"),
        topology,
    )
