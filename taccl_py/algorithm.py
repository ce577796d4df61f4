"""The schedule IR: per rank, threadblocks of ordered steps over chunked buffers (MSCCL-IR).

An ``Algorithm`` says, for every rank, which threadblocks run and which steps each runs in order.
A threadblock has at most one send peer and one receive peer; the k-th sending step on
(src, dst, channel) meets the k-th receiving step there. Buffers are cut into equal chunks (see
``taccl_py.collectives`` for the counts). Everything is a frozen dataclass of tuples; passes
return new objects.

Step semantics (``src`` = ``src_buffer[src_offset : src_offset + count]``, ``dst`` likewise):

======  =========================================================================
s       send ``src`` to the send peer
r       receive from the receive peer into ``dst``
rcs     receive into ``dst`` and forward the same data to the send peer
rrs     receive, add the local ``src``, send the sum on (nothing stored)
rrc     receive, add the local ``src``, store the sum at ``dst``
rrcs    as rrc, then send the sum to the send peer
cpy     copy ``src`` to ``dst``
re      ``dst`` <- ``dst`` + ``src`` (local reduction)
nop     nothing; carries a dependency
======  =========================================================================
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from taccl_py._io import read_text, write_text_atomic
from taccl_py.collectives import ChunkLayout, Collective, chunk_layout
from taccl_py.errors import FormatError

__all__ = [
    "Buffer",
    "OpType",
    "Step",
    "Threadblock",
    "RankProgram",
    "Algorithm",
    "input_slot",
    "output_slot",
    "generate_algorithm_json",
    "parse_algorithm_json",
    "read_algorithm",
    "write_algorithm",
    "ALGORITHM_SCHEMA",
]

ALGORITHM_SCHEMA = "taccl-algorithm/1"


class Buffer(str, Enum):
    """A per-rank buffer; values are MSCCL-IR's spelling."""

    INPUT = "i"
    OUTPUT = "o"
    SCRATCH = "s"


class OpType(str, Enum):
    """A step's operation; values are MSCCL-IR's spelling."""

    SEND = "s"
    RECV = "r"
    RECV_COPY_SEND = "rcs"
    RECV_REDUCE_SEND = "rrs"
    RECV_REDUCE_COPY = "rrc"
    RECV_REDUCE_COPY_SEND = "rrcs"
    COPY = "cpy"
    REDUCE = "re"
    NOP = "nop"

    @property
    def sends(self) -> bool:
        """Return True when the step sends to the threadblock's send peer."""
        return self in _SENDING

    @property
    def receives(self) -> bool:
        """Return True when the step receives from the threadblock's receive peer."""
        return self in _RECEIVING

    @property
    def reduces(self) -> bool:
        """Return True when the step adds a received or local operand."""
        return self in _REDUCING


_SENDING = frozenset({OpType.SEND, OpType.RECV_COPY_SEND, OpType.RECV_REDUCE_SEND, OpType.RECV_REDUCE_COPY_SEND})
_RECEIVING = frozenset({OpType.RECV, OpType.RECV_COPY_SEND, OpType.RECV_REDUCE_SEND, OpType.RECV_REDUCE_COPY, OpType.RECV_REDUCE_COPY_SEND})
_REDUCING = frozenset({OpType.RECV_REDUCE_SEND, OpType.RECV_REDUCE_COPY, OpType.RECV_REDUCE_COPY_SEND, OpType.REDUCE})


@dataclass(frozen=True)
class Step:
    """One operation of a threadblock over ``count`` chunks.

    ``depends`` lists (threadblock id, step index) pairs on the same rank that must finish first.
    Buffers a step does not use are None.
    """

    op: OpType
    src_buffer: Buffer | None = None
    src_offset: int = 0
    dst_buffer: Buffer | None = None
    dst_offset: int = 0
    count: int = 1
    depends: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Threadblock:
    """An ordered program with at most one send peer and one receive peer on one channel."""

    id: int
    steps: tuple[Step, ...]
    send_peer: int | None = None
    recv_peer: int | None = None
    channel: int = 0


@dataclass(frozen=True)
class RankProgram:
    """The threadblocks one rank runs, with its buffer sizes in chunks."""

    rank: int
    threadblocks: tuple[Threadblock, ...]
    input_chunks: int
    output_chunks: int
    scratch_chunks: int = 0

    def chunks(self, buffer: Buffer) -> int:
        """Return how many chunks ``buffer`` holds on this rank."""
        return {Buffer.INPUT: self.input_chunks, Buffer.OUTPUT: self.output_chunks, Buffer.SCRATCH: self.scratch_chunks}[buffer]


@dataclass(frozen=True)
class Algorithm:
    """A collective schedule over ``num_ranks`` ranks, cut into ``chunks_per_loop`` chunks.

    ``min_bytes``/``max_bytes`` give the size band (bytes; ``max_bytes`` None = unbounded) the
    algorithm is meant for; ``metadata`` holds free-form provenance (topology, synthesizer
    settings) as sorted (key, value) string pairs.
    """

    name: str
    collective: Collective
    num_ranks: int
    chunks_per_loop: int
    ranks: tuple[RankProgram, ...]
    inplace: bool = False
    protocol: str = "Simple"
    min_bytes: int = 0
    max_bytes: int | None = None
    metadata: tuple[tuple[str, str], ...] = field(default=())

    @property
    def layout(self) -> ChunkLayout:
        """Return the collective's chunk layout for this rank count and chunking."""
        return chunk_layout(self.collective, self.num_ranks, self.chunks_per_loop)

    @property
    def num_channels(self) -> int:
        """Return the number of channels used (highest channel + 1)."""
        return 1 + max((tb.channel for prog in self.ranks for tb in prog.threadblocks), default=0)

    def with_metadata(self, **items: str) -> Algorithm:
        """Return a copy with ``items`` merged into ``metadata``."""
        merged = dict(self.metadata)
        merged.update({key: str(value) for key, value in items.items()})
        return replace(self, metadata=tuple(sorted(merged.items())))

    def meta(self, key: str, default: str | None = None) -> str | None:
        """Return the metadata value under ``key``."""
        return dict(self.metadata).get(key, default)


def input_slot(algorithm: Algorithm, rank: int, index: int) -> tuple[Buffer, int]:
    """Return where input chunk ``index`` of ``rank`` lives (in-place collectives alias buffers)."""
    if algorithm.inplace and algorithm.collective is Collective.ALLGATHER:
        return Buffer.OUTPUT, rank * algorithm.layout.input_chunks + index
    return Buffer.INPUT, index


def output_slot(algorithm: Algorithm, rank: int, index: int) -> tuple[Buffer, int]:
    """Return where output chunk ``index`` of ``rank`` must end up."""
    if not algorithm.inplace or algorithm.collective is Collective.ALLGATHER:
        return Buffer.OUTPUT, index
    if algorithm.collective is Collective.REDUCESCATTER:
        return Buffer.INPUT, rank * algorithm.layout.output_chunks + index
    return Buffer.INPUT, index


# -- JSON form ------------------------------------------------------------------------------------

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
                f'      {{"id": {tb.id}, "send_peer": {json.dumps(tb.send_peer)}, "recv_peer": {json.dumps(tb.recv_peer)}, '
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
        raise FormatError(source, f"{where}.{key}" if where else key, f"{value!r} has the wrong type", f"a {getattr(kind, '__name__', kind)}")
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
    return Step(op, src[0], src[1], dst[0], dst[1], _field(obj, "count", int, source, where), tuple(tuple(d) for d in depends))


def parse_algorithm_json(text: str, source: str = "<string>") -> Algorithm:
    """Return the ``Algorithm`` a JSON text describes; raise ``FormatError`` naming the field."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as error:
        raise FormatError(source, f"line {error.lineno}", f"invalid JSON: {error.msg}", "an algorithm JSON file") from None
    if not isinstance(obj, dict) or obj.get("schema") != ALGORITHM_SCHEMA:
        raise FormatError(source, "schema", f"{obj.get('schema') if isinstance(obj, dict) else obj!r}", repr(ALGORITHM_SCHEMA))
    ranks = []
    for r_index, prog in enumerate(_field(obj, "ranks", list, source, "")):
        where = f"ranks[{r_index}]"
        tbs = []
        for t_index, tb in enumerate(_field(prog, "threadblocks", list, source, where)):
            tb_where = f"{where}.threadblocks[{t_index}]"
            steps = tuple(_parse_step(s, source, f"{tb_where}.steps[{i}]") for i, s in enumerate(_field(tb, "steps", list, source, tb_where)))
            tbs.append(Threadblock(_field(tb, "id", int, source, tb_where), steps, tb.get("send_peer"), tb.get("recv_peer"), tb.get("channel", 0)))
        ranks.append(RankProgram(
            _field(prog, "rank", int, source, where), tuple(tbs),
            _field(prog, "input_chunks", int, source, where), _field(prog, "output_chunks", int, source, where),
            prog.get("scratch_chunks", 0),
        ))
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


def read_algorithm(path: str) -> Algorithm:
    """Return the algorithm in the JSON file at ``path``."""
    return parse_algorithm_json(read_text(path), str(path))


def write_algorithm(algorithm: Algorithm, path: str) -> None:
    """Write ``algorithm`` as JSON to ``path`` atomically (``-`` for stdout)."""
    write_text_atomic(path, generate_algorithm_json(algorithm))
