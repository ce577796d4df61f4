"""Write an Algorithm as MSCCL-IR XML for the MSCCL runtimes.

The IR lets a step wait for several steps of other threadblocks and move any number of chunks;
MSCCL-IR allows one dependency per step and fewer than ``MAX_COUNT`` chunks. Export therefore
rewrites each threadblock: runs of ``nop`` steps are folded into the next real step's
dependencies, dependencies are reduced to the latest step per threadblock (waiting for a step
implies its predecessors), every dependency but the last goes on an inserted ``nop`` before the
step (the runtime attaches a nop's dependency to the next real step and requires that step to
carry one itself), counts too large for one step are split into consecutive steps, threadblocks
are renumbered 0..n-1, and every reference is remapped to the new indices. ``hasdep`` marks the
steps some dependency names. Reading the result back and writing it again gives the same text.

The runtime reads only the operands a step type uses (``STEP_OPERANDS``); the other slot names
the peer's side, as msccl-tools and RCCL's own files do and as simulators of the file check. The
k-th sending step on (rank, send peer, channel) meets the k-th receiving step of the peer on that
channel, counted over the written steps (split pieces meet in order). A receiver's destination is
its ``dst``; an ``rrs`` stores nothing, so it names, and its sender is given, the destination down
its chain of ``rrs`` steps (where the first storing receiver puts the sum). A sender's data
source is its ``src`` for ``s`` and ``rrs`` and its ``dst`` (what it stored and forwards) for
``rcs`` and ``rrcs``. Per type:

======  ===================================  ========================================
type    ``src``                              ``dst``
======  ===================================  ========================================
s       own source                           the receiver's destination
r, rcs  the sender's data source             own destination
rrs     own operand                          the receiver's destination
rrc     own operand                          own destination
rrcs    own operand                          own destination
======  ===================================  ========================================

A step without a match (an unverified algorithm) names its own other operand there, as earlier
exports did for every step; ``taccl_py.msccl.convention`` accepts both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from xml.sax.saxutils import escape

from taccl_py._io import write_text_atomic
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.inplace import BOTH_PLACES_KEY
from taccl_py.msccl.dialect import (
    DIALECTS,
    NO_DEPENDENCY,
    NO_PEER,
    NOP_OFFSET,
    Dialect,
    Protocol,
    StepKey,
    pair_transfers,
    parse_dialect,
)
from taccl_py.msccl.limits import (
    DEFAULT_RUNTIME,
    MAX_COUNT,
    Runtime,
    RuntimeLimits,
    check_gpu_limits,
    runtime_limits,
)

__all__ = [
    "generate_msccl_xml",
    "check_msccl_limits",
    "write_msccl_xml",
    "msccl_max_bytes",
    "METADATA_COMMENT",
    "BOTH_PLACES_KEY",
]

METADATA_COMMENT = "taccl-metadata"  # <!-- taccl-metadata {json} --> carries Algorithm.metadata
_MAX_PIECE = MAX_COUNT - 1

Dep = tuple[int, int]
_Program = list[tuple[Threadblock, list["_XmlStep"]]]


@dataclass(frozen=True)
class _XmlStep:
    op: OpType
    src: tuple[Buffer, int]
    dst: tuple[Buffer, int]
    count: int
    dep: Dep | None
    hasdep: bool = False


@dataclass(frozen=True)
class _Unit:
    """A real IR step with its normalized dependencies (old ids) and count pieces."""

    step: Step
    deps: tuple[Dep, ...]
    pieces: tuple[int, ...]


def _pieces(count: int) -> tuple[int, ...]:
    """Return ``count`` cut into the fewest near-equal parts below ``MAX_COUNT``."""
    if count <= _MAX_PIECE:
        return (count,)
    parts = -(-count // _MAX_PIECE)
    base, extra = divmod(count, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))


def _normalize(deps: list[Dep], own: int, index: int, nop_only: set[int]) -> tuple[Dep, ...]:
    """Return ``deps`` as the latest step per other threadblock, dropping waits implied by program order."""
    latest: dict[int, int] = {}
    for tb, step in deps:
        if tb in nop_only or (tb == own and step < index):
            continue  # waiting for a threadblock of nops, or for an own earlier step, waits for nothing
        latest[tb] = max(latest.get(tb, step), step)
    return tuple(sorted(latest.items()))


def _plan_threadblock(tb: Threadblock, nop_only: set[int]) -> tuple[list[_Unit], dict[int, int]]:
    """Return the real steps of ``tb`` as units and the map old step index -> new XML index."""
    units: list[_Unit] = []
    index_map: dict[int, int] = {}
    pending: list[Dep] = []
    waiting: list[int] = []
    next_index = 0
    for index, step in enumerate(tb.steps):
        if step.op is OpType.NOP:
            pending.extend(step.depends)
            waiting.append(index)
            continue
        deps = _normalize(pending + list(step.depends), tb.id, index, nop_only)
        unit = _Unit(step, deps, _pieces(step.count))
        last = next_index + max(0, len(deps) - 1) + len(unit.pieces) - 1
        for old in waiting + [index]:
            index_map[old] = last
        units.append(unit)
        next_index = last + 1
        pending, waiting = [], []
    for old in waiting:  # trailing nops wait for nothing that follows; they end with the last real step
        if next_index:
            index_map[old] = next_index - 1
    return units, index_map


def _fill(slot: tuple[Buffer | None, int], other: tuple[Buffer | None, int]) -> tuple[Buffer, int]:
    """Return ``slot``, or ``other`` in its place when the step does not use it."""
    return slot if slot[0] is not None else other  # type: ignore[return-value]


def _emit_unit(unit: _Unit, deps: list[Dep]) -> list[_XmlStep]:
    out = [_XmlStep(OpType.NOP, (Buffer.INPUT, NOP_OFFSET), (Buffer.OUTPUT, NOP_OFFSET), 0, dep) for dep in deps[:-1]]
    step = unit.step
    src, dst = (step.src_buffer, step.src_offset), (step.dst_buffer, step.dst_offset)
    src, dst = _fill(src, dst), _fill(dst, src)
    if src[0] is None:
        raise ArgumentError(None, "step", f"{step.op.value} step names no buffer", "a source or destination buffer")
    moved = 0
    for piece_index, piece in enumerate(unit.pieces):
        dep = deps[-1] if deps and piece_index == 0 else None
        out.append(_XmlStep(step.op, (src[0], src[1] + moved), (dst[0], dst[1] + moved), piece, dep))
        moved += piece
    return out


def _rank_threadblocks(algorithm: Algorithm, prog: RankProgram) -> list[tuple[Threadblock, list[_XmlStep]]]:
    """Return the threadblocks of one rank (renumbered 0..n-1) with their XML steps."""
    ordered = sorted(prog.threadblocks, key=lambda tb: tb.id)
    new_id = {tb.id: index for index, tb in enumerate(ordered)}
    nop_only = {tb.id for tb in ordered if all(s.op is OpType.NOP for s in tb.steps)}
    plans = {tb.id: _plan_threadblock(tb, nop_only) for tb in ordered}
    result = []
    for tb in ordered:
        steps: list[_XmlStep] = []
        for unit in plans[tb.id][0]:
            translated = []
            for dep_tb, dep_step in unit.deps:
                target = plans.get(dep_tb, ({}, {}))[1].get(dep_step)
                if target is None:
                    raise ArgumentError(
                        algorithm.name,
                        f"rank {prog.rank} tb {tb.id}",
                        f"depends on tb {dep_tb} step {dep_step}, which does not exist",
                        "dependencies on existing steps",
                    )
                translated.append((new_id[dep_tb], target))
            steps.extend(_emit_unit(unit, sorted(translated)))
        result.append((tb, steps))
    marked = {step.dep for _, steps in result for step in steps if step.dep is not None}
    return [
        (
            Threadblock(new_id[tb.id], (), tb.send_peer, tb.recv_peer, tb.channel),
            [_XmlStep(s.op, s.src, s.dst, s.count, s.dep, (new_id[tb.id], i) in marked) for i, s in enumerate(steps)],
        )
        for tb, steps in result
    ]


def _chain_destinations(
    steps: dict[StepKey, _XmlStep], receiver: dict[StepKey, StepKey]
) -> dict[StepKey, tuple[Buffer, int]]:
    """Return the ``dst`` each ``rrs`` step names: where the first storing receiver down its chain puts the data.

    A chain that ends unmatched or runs in a circle (a broken algorithm) names the ``src`` of its
    last ``rrs``; every ``rrs`` of a chain names the same slot, so each sender agrees with its receiver.
    """
    named: dict[StepKey, tuple[Buffer, int]] = {}
    for start, step in steps.items():
        if step.op is not OpType.RECV_REDUCE_SEND or start in named:
            continue
        path, current = [start], start
        on_path = {start}
        while True:
            following = receiver.get(current)
            if following is None or following in on_path:
                end = steps[current].src
                break
            if following in named:
                end = named[following]
                break
            if steps[following].op is not OpType.RECV_REDUCE_SEND:
                end = steps[following].dst
                break
            path.append(following)
            on_path.add(following)
            current = following
        named.update((key, end) for key in path)
    return named


def _data_source(step: _XmlStep) -> tuple[Buffer, int]:
    """Return the slot whose data a sending step sends: what ``rcs`` and ``rrcs`` stored, else ``src``."""
    return step.dst if step.op in (OpType.RECV_COPY_SEND, OpType.RECV_REDUCE_COPY_SEND) else step.src


def _with_peer_fields(programs: list[tuple[int, _Program]]) -> list[tuple[int, _Program]]:
    """Return ``programs`` with each step's unused operand slot naming its peer's side (the module docstring)."""
    steps = {
        (rank, tb.id, index): step
        for rank, tbs in programs
        for tb, tb_steps in tbs
        for index, step in enumerate(tb_steps)
    }
    receiver = pair_transfers(
        (rank, tb, index, step.op)
        for rank, tbs in programs
        for tb, tb_steps in tbs
        for index, step in enumerate(tb_steps)
    )
    sender = {recv: send for send, recv in receiver.items()}
    chained = _chain_destinations(steps, receiver)
    written: dict[StepKey, _XmlStep] = {}
    for key, step in steps.items():
        if step.op is OpType.RECV_REDUCE_SEND:
            written[key] = replace(step, dst=chained[key])
        elif step.op is OpType.SEND and key in receiver:
            recv = receiver[key]
            written[key] = replace(step, dst=chained.get(recv, steps[recv].dst))
        elif step.op in (OpType.RECV, OpType.RECV_COPY_SEND) and key in sender:
            written[key] = replace(step, src=_data_source(steps[sender[key]]))
    return [
        (rank, [(tb, [written.get((rank, tb.id, i), s) for i, s in enumerate(tb_steps)]) for tb, tb_steps in tbs])
        for rank, tbs in programs
    ]


def _attr(value: object) -> str:
    return escape(str(value), {'"': "&quot;"})


def msccl_max_bytes(algorithm: Algorithm) -> int:
    """Return the ``maxBytes`` MSCCL tests inclusively for our exclusive ``max_bytes`` (0: no upper end).

    Written as ``max_bytes`` itself, adjacent bands would both match the size at their shared edge.
    """
    if algorithm.max_bytes is None:
        return 0
    if algorithm.max_bytes <= 1:
        raise ArgumentError(algorithm.name, "max_bytes", f"{algorithm.max_bytes}", "a band holding some size above 0")
    return algorithm.max_bytes - 1


def _header(algorithm: Algorithm, dialect: Dialect) -> str:
    spec = DIALECTS[dialect]
    both = algorithm.meta(BOTH_PLACES_KEY) == "1"
    attrs = [
        ("name", algorithm.name),
        ("proto", algorithm.protocol),
        ("nchannels", algorithm.num_channels),
        ("nchunksperloop", algorithm.chunks_per_loop),
        ("ngpus", algorithm.num_ranks),
        ("coll", spec.collective_names[algorithm.collective]),
        ("inplace", int(algorithm.inplace or both)),
    ]
    if spec.size_band:
        attrs += [
            ("outofplace", int(not algorithm.inplace or both)),
            ("minBytes", algorithm.min_bytes),
            ("maxBytes", msccl_max_bytes(algorithm)),
        ]
    return "<algo " + " ".join(f'{key}="{_attr(value)}"' for key, value in attrs) + ">"


def _step_line(index: int, step: _XmlStep) -> str:
    depid, deps = step.dep if step.dep is not None else (NO_DEPENDENCY, NO_DEPENDENCY)
    return (
        f'      <step s="{index}" type="{step.op.value}" srcbuf="{step.src[0].value}" srcoff="{step.src[1]}" '
        f'dstbuf="{step.dst[0].value}" dstoff="{step.dst[1]}" cnt="{step.count}" depid="{depid}" deps="{deps}" '
        f'hasdep="{int(step.hasdep)}"/>'
    )


def generate_msccl_xml(
    algorithm: Algorithm, dialect: Dialect | str = Dialect.NEW, *, runtime: Runtime | str = DEFAULT_RUNTIME
) -> str:
    """Return the MSCCL-IR XML text of ``algorithm`` for the runtime ``dialect``.

    Parameters
    ----------
    algorithm : Algorithm
        The schedule; it should have passed ``check_algorithm`` (it is not modified).
    dialect : {"new", "old"}
        ``new`` for Azure/msccl-executor-nccl and RCCL, ``old`` for microsoft/msccl.
    runtime : {"portable", "msccl-executor-nccl", "msccl", "rccl"}
        Whose limits the file must meet (``taccl_py.msccl.limits``); default ``portable``, the
        strictest of them all.

    Returns
    -------
    str
        The XML document, one element per line.

    Raises
    ------
    ArgumentError
        For an unknown dialect, runtime or protocol, a dependency on a missing step, a switch
        step (MSCCL-IR has no in-network operation), or a GPU beyond ``runtime``'s limits
        (``taccl_py.msccl.limits``: threadblocks, steps, channels, peers).

    Examples
    --------
    >>> from taccl_py.ir.collectives import Collective
    >>> from taccl_py.ir.lowering import Transfer, LocalCopy, lower_plan
    >>> I, O = Buffer.INPUT, Buffer.OUTPUT
    >>> plan = [Transfer(0, 1, (I, 0), (O, 0)), Transfer(1, 0, (I, 0), (O, 1)),
    ...         LocalCopy(0, (I, 0), (O, 0)), LocalCopy(1, (I, 0), (O, 1))]
    >>> text = generate_msccl_xml(lower_plan("ag2", Collective.ALLGATHER, 2, 2, plan))
    >>> text.splitlines()[0]
    '<algo name="ag2" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" inplace="0" outofplace="1" minBytes="0" maxBytes="0">'
    """  # noqa: E501
    dialect = parse_dialect(dialect)
    programs = _checked_programs(algorithm, runtime_limits(runtime))
    lines = []
    if algorithm.metadata:
        blob = json.dumps(dict(algorithm.metadata), sort_keys=True).replace("--", "-\\u002d")
        lines.append(f"<!-- {METADATA_COMMENT} {blob} -->")
    lines.append(_header(algorithm, dialect))
    for prog, (_, tbs) in zip(algorithm.ranks, _with_peer_fields(programs)):
        lines.append(
            f'  <gpu id="{prog.rank}" i_chunks="{prog.input_chunks}" o_chunks="{prog.output_chunks}" '
            f's_chunks="{prog.scratch_chunks}">'
        )
        for tb, steps in tbs:
            send = NO_PEER if tb.send_peer is None else tb.send_peer
            recv = NO_PEER if tb.recv_peer is None else tb.recv_peer
            lines.append(f'    <tb id="{tb.id}" send="{send}" recv="{recv}" chan="{tb.channel}">')
            lines.extend(_step_line(index, step) for index, step in enumerate(steps))
            lines.append("    </tb>")
        lines.append("  </gpu>")
    lines.append("</algo>")
    return "\n".join(lines) + "\n"


def check_msccl_limits(algorithm: Algorithm, *, runtime: Runtime | str = DEFAULT_RUNTIME) -> None:
    """Raise the ``ArgumentError`` ``generate_msccl_xml`` would raise for ``algorithm``, without writing the text.

    Synthesis asks this of every routing it ranks; the text (peer fields, lines) costs nearly as much again.
    """
    _checked_programs(algorithm, runtime_limits(runtime))


def _checked_programs(algorithm: Algorithm, limits: RuntimeLimits) -> list[tuple[int, _Program]]:
    """Return each rank's (threadblock, XML steps); raise ``ArgumentError`` where MSCCL-IR or ``limits`` refuse it."""
    if algorithm.uses_switch:
        raise ArgumentError(
            algorithm.name,
            "step",
            "switch steps (mrs, ms: NVLink SHARP multimem) have no MSCCL-IR form",
            "point-to-point steps only; export it as an MSCCL++ plan (taccl export-mscclpp)",
        )
    if algorithm.protocol not in {p.value for p in Protocol}:
        raise ArgumentError(
            algorithm.name, "protocol", f"{algorithm.protocol!r}", "one of " + ", ".join(p.value for p in Protocol)
        )
    programs = []
    for prog in algorithm.ranks:
        tbs = _rank_threadblocks(algorithm, prog)
        check_gpu_limits(
            algorithm.name,
            prog.rank,
            [(tb.id, tb.send_peer, tb.recv_peer, tb.channel, len(steps)) for tb, steps in tbs],
            limits,
            algorithm.num_ranks,
        )
        programs.append((prog.rank, tbs))
    return programs


def write_msccl_xml(
    algorithm: Algorithm, path: str, dialect: Dialect | str = Dialect.NEW, *, runtime: Runtime | str = DEFAULT_RUNTIME
) -> None:
    """Write ``algorithm`` as MSCCL-IR XML to ``path`` atomically (``-`` for stdout).

    The text is generated completely before anything is written, so a limit violation leaves
    no file behind. Callers should run ``check_algorithm`` first.
    """
    write_text_atomic(path, generate_msccl_xml(algorithm, dialect, runtime=runtime))
