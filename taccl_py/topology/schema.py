"""The ``taccl-topology/1`` JSON file format: one machine per file.

A file describes ONE machine; multi-node topologies are built from it with
``compose_nodes`` (``load_topology(name, nodes=N)``, ``--nodes N`` on the command line), so
``generate_topology`` refuses a topology of more than one node.

Format
------
::

    {
      "schema": "taccl-topology/1",
      "name": "ndv2",
      "description": "8x V100 ...",
      "sources": ["where each figure comes from", ...],
      "vertices": [
        {"name": "gpu0", "kind": "gpu", "local_index": 0, "numa": 0, "pci_bus_id": "0001:00:00.0"},
        {"name": "nic0", "kind": "nic", "local_index": 0, "numa": 0,
         "net_kind": "ib", "net_bandwidth_GBps": 12.5, "net_alpha_us": 0.6},
        {"name": "cpu0", "kind": "cpu", "numa": 0}
      ],
      "links": [
        {"src": "gpu0", "dst": "gpu1", "kind": "nvlink", "alpha_us": 0.3, "bandwidth_GBps": 43.5, "count": 2},
        {"src": "gpu0", "dst": "cpu0", "kind": "pcie", "alpha_us": 0.5, "bandwidth_GBps": 12.0}
      ]
    }

Top level: ``schema`` (required, exactly ``"taccl-topology/1"``), ``name`` (required),
``description`` and ``sources`` (optional), ``vertices`` and ``links`` (required lists).
Unknown fields are errors, so a misspelt field is reported rather than ignored.

Vertices: ``name`` (unique), ``kind`` (``gpu``, ``nic``, ``nvswitch``, ``pcie_switch``,
``net_switch``, ``cpu``), ``local_index`` (required for GPUs and NICs: a GPU's local index is
its rank, numbered 0..G-1 once each; a NIC's is its port number), optional ``pci_bus_id``
and ``numa``. NICs may carry their network port: ``net_kind`` (``ib`` or ``ethernet``),
``net_bandwidth_GBps`` (> 0, per direction) and ``net_alpha_us`` (>= 0); ``compose_nodes``
needs them to join machines. An NVSwitch that reduces (NVLink SHARP) carries ``reduce_bandwidth_GBps``
(> 0, per GPU port and direction) and ``reduce_alpha_us`` (>= 0), both or neither; written only when set.

Links: ``src`` and ``dst`` (vertex names), ``kind`` (``nvlink``, ``nvswitch``, ``pcie``,
``host``, ``ib``, ``ethernet``, ``xgmi``), ``alpha_us`` (>= 0), ``bandwidth_GBps`` (> 0, GB/s
= 1e9 B/s per direction, all lanes together), optional ``count`` (lanes folded into the
bandwidth, default 1) and ``bidirectional`` (default true: the entry stands for two directed
links with the same figures; false: only src -> dst). A directed link may be given once.

Every fault raises ``TopologyError`` naming the file and the field, e.g.
``foo.json: links[3].kind: unknown link kind 'nvlnk'; expected one of nvlink, ...``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from taccl_py._io import read_text, write_text_atomic
from taccl_py.errors import ArgumentError, TopologyError
from taccl_py.topology._json_fields import FieldReader, reject_constant
from taccl_py.topology.model import Link, LinkKind, Topology, Vertex, VertexKind, make_topology

__all__ = [
    "SCHEMA_ID",
    "not_a_topology",
    "parse_topology",
    "read_topology",
    "generate_topology",
    "write_topology",
]

SCHEMA_ID = "taccl-topology/1"

_TOP_FIELDS = ("schema", "name", "description", "sources", "vertices", "links")
_NET_FIELDS = ("net_kind", "net_bandwidth_GBps", "net_alpha_us")
_REDUCE_FIELDS = ("reduce_bandwidth_GBps", "reduce_alpha_us")
_VERTEX_FIELDS = ("name", "kind", "local_index", "pci_bus_id", "numa", *_NET_FIELDS, *_REDUCE_FIELDS)
_LINK_FIELDS = ("src", "dst", "kind", "alpha_us", "bandwidth_GBps", "count", "bidirectional")
_NET_KINDS = (LinkKind.IB, LinkKind.ETHERNET)
_INDEXED_KINDS = (VertexKind.GPU, VertexKind.NIC)
# What a JSON file given as a topology is instead, by its shape: every collective program (a
# taccl algorithm, a library, an MSCCL++ plan) names its ``collective``, no topology format does.
_LIBRARY_SCHEMA_PREFIX = "taccl-library/"  # taccl_py.ir.library.LIBRARY_SCHEMA, a floor above this one


def not_a_topology(document: Any) -> str | None:
    """Return what a parsed JSON ``document`` is when it is a collective program, not a topology, else None.

    >>> not_a_topology({"schema": "taccl-algorithm/1", "collective": "allgather"})
    'an algorithm file'
    >>> not_a_topology({"schema": "taccl-topology/1", "vertices": []}) is None
    True
    """
    if not isinstance(document, dict) or "collective" not in document or "vertices" in document:
        return None
    schema = document.get("schema")
    if isinstance(schema, str) and schema.startswith(_LIBRARY_SCHEMA_PREFIX):
        return "an algorithm library file"
    return "an algorithm file"


def parse_topology(text: str, source: str = "<string>") -> Topology:
    """Return the one-machine ``Topology`` a ``taccl-topology/1`` JSON text describes.

    Parameters
    ----------
    text : str
        The JSON document (format in this module's docstring).
    source : str
        Where the text came from; error messages start with it.

    Returns
    -------
    Topology
        A validated topology with ``nodes == 1``; GPU ranks are the GPUs' ``local_index``.

    Raises
    ------
    TopologyError
        On invalid JSON, a wrong schema id, a missing or unknown field, an unknown vertex or
        link kind, a GPU listed twice (name or local index), a bandwidth <= 0, a negative
        alpha, or a link to an unknown vertex. The message names ``source`` and the field.

    Examples
    --------
    >>> text = '''{"schema": "taccl-topology/1", "name": "pair",
    ...   "vertices": [{"name": "gpu0", "kind": "gpu", "local_index": 0},
    ...                {"name": "gpu1", "kind": "gpu", "local_index": 1}],
    ...   "links": [{"src": "gpu0", "dst": "gpu1", "kind": "nvlink", "alpha_us": 0.7, "bandwidth_GBps": 25}]}'''
    >>> topology = parse_topology(text)
    >>> topology.num_ranks, len(topology.links), topology.link("gpu1", "gpu0").bandwidth_GBps
    (2, 2, 25.0)
    """
    reader = FieldReader(source)
    try:
        document = json.loads(text, parse_constant=reject_constant)
    except json.JSONDecodeError as exc:
        raise reader.fail(
            f"line {exc.lineno} column {exc.colno}", f"invalid JSON: {exc.msg}", f"a {SCHEMA_ID} JSON document"
        ) from None
    except ValueError as exc:
        raise reader.fail(None, f"invalid JSON: {exc}", "finite numbers") from None
    except RecursionError:
        raise reader.fail(
            None, "invalid JSON: arrays or objects nested too deeply", f"a {SCHEMA_ID} JSON document"
        ) from None
    other = not_a_topology(document)
    if other is not None:
        raise reader.fail(None, f"{other}, not a topology", f"a {SCHEMA_ID} JSON document")
    document = reader.check_fields(document, "", _TOP_FIELDS)
    schema = reader.required(document, "", "schema")
    if schema != SCHEMA_ID:
        raise reader.fail("schema", f"unknown schema {schema!r}", repr(SCHEMA_ID))
    name = reader.string(reader.required(document, "", "name"), "name")
    description = document.get("description", "")
    if not isinstance(description, str):
        raise reader.fail("description", f"found {description!r}", "a string")
    sources = document.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise reader.fail("sources", f"found {sources!r}", "a list of strings")
    vertices = _parse_vertices(reader, reader.required(document, "", "vertices"))
    links = _parse_links(reader, reader.required(document, "", "links"), {v.name for v in vertices})
    return make_topology(name, vertices, links, nodes=1, description=description, sources=sources, source=source)


def _parse_vertices(reader: FieldReader, items: Any) -> tuple[Vertex, ...]:
    if not isinstance(items, list):
        raise reader.fail("vertices", f"found {type(items).__name__}", "a list of vertex objects")
    vertices: list[Vertex] = []
    names: dict[str, int] = {}
    indices: dict[tuple[VertexKind, int], int] = {}
    for position, item in enumerate(items):
        where = f"vertices[{position}]"
        vertex = _parse_vertex(reader, item, where)
        if vertex.name in names:
            raise reader.fail(
                f"{where}.name",
                f"vertex {vertex.name!r} listed twice (also vertices[{names[vertex.name]}])",
                "unique vertex names",
            )
        names[vertex.name] = position
        if vertex.local_index is not None and vertex.kind in _INDEXED_KINDS:
            key = (vertex.kind, vertex.local_index)
            if key in indices:
                raise reader.fail(
                    f"{where}.local_index",
                    f"{vertex.kind.value} local_index {vertex.local_index} listed twice (also "
                    f"vertices[{indices[key]}])",
                    f"one {vertex.kind.value} per local_index",
                )
            indices[key] = position
        vertices.append(vertex)
    gpu_indices = sorted(index for kind, index in indices if kind is VertexKind.GPU)
    if gpu_indices != list(range(len(gpu_indices))):
        raise reader.fail(
            "vertices", f"GPU local indices {gpu_indices} have gaps", f"0..{len(gpu_indices) - 1}, each once"
        )
    return tuple(vertices)


def _parse_vertex(reader: FieldReader, item: Any, where: str) -> Vertex:
    item = reader.check_fields(item, where, _VERTEX_FIELDS)
    name = reader.string(reader.required(item, where, "name"), f"{where}.name")
    kind = reader.enum(reader.required(item, where, "kind"), f"{where}.kind", VertexKind, "vertex kind")
    if kind in _INDEXED_KINDS:
        local_index = reader.integer(reader.required(item, where, "local_index"), f"{where}.local_index", 0)
    elif "local_index" in item:
        local_index = reader.integer(item["local_index"], f"{where}.local_index", 0)
    else:
        local_index = None
    pci_bus_id = reader.string(item["pci_bus_id"], f"{where}.pci_bus_id") if "pci_bus_id" in item else None
    numa = reader.integer(item["numa"], f"{where}.numa", 0) if "numa" in item else None
    net = {key: item[key] for key in _NET_FIELDS if key in item}
    if net and kind is not VertexKind.NIC:
        raise reader.fail(
            f"{where}.{next(iter(net))}", f"network field on a {kind.value} vertex", "net_* fields only on NICs"
        )
    net_kind = (
        reader.enum(net["net_kind"], f"{where}.net_kind", LinkKind, "network kind", _NET_KINDS)
        if "net_kind" in net
        else None
    )
    net_bandwidth = (
        reader.number(net["net_bandwidth_GBps"], f"{where}.net_bandwidth_GBps", "bandwidth", True)
        if "net_bandwidth_GBps" in net
        else None
    )
    net_alpha = (
        reader.number(net["net_alpha_us"], f"{where}.net_alpha_us", "alpha", False) if "net_alpha_us" in net else None
    )
    reduce_bandwidth, reduce_alpha = _parse_reduction(reader, item, where, kind)
    return Vertex(
        name=name,
        kind=kind,
        node=0,
        local_index=local_index,
        rank=local_index if kind is VertexKind.GPU else None,
        pci_bus_id=pci_bus_id,
        numa=numa,
        net_kind=net_kind,
        net_bandwidth_GBps=net_bandwidth,
        net_alpha_us=net_alpha,
        reduce_bandwidth_GBps=reduce_bandwidth,
        reduce_alpha_us=reduce_alpha,
    )


def _parse_reduction(reader: FieldReader, item: Any, where: str, kind: VertexKind) -> tuple[float | None, float | None]:
    """Return an NVSwitch's in-network reduction rate (GB/s) and α (µs), or (None, None) when it has none."""
    given = [key for key in _REDUCE_FIELDS if key in item]
    if not given:
        return None, None
    if kind is not VertexKind.NVSWITCH:
        raise reader.fail(f"{where}.{given[0]}", f"reduction field on a {kind.value} vertex", "reduce_* on NVSwitches")
    if len(given) == 1:
        missing = next(key for key in _REDUCE_FIELDS if key not in item)
        raise reader.fail(f"{where}.{missing}", "missing field", f"{missing} beside {given[0]} (both or neither)")
    bandwidth = reader.number(item["reduce_bandwidth_GBps"], f"{where}.reduce_bandwidth_GBps", "bandwidth", True)
    alpha = reader.number(item["reduce_alpha_us"], f"{where}.reduce_alpha_us", "alpha", False)
    return bandwidth, alpha


def _parse_links(reader: FieldReader, items: Any, names: set[str]) -> tuple[Link, ...]:
    if not isinstance(items, list):
        raise reader.fail("links", f"found {type(items).__name__}", "a list of link objects")
    links: list[Link] = []
    seen: dict[tuple[str, str], int] = {}
    for position, item in enumerate(items):
        where = f"links[{position}]"
        link, bidirectional = _parse_link(reader, item, where, names)
        directed = [link]
        if bidirectional:
            directed.append(Link(link.dst, link.src, link.kind, link.alpha_us, link.bandwidth_GBps, link.count))
        for one in directed:
            if one.key in seen:
                raise reader.fail(
                    where,
                    f"link {one.src}->{one.dst} listed twice (also links[{seen[one.key]}])",
                    "one link per direction (use count for lanes)",
                )
            seen[one.key] = position
        links.extend(directed)
    return tuple(links)


def _parse_link(reader: FieldReader, item: Any, where: str, names: set[str]) -> tuple[Link, bool]:
    item = reader.check_fields(item, where, _LINK_FIELDS)
    ends = []
    for key in ("src", "dst"):
        end = reader.string(reader.required(item, where, key), f"{where}.{key}")
        if end not in names:
            raise reader.fail(f"{where}.{key}", f"unknown vertex {end!r}", "a name listed under vertices")
        ends.append(end)
    if ends[0] == ends[1]:
        raise reader.fail(where, f"link from {ends[0]!r} to itself", "two different vertices")
    kind = reader.enum(reader.required(item, where, "kind"), f"{where}.kind", LinkKind, "link kind")
    alpha_us = reader.number(reader.required(item, where, "alpha_us"), f"{where}.alpha_us", "alpha", False)
    bandwidth = reader.number(
        reader.required(item, where, "bandwidth_GBps"), f"{where}.bandwidth_GBps", "bandwidth", True
    )
    count = reader.integer(item.get("count", 1), f"{where}.count", 1)
    bidirectional = item.get("bidirectional", True)
    if not isinstance(bidirectional, bool):
        raise reader.fail(f"{where}.bidirectional", f"found {bidirectional!r}", "true or false")
    return Link(ends[0], ends[1], kind, alpha_us, bandwidth, count), bidirectional


def read_topology(path: str | Path) -> Topology:
    """Return the topology in the ``taccl-topology/1`` file at ``path`` (``-`` for stdin).

    Raises ``TopologyError`` naming the file if it cannot be read or is malformed.
    """
    return parse_topology(read_text(path, TopologyError), source=str(path))


def generate_topology(topology: Topology) -> str:
    """Return the ``taccl-topology/1`` JSON text of a one-machine ``topology``.

    The output is stable: one vertex or link per line, in the topology's order, a pair of
    opposite links with the same figures folded into one bidirectional entry, numbers written
    so that they read back exactly. ``parse_topology`` of the text gives the same vertices and
    links back, in the same order (a reverse link is folded only when it comes next).

    Parameters
    ----------
    topology : Topology
        A topology with ``nodes == 1`` whose GPU ranks equal their local indices.

    Returns
    -------
    str
        The JSON document, ending in a newline.

    Raises
    ------
    ArgumentError
        If the topology spans several nodes: a file holds one machine; write the machine and
        compose it with ``compose_nodes`` (or ``--nodes``) when loading.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> text = generate_topology(load_topology("ndv2"))
    >>> parse_topology(text).links == load_topology("ndv2").links
    True
    """
    if topology.nodes != 1:
        raise ArgumentError(
            topology.name,
            "nodes",
            f"topology spans {topology.nodes} nodes",
            "one machine per file (write the machine; compose with --nodes)",
        )
    for vertex in topology.gpus:
        if vertex.rank != vertex.local_index:
            raise ArgumentError(
                topology.name,
                vertex.name,
                f"rank {vertex.rank} differs from local_index {vertex.local_index}",
                "GPU ranks equal to local indices",
            )
    lines = ["{"]
    head = {"schema": SCHEMA_ID, "name": topology.name, "description": topology.description}
    lines.extend(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}," for key, value in head.items())
    lines.append(_json_list("sources", [json.dumps(s, ensure_ascii=False) for s in topology.sources]) + ",")
    lines.append(_json_list("vertices", [_dump(_vertex_record(v)) for v in topology.vertices]) + ",")
    lines.append(_json_list("links", [_dump(record) for record in _link_records(topology.links)]))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _json_list(key: str, items: list[str]) -> str:
    if not items:
        return f"  {json.dumps(key)}: []"
    body = ",\n".join(f"    {item}" for item in items)
    return f"  {json.dumps(key)}: [\n{body}\n  ]"


def _dump(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False)


def _vertex_record(vertex: Vertex) -> dict[str, Any]:
    record: dict[str, Any] = {"name": vertex.name, "kind": vertex.kind.value}
    optional = {
        "local_index": vertex.local_index,
        "pci_bus_id": vertex.pci_bus_id,
        "numa": vertex.numa,
        "net_kind": vertex.net_kind.value if vertex.net_kind is not None else None,
        "net_bandwidth_GBps": vertex.net_bandwidth_GBps,
        "net_alpha_us": vertex.net_alpha_us,
        "reduce_bandwidth_GBps": vertex.reduce_bandwidth_GBps,
        "reduce_alpha_us": vertex.reduce_alpha_us,
    }
    record.update((key, value) for key, value in optional.items() if value is not None)
    return record


def _link_records(links: tuple[Link, ...]) -> list[dict[str, Any]]:
    records = []
    position = 0
    while position < len(links):
        link = links[position]
        position += 1
        record: dict[str, Any] = {
            "src": link.src,
            "dst": link.dst,
            "kind": link.kind.value,
            "alpha_us": link.alpha_us,
            "bandwidth_GBps": link.bandwidth_GBps,
        }
        if link.count != 1:
            record["count"] = link.count
        # Fold only a reverse link that comes next, so that parsing gives the same order back.
        back = links[position] if position < len(links) else None
        if back is not None and back == Link(
            link.dst, link.src, link.kind, link.alpha_us, link.bandwidth_GBps, link.count
        ):
            position += 1
        else:
            record["bidirectional"] = False
        records.append(record)
    return records


def write_topology(topology: Topology, path: str | Path) -> None:
    """Write ``generate_topology(topology)`` to ``path`` atomically (``-`` for stdout).

    Raises ``ArgumentError`` for a multi-node topology, before anything is written.
    """
    write_text_atomic(path, generate_topology(topology))
