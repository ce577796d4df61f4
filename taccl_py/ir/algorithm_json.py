"""The JSON form of an ``Algorithm`` (``taccl-algorithm/1``): one step per line, stable for diffs.

A synthesized file also records how it was made (``provenance``, as a library does:
``taccl_py.ir.provenance``); files without one (older ones) read as they did.
"""

from __future__ import annotations

import json
from enum import Enum
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from taccl_py._io import decode_json, read_text, write_text_atomic
from taccl_py.errors import ArgumentError, FormatError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective, chunk_layout
from taccl_py.ir.provenance import Provenance, provenance_from_json, provenance_to_json

__all__ = [
    "ALGORITHM_SCHEMA",
    "generate_algorithm_json",
    "is_topology_document",
    "parse_algorithm_json",
    "parse_algorithm_provenance",
    "read_algorithm",
    "write_algorithm",
]

ALGORITHM_SCHEMA = "taccl-algorithm/1"


def _step_to_json(step: Step) -> dict[str, Any]:
    out: dict[str, Any] = {"op": step.op.value}
    if step.src_buffer is not None:
        out["src"] = [step.src_buffer.value, step.src_offset]
    if step.dst_buffer is not None:
        out["dst"] = [step.dst_buffer.value, step.dst_offset]
    out["count"] = step.count
    if step.depends:
        out["depends"] = [list(dep) for dep in step.depends]
    return out


def generate_algorithm_json(algorithm: Algorithm, provenance: Provenance | None = None) -> str:
    """Return the stable, human-readable JSON text of ``algorithm`` (one step per line), and ``provenance`` if given."""
    header = {
        "schema": ALGORITHM_SCHEMA,
        "name": algorithm.name,
        "collective": algorithm.collective.value,
        "num_ranks": algorithm.num_ranks,
        "chunks_per_loop": algorithm.chunks_per_loop,
        "inplace": algorithm.inplace,
        "protocol": algorithm.protocol,
        "min_bytes": algorithm.min_bytes,
        "max_bytes": algorithm.max_bytes,
        "metadata": dict(algorithm.metadata),
    }
    if provenance is not None:
        header["provenance"] = provenance_to_json(provenance)
    lines = ["{"]
    for key, value in header.items():
        lines.append(f"  {json.dumps(key)}: {json.dumps(value, sort_keys=True)},")
    lines.append('  "ranks": [')
    for r_index, prog in enumerate(algorithm.ranks):
        lines.append(
            f'    {{"rank": {prog.rank}, "input_chunks": {prog.input_chunks}, "output_chunks": {prog.output_chunks}, '
            f'"scratch_chunks": {prog.scratch_chunks}, "threadblocks": ['
        )
        for t_index, tb in enumerate(prog.threadblocks):
            lines.append(
                f'      {{"id": {tb.id}, "send_peer": {json.dumps(tb.send_peer)}, '
                f'"recv_peer": {json.dumps(tb.recv_peer)}, '
                f'"channel": {tb.channel}, '
                + (f'"switch_group": {json.dumps(list(tb.switch_group))}, ' if tb.switch_group else "")
                + '"steps": ['
            )
            for s_index, step in enumerate(tb.steps):
                comma = "," if s_index < len(tb.steps) - 1 else ""
                lines.append(f"        {json.dumps(_step_to_json(step))}{comma}")
            lines.append("      ]}" + ("," if t_index < len(prog.threadblocks) - 1 else ""))
        lines.append("    ]}" + ("," if r_index < len(algorithm.ranks) - 1 else ""))
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _enum(kind: type[Enum], value: Any, source: str, where: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(repr(member.value) for member in kind)
        raise FormatError(source, where, f"unknown value {value!r}", f"one of {allowed}") from None


def _field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], source: str, where: str) -> Any:
    if key not in obj:
        raise FormatError(source, f"{where}.{key}" if where else key, "missing", f"a {getattr(kind, '__name__', kind)}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise FormatError(
            source,
            f"{where}.{key}" if where else key,
            f"{value!r} has the wrong type",
            f"a {getattr(kind, '__name__', kind)}",
        )
    return value


def _int(
    obj: dict[str, Any], key: str, source: str, where: str, low: int | None = None, high: int | None = None
) -> int:
    """Return the integer at ``obj[key]``, within ``low..high``; missing keys are faults (use ``_optional``)."""
    value = _field(obj, key, int, source, where)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"{low if low is not None else '-inf'}..{high if high is not None else 'inf'}"
        raise FormatError(
            source, f"{where}.{key}" if where else key, f"{value} out of range", f"an integer in {bounds}"
        )
    return value


def _optional(obj: dict[str, Any], key: str, default: Any) -> dict[str, Any]:
    """Return ``obj`` with ``key`` set to ``default`` where it is absent (the writer always writes it)."""
    return obj if key in obj else {**obj, key: default}


def _peer(obj: dict[str, Any], key: str, source: str, where: str, rank: int, num_ranks: int) -> int | None:
    if obj.get(key) is None:
        return None
    peer = _int(obj, key, source, where, 0, num_ranks - 1)
    if peer == rank:
        raise FormatError(source, f"{where}.{key}", f"peer {peer} is the rank itself", "another rank or null")
    return peer


def _object(value: Any, source: str, where: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FormatError(source, where, f"{value!r} is not an object", what)
    return value


def _parse_slot(value: Any, source: str, where: str) -> tuple[Buffer, int]:
    if not (isinstance(value, list) and len(value) == 2 and type(value[1]) is int and value[1] >= 0):
        raise FormatError(
            source, where, f"{value!r} is not a [buffer, offset] pair", '["i"|"o"|"s", chunk offset >= 0]'
        )
    return _enum(Buffer, value[0], source, where), value[1]


def _parse_depends(value: Any, source: str, where: str) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list) or not all(
        isinstance(d, list) and len(d) == 2 and all(type(x) is int and x >= 0 for x in d) for d in value
    ):
        raise FormatError(source, where, f"{value!r}", "a list of [threadblock, step] pairs")
    return tuple((d[0], d[1]) for d in value)


def _parse_step(obj: Any, source: str, where: str) -> Step:
    obj = _object(obj, source, where, "a step object")
    op = _enum(OpType, _field(obj, "op", str, source, where), source, f"{where}.op")
    # As in MSCCL XML, only the operands the op uses enter the IR; those it uses must be there.
    src = _parse_slot(_field(obj, "src", list, source, where), source, f"{where}.src") if op.uses_src else (None, 0)
    dst = _parse_slot(_field(obj, "dst", list, source, where), source, f"{where}.dst") if op.uses_dst else (None, 0)
    depends = _parse_depends(obj.get("depends", []), source, f"{where}.depends")
    return Step(op, src[0], src[1], dst[0], dst[1], _int(obj, "count", source, where, 0), depends)


def _parse_threadblock(obj: Any, source: str, where: str, rank: int, num_ranks: int) -> Threadblock:
    obj = _object(obj, source, where, "a threadblock object")
    steps = tuple(
        _parse_step(s, source, f"{where}.steps[{i}]") for i, s in enumerate(_field(obj, "steps", list, source, where))
    )
    return Threadblock(
        _int(obj, "id", source, where, 0),
        steps,
        _peer(obj, "send_peer", source, where, rank, num_ranks),
        _peer(obj, "recv_peer", source, where, rank, num_ranks),
        _int(_optional(obj, "channel", 0), "channel", source, where, 0),
        _parse_switch_group(obj.get("switch_group", []), source, f"{where}.switch_group", num_ranks),
    )


def _parse_switch_group(obj: Any, source: str, where: str, num_ranks: int) -> tuple[int, ...]:
    """Return a threadblock's switch group: distinct ranks in increasing order ((): none)."""
    if not isinstance(obj, list):
        raise FormatError(source, where, f"{type(obj).__name__}", "a list of ranks")
    group = tuple(_int({"rank": r}, "rank", source, where, 0, num_ranks - 1) for r in obj)
    if list(group) != sorted(set(group)):
        raise FormatError(source, where, f"ranks {list(group)}", "distinct ranks in increasing order")
    return group


def _parse_rank(obj: Any, source: str, where: str, num_ranks: int) -> RankProgram:
    obj = _object(obj, source, where, "a rank object")
    rank = _int(obj, "rank", source, where, 0, num_ranks - 1)
    tbs = tuple(
        _parse_threadblock(tb, source, f"{where}.threadblocks[{i}]", rank, num_ranks)
        for i, tb in enumerate(_field(obj, "threadblocks", list, source, where))
    )
    ids = [tb.id for tb in tbs]
    if len(set(ids)) != len(ids):
        raise FormatError(source, f"{where}.threadblocks", f"threadblock ids {ids} repeat", "unique ids per rank")
    return RankProgram(
        rank,
        tbs,
        _int(obj, "input_chunks", source, where, 0),
        _int(obj, "output_chunks", source, where, 0),
        _int(_optional(obj, "scratch_chunks", 0), "scratch_chunks", source, where, 0),
    )


def is_topology_document(document: Any) -> bool:
    """Return True when a parsed JSON ``document`` is a topology: it names no collective and holds machine fields.

    Our ``taccl-topology/1`` files hold ``vertices``, TACCL's profiles ``gpus_per_node``; no
    collective program holds either.
    """
    return (
        isinstance(document, dict)
        and "collective" not in document
        and ("vertices" in document or "gpus_per_node" in document)
    )


def parse_algorithm_json(text: str, source: str = "<string>") -> Algorithm:
    """Return the ``Algorithm`` a JSON text describes; raise ``FormatError`` naming the field.

    Types and ranges are checked as the MSCCL XML reader checks them (ranks 0..num_ranks-1, each
    once; peers other ranks; counts, chunk numbers and offsets non-negative), so what is returned
    can be verified; whether it implements its collective is the verifier's question.
    """
    obj = decode_json(text, source, FormatError, "an algorithm JSON file")
    if is_topology_document(obj):
        raise FormatError(source, None, "a topology file, not an algorithm", f"a {ALGORITHM_SCHEMA} JSON file")
    if not isinstance(obj, dict) or obj.get("schema") != ALGORITHM_SCHEMA:
        raise FormatError(
            source, "schema", f"{obj.get('schema') if isinstance(obj, dict) else obj!r}", repr(ALGORITHM_SCHEMA)
        )
    num_ranks = _int(obj, "num_ranks", source, "", 1)
    chunks_per_loop = _int(obj, "chunks_per_loop", source, "", 1)
    collective = _enum(Collective, _field(obj, "collective", str, source, ""), source, "collective")
    try:
        chunk_layout(collective, num_ranks, chunks_per_loop)
    except ArgumentError as error:
        raise FormatError(source, "chunks_per_loop", error.fault, error.expected) from None
    ranks = sorted(
        (
            _parse_rank(prog, source, f"ranks[{i}]", num_ranks)
            for i, prog in enumerate(_field(obj, "ranks", list, source, ""))
        ),
        key=lambda prog: prog.rank,
    )
    # the length first: list(range(num_ranks)) of a huge num_ranks would exhaust memory
    if len(ranks) != num_ranks or [prog.rank for prog in ranks] != list(range(num_ranks)):
        found = ", ".join(str(prog.rank) for prog in ranks)
        raise FormatError(
            source, "ranks", f"ranks [{found}] for {num_ranks} ranks", f"one entry for each rank 0..{num_ranks - 1}"
        )
    defaults = {"inplace": False, "protocol": "Simple", "min_bytes": 0, "max_bytes": None, "metadata": {}}
    obj = {**defaults, **obj}
    provenance_from_json(obj.get("provenance"), source)  # checked here, so a file that reads is whole
    max_bytes = None if obj["max_bytes"] is None else _int(obj, "max_bytes", source, "", 0)
    metadata = _field(obj, "metadata", dict, source, "")
    return Algorithm(
        name=_field(obj, "name", str, source, ""),
        collective=collective,
        num_ranks=num_ranks,
        chunks_per_loop=chunks_per_loop,
        ranks=tuple(ranks),
        inplace=_field(obj, "inplace", bool, source, ""),
        protocol=_field(obj, "protocol", str, source, ""),
        min_bytes=_int(obj, "min_bytes", source, "", 0),
        max_bytes=max_bytes,
        metadata=tuple(sorted((str(k), str(v)) for k, v in metadata.items())),
    )


def parse_algorithm_provenance(text: str, source: str = "<string>") -> Provenance | None:
    """Return how the algorithm in a JSON text was made (None: not recorded, as in older files)."""
    obj = decode_json(text, source, FormatError, "an algorithm JSON file")
    return provenance_from_json(obj.get("provenance"), source) if isinstance(obj, dict) else None


def read_algorithm(path: str | Path | Traversable) -> Algorithm:
    """Return the algorithm in the JSON file at ``path`` (``.json``, ``.json.xz`` or ``.json.gz``)."""
    return parse_algorithm_json(read_text(path), str(path))


def write_algorithm(algorithm: Algorithm, path: str, provenance: Provenance | None = None) -> None:
    """Write ``algorithm`` (and ``provenance``, if given) as JSON to ``path`` atomically (``-`` for stdout)."""
    write_text_atomic(path, generate_algorithm_json(algorithm, provenance))
