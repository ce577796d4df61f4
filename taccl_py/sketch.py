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
import logging
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from taccl_py._io import read_text, write_text_atomic
from taccl_py.errors import SketchError, TopologyError
from taccl_py.topology.model import Topology, VertexKind, route

__all__ = [
    "SKETCH_SCHEMA",
    "IntranodeStrategy",
    "SwitchPolicy",
    "Sketch",
    "parse_sketch",
    "parse_taccl_sketch",
    "read_sketch",
    "generate_sketch",
    "write_sketch",
    "auto_sketch",
    "check_sketch",
    "find_symmetry",
    "nic_relays",
    "rotate_rank",
]

logger = logging.getLogger(__name__)

SKETCH_SCHEMA = "taccl-sketch/1"
# Routes within this fraction of a GPU's best intra-node bandwidth join the automatic logical
# topology: a PCIe hop at 12 GB/s beside 43 GB/s NVLinks would only add latency and contention.
AUTO_MIN_BANDWIDTH_FRACTION = 0.5


class IntranodeStrategy(str, Enum):
    """How GPUs inside one machine may talk; values are TACCL's spelling (plus ``auto``)."""

    AUTO = "auto"
    NONE = "none"
    SWITCH = "switch"
    MAXMIN = "maxmin"
    MINMAX = "minmax"


class SwitchPolicy(str, Enum):
    """TACCL's switch hyperedge strategies: few (uc-min) or many (uc-max) unique connections."""

    UC_MIN = "uc-min"
    UC_MAX = "uc-max"


@dataclass(frozen=True)
class Sketch:
    """A communication sketch; see the module docstring for the fields' meaning."""

    name: str = "auto"
    nodes: int | None = None
    intranode: IntranodeStrategy = IntranodeStrategy.AUTO
    switches: tuple[tuple[int, ...], ...] = ()
    switch_policies: tuple[SwitchPolicy, ...] = ()
    internode_conn: tuple[tuple[int, int], ...] | None = None
    relay_roots: tuple[tuple[int, tuple[int, ...]], ...] | None = None
    enforce_ordering: bool = False
    symmetry: tuple[tuple[int, int], ...] | None = None
    chunkup: int | None = None
    source: str = "<auto>"


def rotate_rank(rank: int, offset: int, group: int) -> int:
    """Return the image of ``rank`` under the rotation by ``offset`` inside blocks of ``group`` ranks.

    >>> rotate_rank(15, 2, 16), rotate_rank(17, 16, 32)
    (1, 1)
    """
    return group * (rank // group) + (rank + offset) % group


def parse_taccl_sketch(text: str, source: str = "<string>") -> Sketch:
    """Return the ``Sketch`` a TACCL sketch JSON describes (see ``taccl_py.sketch_taccl``).

    >>> s = parse_taccl_sketch('{"nnodes": 2, "internode_sketch": {"strategy": "relay", '
    ...     '"internode_conn": {"0": [1]}}, "symmetry_offsets": [[8, 16]], '
    ...     '"hyperparameters": {"input_chunkup": 2}}')
    >>> s.nodes, s.internode_conn, s.symmetry, s.chunkup
    (2, ((0, 1),), ((8, 16),), 2)
    """
    from taccl_py import sketch_taccl

    return sketch_taccl.parse_taccl_sketch(text, source)


def parse_sketch(text: str, source: str = "<string>") -> Sketch:
    """Return the sketch in ``text``: our ``taccl-sketch/1`` JSON, or else TACCL's sketch JSON."""
    from taccl_py.sketch_taccl import KEYWORD_PAIRS, _connections, _int, _intranode, _json_object, _relay_roots, _symmetry

    obj = _json_object(text, source)
    if "schema" not in obj:
        return parse_taccl_sketch(text, source)
    if obj["schema"] != SKETCH_SCHEMA:
        raise SketchError(source, "schema", f"{obj['schema']!r}", repr(SKETCH_SCHEMA))
    nodes = obj.get("nodes")
    strategy, switches, policies = _intranode(obj.get("intranode", {"strategy": "auto"}), source)
    conn_raw = obj.get("internode_conn", "auto")
    conn = None if conn_raw == "auto" else _connections(conn_raw, source, "internode_conn", None)
    symmetry_raw = obj.get("symmetry", "auto")
    chunkup = obj.get("chunkup")
    return Sketch(
        name=str(obj.get("name", source)), nodes=None if nodes is None else _int(nodes, source, "nodes", 1),
        intranode=strategy, switches=switches, switch_policies=policies,
        internode_conn=KEYWORD_PAIRS[conn] if isinstance(conn, str) else conn,
        relay_roots=_relay_roots(obj.get("relay_roots"), source, "relay_roots"),
        enforce_ordering=bool(obj.get("enforce_ordering", False)),
        symmetry=None if symmetry_raw == "auto" else _symmetry(symmetry_raw, source, "symmetry"),
        chunkup=None if chunkup is None else _int(chunkup, source, "chunkup", 1), source=source,
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
        conn: dict[str, list[int]] = {}
        for sender, receiver in sketch.internode_conn:
            conn.setdefault(str(sender), []).append(receiver)
        obj["internode_conn"] = conn
    if sketch.relay_roots is not None:
        obj["relay_roots"] = {str(sender): list(roots) for sender, roots in sketch.relay_roots}
    obj["enforce_ordering"] = sketch.enforce_ordering
    obj["symmetry"] = "auto" if sketch.symmetry is None else [list(pair) for pair in sketch.symmetry]
    obj["chunkup"] = sketch.chunkup
    return json.dumps(obj, indent=2) + "\n"


def write_sketch(sketch: Sketch, path: str) -> None:
    """Write ``sketch`` as ``taccl-sketch/1`` JSON to ``path`` atomically."""
    write_text_atomic(path, generate_sketch(sketch))


# -- checking against a topology ------------------------------------------------------------------

def _check_local(ids: tuple[int, ...], gpn: int, source: str, field: str) -> None:
    for gpu in ids:
        if gpu >= gpn:
            raise SketchError(source, field, f"local GPU {gpu} out of range (the topology has {gpn} GPUs per node)", f"local GPU ids 0..{gpn - 1}")


def check_sketch(sketch: Sketch, topology: Topology) -> Sketch:
    """Return ``sketch`` checked against ``topology``, keywords expanded and gaps filled automatically.

    Raises ``SketchError`` when the sketch is for another node count or GPU count (a local GPU
    id out of range, a symmetry group that does not divide the ranks).
    """
    from taccl_py.sketch_taccl import DIRECT_MAP, FULLY_CONNECTED

    gpn, source = topology.gpus_per_node, sketch.source
    if sketch.nodes is not None and sketch.nodes != topology.nodes:
        raise SketchError(source, "nnodes", f"sketch for {sketch.nodes} nodes but the topology has {topology.nodes}", f"nnodes {topology.nodes}")
    for index, group in enumerate(sketch.switches):
        _check_local(group, gpn, source, f"intranode_sketch.switches[{index}]")
    conn = sketch.internode_conn
    if conn == FULLY_CONNECTED:
        conn = tuple((a, b) for a in range(gpn) for b in range(gpn))
    elif conn == DIRECT_MAP:
        conn = tuple((a, a) for a in range(gpn))
    elif conn is None and topology.nodes > 1:
        conn = nic_relays(topology)
    for sender, receiver in conn or ():
        _check_local((sender, receiver), gpn, source, "internode_sketch.internode_conn")
    for sender, roots in sketch.relay_roots or ():
        _check_local((sender,) + roots, gpn, source, "internode_sketch.gpus_to_sender_rev_map")
    symmetry = sketch.symmetry
    for offset, group in symmetry or ():
        if group > topology.num_ranks or topology.num_ranks % group or offset % group == 0 and offset:
            raise SketchError(source, "symmetry_offsets", f"rotation [{offset}, {group}] does not fit {topology.num_ranks} ranks", "groups that divide the rank count")
    if symmetry is None:
        symmetry = find_symmetry(topology)
    return replace(sketch, nodes=topology.nodes, internode_conn=conn if topology.nodes > 1 else (), symmetry=symmetry)


# -- the automatic sketch -------------------------------------------------------------------------

def _nic_cost_us(topology: Topology, gpu: str, nic: str) -> float | None:
    """Return the path cost (α plus 1 MB, µs) from ``gpu`` to ``nic`` through non-GPU vertices."""
    import networkx as nx

    from taccl_py.topology.model import ROUTE_REFERENCE_BYTES

    allowed = {v.name for v in topology.vertices if v.kind is not VertexKind.GPU} | {gpu}
    view = topology.graph.subgraph(allowed)
    try:
        return nx.dijkstra_path_length(view, gpu, nic, weight=lambda a, b, d: d["link"].time_us(ROUTE_REFERENCE_BYTES))
    except nx.NetworkXNoPath:
        return None


def _relay_groups(topology: Topology) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Return (NIC name, the local GPUs nearest to it) for each NIC of node 0 some GPU reaches."""
    nics = topology.nics(0)
    gpus = [g for g in topology.gpus if g.node == 0]
    costs = {(g.local_index, n.name): _nic_cost_us(topology, g.name, n.name) for g in gpus for n in nics}
    groups = []
    for nic in nics:
        reachable = {g: c for (g, n), c in costs.items() if n == nic.name and c is not None}
        if not reachable:
            continue
        best = min(reachable.values())
        nearest = [g for g, c in reachable.items() if c <= best * (1 + 1e-6)]
        # A GPU relays through the NIC it is nearest to; drop GPUs closer to another NIC.
        own = [g for g in nearest if all((costs[(g, m.name)] or float("inf")) >= best * (1 - 1e-6) for m in nics)]
        groups.append((nic.name, tuple(sorted(own or nearest))))
    return tuple(groups)


def _shares_first_hop(topology: Topology, local: int, nic: str) -> bool:
    """Return True when GPU ``local``'s way to ``nic`` starts on the link its best GPU route uses.

    On a PCIe-only machine a GPU reaches its peers and its NIC through the same uplink, so
    relaying other GPUs' chunks through one sender would cross that uplink twice.
    """
    import networkx as nx

    from taccl_py.topology.model import ROUTE_REFERENCE_BYTES

    gpu = topology.gpus[local]
    allowed = {v.name for v in topology.vertices if v.kind is not VertexKind.GPU} | {gpu.name}
    path = nx.dijkstra_path(topology.graph.subgraph(allowed), gpu.name, nic, weight=lambda a, b, d: d["link"].time_us(ROUTE_REFERENCE_BYTES))
    peers = [r for r in range(topology.gpus_per_node) if r != local]
    if not peers:
        return False
    best = max((route(topology, local, r) for r in peers), key=lambda r: r.bandwidth_GBps)
    return best.links[0].key == (path[0], path[1])


def nic_relays(topology: Topology) -> tuple[tuple[int, int], ...]:
    """Return the automatic (local sender, local receiver) pairs across machines, from NIC affinity.

    Per NIC, the first GPU nearest to it sends, to the first two GPUs nearest the same NIC on
    the other machine (TACCL's shipped sketches relay the same way). One sender per NIC keeps
    its transfers in the schedule's order (the plan chains a rank's sends through one NIC)
    instead of several senders sharing it; two receivers let both GPUs of a NIC's pair take
    network data over their own PCIe link, which on NVSwitch machines relieves their switch
    ports, the busiest resource of a two-machine AllGather. Where GPUs reach each other over
    the same uplink as the NIC (PCIe-only machines), every GPU near the NIC sends and receives.
    """
    pairs = set()
    for nic, group in _relay_groups(topology):
        if _shares_first_hop(topology, group[0], nic):
            pairs.update((a, b) for a in group for b in group)
        else:
            pairs.update((group[0], group[i]) for i in range(min(2, len(group))))
    return tuple(sorted(pairs))


def _pair_signature(topology: Topology, src: int, dst: int) -> tuple[float, float, int] | None:
    try:
        r = route(topology, src, dst)
    except TopologyError:  # no path that avoids relaying through a GPU
        return None
    return (round(r.alpha_us, 9), round(r.bandwidth_GBps, 9), len(r.links))


def _is_node_rotation(topology: Topology, offset: int, signatures: dict, relays: tuple[tuple[int, ...], ...]) -> bool:
    gpn = topology.gpus_per_node
    for (a, b), sig in signatures.items():
        if signatures[((a + offset) % gpn, (b + offset) % gpn)] != sig:
            return False
    groups = {frozenset(g) for g in relays}
    return all(frozenset((g + offset) % gpn for g in group) in groups for group in groups)


def find_symmetry(topology: Topology) -> tuple[tuple[int, int], ...]:
    """Return rotations ``(offset, group)`` that map the topology onto itself.

    Within a machine: the smallest offset whose rotation of the local GPUs keeps every
    GPU-to-GPU route's α, bandwidth and hop count and the NIC relay groups. Across machines: the
    rotation by one machine (composed machines are identical copies).

    >>> from taccl_py.topology import load_topology
    >>> find_symmetry(load_topology("dgx2", nodes=2))
    ((2, 16), (16, 32))
    """
    gpn, n = topology.gpus_per_node, topology.num_ranks
    signatures = {(a, b): _pair_signature(topology, a, b) for a in range(gpn) for b in range(gpn) if a != b}
    relays = tuple(group for _, group in _relay_groups(topology)) if topology.nodes > 1 else ()
    rotations = []
    for offset in range(1, gpn):
        if gpn % offset == 0 and _is_node_rotation(topology, offset, signatures, relays):
            rotations.append((offset, gpn))
            break
    if topology.nodes > 1:
        rotations.append((gpn, n))
    return tuple(rotations)


def auto_sketch(topology: Topology) -> Sketch:
    """Return the sketch the synthesizer uses when none is given: NIC relays and symmetry found.

    >>> from taccl_py.topology import load_topology
    >>> s = auto_sketch(load_topology("ndv2", nodes=2))
    >>> s.symmetry, s.internode_conn
    (((8, 16),), ((0, 0), (0, 1)))
    """
    return check_sketch(Sketch(name=f"auto-{topology.name}", nodes=topology.nodes, source=f"<auto sketch for {topology.name}>"), topology)
