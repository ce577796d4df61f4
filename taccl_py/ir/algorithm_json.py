"""The JSON form of an ``Algorithm`` (``taccl-algorithm/1``): one step per line, stable for diffs."""

from __future__ import annotations

import json
from enum import Enum
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from taccl_py._io import decode_json, read_text, write_text_atomic
from taccl_py.errors import FormatError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective

__all__ = ["ALGORITHM_SCHEMA", "generate_algorithm_json", "parse_algorithm_json", "read_algorithm", "write_algorithm"]

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


def generate_algorithm_json(algorithm: Algorithm) -> str:
    """Return the stable, human-readable JSON text of ``algorithm`` (one step per line)."""
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
                f'"channel": {tb.channel}, "steps": ['
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


def _parse_slot(value: Any, source: str, where: str) -> tuple[Buffer, int]:
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], int)):
        raise FormatError(source, where, f"{value!r} is not a [buffer, offset] pair", '["i"|"o"|"s", chunk offset]')
    return _enum(Buffer, value[0], source, where), value[1]


def _parse_step(obj: Any, source: str, where: str) -> Step:
    if not isinstance(obj, dict):
        raise FormatError(source, where, "not an object", "a step object")
    op = _enum(OpType, _field(obj, "op", str, source, where), source, f"{where}.op")
    src = _parse_slot(obj["src"], source, f"{where}.src") if "src" in obj else (None, 0)
    dst = _parse_slot(obj["dst"], source, f"{where}.dst") if "dst" in obj else (None, 0)
    depends = obj.get("depends", [])
    if not all(isinstance(d, list) and len(d) == 2 and all(isinstance(x, int) for x in d) for d in depends):
        raise FormatError(source, f"{where}.depends", f"{depends!r}", "a list of [threadblock, step] pairs")
    return Step(
        op, src[0], src[1], dst[0], dst[1], _field(obj, "count", int, source, where), tuple(tuple(d) for d in depends)
    )


def parse_algorithm_json(text: str, source: str = "<string>") -> Algorithm:
    """Return the ``Algorithm`` a JSON text describes; raise ``FormatError`` naming the field."""
    obj = decode_json(text, source, FormatError, "an algorithm JSON file")
    if not isinstance(obj, dict) or obj.get("schema") != ALGORITHM_SCHEMA:
        raise FormatError(
            source, "schema", f"{obj.get('schema') if isinstance(obj, dict) else obj!r}", repr(ALGORITHM_SCHEMA)
        )
    ranks = []
    for r_index, prog in enumerate(_field(obj, "ranks", list, source, "")):
        where = f"ranks[{r_index}]"
        tbs = []
        for t_index, tb in enumerate(_field(prog, "threadblocks", list, source, where)):
            tb_where = f"{where}.threadblocks[{t_index}]"
            steps = tuple(
                _parse_step(s, source, f"{tb_where}.steps[{i}]")
                for i, s in enumerate(_field(tb, "steps", list, source, tb_where))
            )
            tbs.append(
                Threadblock(
                    _field(tb, "id", int, source, tb_where),
                    steps,
                    tb.get("send_peer"),
                    tb.get("recv_peer"),
                    tb.get("channel", 0),
                )
            )
        ranks.append(
            RankProgram(
                _field(prog, "rank", int, source, where),
                tuple(tbs),
                _field(prog, "input_chunks", int, source, where),
                _field(prog, "output_chunks", int, source, where),
                prog.get("scratch_chunks", 0),
            )
        )
    metadata = obj.get("metadata", {})
    return Algorithm(
        name=_field(obj, "name", str, source, ""),
        collective=_enum(Collective, _field(obj, "collective", str, source, ""), source, "collective"),
        num_ranks=_field(obj, "num_ranks", int, source, ""),
        chunks_per_loop=_field(obj, "chunks_per_loop", int, source, ""),
        ranks=tuple(ranks),
        inplace=bool(obj.get("inplace", False)),
        protocol=obj.get("protocol", "Simple"),
        min_bytes=obj.get("min_bytes", 0),
        max_bytes=obj.get("max_bytes"),
        metadata=tuple(sorted((str(k), str(v)) for k, v in metadata.items())),
    )


def read_algorithm(path: str | Path | Traversable) -> Algorithm:
    """Return the algorithm in the JSON file at ``path`` (``.json``, ``.json.xz`` or ``.json.gz``)."""
    return parse_algorithm_json(read_text(path), str(path))


def write_algorithm(algorithm: Algorithm, path: str) -> None:
    """Write ``algorithm`` as JSON to ``path`` atomically (``-`` for stdout)."""
    write_text_atomic(path, generate_algorithm_json(algorithm))
