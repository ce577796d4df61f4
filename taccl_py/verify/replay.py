"""Check that an Algorithm implements its collective, by symbolic replay of its dataflow.

Every chunk of every buffer holds a symbolic value: a ``Contribution`` (the sorted (rank, input
index) pairs summed into it, see ``taccl_py.ir.collectives``) or None while nothing wrote it. Input
chunks start from ``initial_value`` at ``input_slot`` (in-place collectives alias the buffers);
output and scratch chunks start empty. The actions of ``build_dataflow`` are replayed in round
order (``Dataflow.actions_in_round_order``): a SEND snapshots its source when issued, a RECV
stores the snapshot of the SEND it matches, a COMPUTE stores the sum of its sources. Afterwards
every output chunk must hold ``expected_output`` at ``output_slot``.

Faults are ``Violation`` records: the dataflow's structural ones (unmatched send or receive,
size mismatch, out of bounds, bad dependency, deadlock) and, when the structure is sound,
"uninitialized read", "double reduction", "reduction in non-reducing collective",
"wrong result" and "race" (two threadblocks of a rank touching a chunk, at least one writing,
with no happens-before path between them; see ``taccl_py.verify.races``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from taccl_py.errors import VerificationError, Violation
from taccl_py.ir.algorithm import Algorithm, Buffer, input_slot, output_slot
from taccl_py.ir.collectives import Collective, Contribution, expected_output, initial_value
from taccl_py.ir.dataflow import Action, ActionKind, Dataflow, Region
from taccl_py.ir.flow_cache import dataflow_of
from taccl_py.ir.inplace import BOTH_PLACES_KEY, inplace_variant
from taccl_py.verify.races import AccessLog, find_races

__all__ = ["VerificationReport", "verify_algorithm", "check_algorithm", "describe_value", "exported_inplace_form"]

logger = logging.getLogger(__name__)

# A value derived from a chunk nothing wrote; reported once where it is read, then carried silently.
_POISON: Contribution = ((-1, -1),)

# (rank, buffer's spelling or None, temp or None, chunk): plain strings and ints, so that the
# garbage collector stops tracking the keys (an Enum member would keep every key tracked).
_Key = tuple


@dataclass(frozen=True)
class VerificationReport:
    """The outcome of verifying one algorithm.

    ``rounds`` is the number of replay rounds (0 when the structure is broken); ``violations``
    lists every fault found, the first being the one to show a user.
    """

    name: str
    ok: bool
    violations: tuple[Violation, ...]
    rounds: int

    @property
    def first(self) -> Violation | None:
        """Return the first violation, or None when the algorithm is correct."""
        return self.violations[0] if self.violations else None

    def summary(self) -> str:
        """Return one line: ``ok`` or the first fault and how many more follow."""
        if self.ok:
            return f"{self.name}: ok ({self.rounds} rounds)"
        more = f" (+{len(self.violations) - 1} more)" if len(self.violations) > 1 else ""
        return f"{self.name}: {self.first}{more}"


def describe_value(value: Contribution | None) -> str:
    """Return a short human reading of a symbolic chunk value.

    >>> describe_value(((0, 3), (1, 3), (2, 3), (3, 5)))
    'in[3] of ranks 0-2 + in[5] of rank 3'
    >>> describe_value(None)
    'nothing (never written)'
    """
    if value is None:
        return "nothing (never written)"
    if value == _POISON:
        return "a value computed from an uninitialized chunk"
    by_index: dict[int, list[int]] = {}
    for rank, index in value:
        by_index.setdefault(index, []).append(rank)
    parts = []
    for index in sorted(by_index):
        ranks = by_index[index]
        label = "rank" if len(ranks) == 1 else "ranks"
        parts.append(f"in[{index}] of {label} {_ranges(ranks)}")
    text = " + ".join(parts)
    return text if len(text) <= 160 else text[:157] + "..."


def _ranges(values: Sequence[int]) -> str:
    """Return ``values`` (sorted, may repeat) as ``0-3,5`` with repeats marked ``x2``."""
    counts = Counter(values)
    keys = sorted(counts)
    spans: list[str] = []
    start = previous = keys[0]
    for key in keys[1:] + [None]:
        if key is not None and key == previous + 1 and counts[key] == counts[start] == 1:
            previous = key
            continue
        span = str(start) if start == previous else f"{start}-{previous}"
        spans.append(span + (f" x{counts[start]}" if counts[start] > 1 else ""))
        if key is not None:
            start = previous = key
    return ",".join(spans)


def _buffer_code(buffer: Buffer | None) -> str | None:
    return None if buffer is None else buffer.value


def _where(region: Region, chunk: int) -> str:
    if region.buffer is None:
        return f"the temporary of tb {region.temp[0]} step {region.temp[1]}"
    return f"{region.buffer.value}[{chunk}]"


@dataclass
class _Replay:
    """Mutable state of one replay: chunk values, send snapshots and the faults found."""

    flow: Dataflow
    values: dict[_Key, Contribution]
    snapshots: dict[int, list[Contribution]]
    violations: list[Violation]
    reported: set
    accesses: AccessLog


def _read(replay: _Replay, action: Action, region: Region, rank: int | None = None) -> list[Contribution]:
    """Return the values of ``region`` on ``rank`` (default: the action's own), logging the reads."""
    rank = action.rank if rank is None else rank
    code, temp, values = _buffer_code(region.buffer), region.temp, replay.values
    log = replay.accesses.read if code is not None else None
    out = []
    for chunk in range(region.offset, region.offset + region.count):
        key = (rank, code, temp, chunk)
        value = values.get(key)
        if log is not None:
            log(key, action.id)
        if value is None:
            if key not in replay.reported:
                replay.reported.add(key)
                replay.violations.append(
                    Violation(
                        "uninitialized read",
                        f"{action.kind.value} reads {_where(region, chunk)}"
                        + (f" of rank {rank}" if rank != action.rank else "")
                        + ", which nothing wrote before",
                        action.rank,
                        action.threadblock,
                        action.step,
                        chunk if region.buffer is not None else None,
                    )
                )
            value = _POISON
        out.append(value)
    return out


def _write(
    replay: _Replay, action: Action, region: Region, values: Sequence[Contribution], rank: int | None = None
) -> None:
    """Store ``values`` into ``region`` on ``rank`` (default: the action's own), logging the writes."""
    rank = action.rank if rank is None else rank
    code, temp, stored = _buffer_code(region.buffer), region.temp, replay.values
    log = replay.accesses.write if code is not None else None
    for chunk, value in zip(range(region.offset, region.offset + region.count), values):
        key = (rank, code, temp, chunk)
        stored[key] = value
        if log is not None:
            log(key, action.id)


def _sum(replay: _Replay, action: Action, operands: Sequence[Contribution], chunk: int) -> Contribution:
    """Return the sum of ``operands``; report pairs a sum counts more often than any operand did."""
    if any(op == _POISON for op in operands):
        return _POISON
    merged = sorted(pair for op in operands for pair in op)
    if len(set(merged)) == len(merged):
        return tuple(merged)
    total = Counter(merged)
    most_in_one = Counter()
    for op in operands:
        for pair, count in Counter(op).items():
            most_in_one[pair] = max(most_in_one[pair], count)
    doubled = sorted(pair for pair, count in total.items() if count > most_in_one[pair])
    if doubled:
        rank, index = doubled[0]
        extra = f" and {len(doubled) - 1} more" if len(doubled) > 1 else ""
        replay.violations.append(
            Violation(
                "double reduction",
                f"the sum into {_where(action.target, chunk)} counts input {index} of rank {rank}{extra} twice",
                action.rank,
                action.threadblock,
                action.step,
                chunk if action.target.buffer is not None else None,
            )
        )
    return tuple(merged)


def _compute(replay: _Replay, action: Action) -> None:
    if action.target is None:
        return  # a nop carries only dependencies
    operands = [_read(replay, action, source) for source in action.sources]
    if len(operands) == 1:
        _write(replay, action, action.target, operands[0])
        return
    _write(replay, action, action.target, _sums(replay, action, operands))


def _switch(replay: _Replay, action: Action) -> None:
    """Run a switch action: read its operand (on every member when it reduces), store on every member."""
    (source,) = action.sources
    if action.kind is ActionKind.SWITCH_REDUCE:
        values = _sums(replay, action, [_read(replay, action, source, rank) for rank in action.group])
    else:
        values = _read(replay, action, source)
    for rank in action.group:
        _write(replay, action, action.target, values, rank)


def _sums(replay: _Replay, action: Action, operands: Sequence[Sequence[Contribution]]) -> list[Contribution]:
    """Return the chunk-wise sums of ``operands``; report a sum in a collective that must only copy."""
    algorithm = replay.flow.algorithm
    if not algorithm.collective.reduces and (action.rank, action.threadblock, action.step) not in replay.reported:
        replay.reported.add((action.rank, action.threadblock, action.step))
        replay.violations.append(
            Violation(
                "reduction in non-reducing collective",
                f"a {algorithm.collective.value} must only copy, but this step sums into "
                f"{_where(action.target, action.target.offset)}",
                action.rank,
                action.threadblock,
                action.step,
            )
        )
    return [
        _sum(replay, action, [values[j] for values in operands], action.target.offset + j)
        for j in range(action.target.count)
    ]


def _initial_values(algorithm: Algorithm) -> dict[_Key, Contribution]:
    values: dict[_Key, Contribution] = {}
    for prog in algorithm.ranks:
        for index in range(algorithm.layout.input_chunks):
            buffer, offset = input_slot(algorithm, prog.rank, index)
            values[(prog.rank, buffer.value, None, offset)] = initial_value(prog.rank, index)
    return values


def _layout_violations(algorithm: Algorithm) -> list[Violation]:
    """Return faults of buffer sizes too small for the inputs and outputs the collective places."""
    layout = algorithm.layout
    found = []
    for prog in algorithm.ranks:
        needed: dict[Buffer, int] = {}
        for count, slot in ((layout.input_chunks, input_slot), (layout.output_chunks, output_slot)):
            for index in range(count):
                buffer, offset = slot(algorithm, prog.rank, index)
                needed[buffer] = max(needed.get(buffer, 0), offset + 1)
        for buffer, chunks in sorted(needed.items()):
            if prog.chunks(buffer) < chunks:
                found.append(
                    Violation(
                        "structure",
                        f"buffer {buffer.value} holds {prog.chunks(buffer)} chunks but a "
                        f"{'in-place ' if algorithm.inplace else ''}{algorithm.collective.value} of "
                        f"{algorithm.chunks_per_loop} chunks needs {chunks} there",
                        prog.rank,
                    )
                )
    return found


def _postcondition(replay: _Replay) -> None:
    algorithm = replay.flow.algorithm
    layout = algorithm.layout
    # AllReduce expects one sum of N pairs at every rank, and gathered copies share one tuple: each
    # (chunk, value object) is compared once, not N times (N^2 pairs per chunk, minutes at 512 GPUs).
    matched: dict[int, Contribution] | None = {} if layout.collective is Collective.ALLREDUCE else None
    for prog in algorithm.ranks:
        for index in range(layout.output_chunks):
            buffer, offset = output_slot(algorithm, prog.rank, index)
            value = replay.values.get((prog.rank, buffer.value, None, offset))
            if matched is not None and value is not None and matched.get(index) is value:
                continue
            expected = expected_output(layout, prog.rank, index)
            if value == expected:
                if matched is not None:
                    matched[index] = value
            else:
                replay.violations.append(
                    Violation(
                        "wrong result",
                        f"output chunk {index} ({buffer.value}[{offset}]) holds {describe_value(value)}; "
                        f"expected {describe_value(expected)}",
                        prog.rank,
                        chunk=offset,
                    )
                )


def _replay_actions(flow: Dataflow, actions: Iterable[Action]) -> _Replay:
    log = AccessLog(tuple((action.rank, action.threadblock) for action in flow.actions))
    replay = _Replay(flow, _initial_values(flow.algorithm), {}, [], set(), log)
    for action in actions:
        if action.kind is ActionKind.SEND:
            replay.snapshots[action.id] = _read(replay, action, action.sources[0])
        elif action.kind is ActionKind.RECV:
            _write(replay, action, action.target, replay.snapshots[flow.match[action.id]])
        elif action.kind.is_switch:
            _switch(replay, action)
        else:
            _compute(replay, action)
    return replay


def verify_algorithm(algorithm: Algorithm) -> VerificationReport:
    """Return a report of whether ``algorithm`` implements its collective, with every fault found.

    Parameters
    ----------
    algorithm : Algorithm
        The schedule to check; it is not modified.

    Returns
    -------
    VerificationReport
        ``ok`` is True when no violation was found. Structural faults (from
        ``build_dataflow`` and buffer sizes) stop the check before the replay. An out-of-place
        schedule marked as serving in-place calls too (``BOTH_PLACES_KEY``, an MSCCL file with
        both flags) is checked on aliased buffers as well; those faults start with "in place:".

    Notes
    -----
    The replay costs O(chunks moved); race detection adds a vector-clock pass over the
    dataflow restricted to the threadblocks with conflicting accesses.

    Examples
    --------
    >>> from taccl_py.ir.collectives import Collective
    >>> from taccl_py.ir.lowering import Transfer, lower_plan
    >>> plan = [Transfer(0, 1, (Buffer.INPUT, 0), (Buffer.OUTPUT, 0)),
    ...         Transfer(1, 0, (Buffer.INPUT, 0), (Buffer.OUTPUT, 1))]
    >>> report = verify_algorithm(lower_plan("half", Collective.ALLGATHER, 2, 2, plan))
    >>> report.ok, report.first.kind, report.first.rank
    (False, 'wrong result', 0)
    """
    report = _verify_placement(algorithm)
    if algorithm.meta(BOTH_PLACES_KEY) == "1" and not algorithm.inplace:
        # the file serves in-place calls too: the same steps must also be right on aliased buffers
        aliased = _verify_placement(inplace_variant(algorithm))
        in_place = tuple(replace(v, message=f"in place: {v.message}") for v in aliased.violations)
        report = replace(report, ok=report.ok and aliased.ok, violations=report.violations + in_place)
    return report


def _verify_placement(algorithm: Algorithm) -> VerificationReport:
    flow = dataflow_of(algorithm)
    structural = list(flow.violations) + _layout_violations(algorithm)
    if structural:
        return VerificationReport(algorithm.name, False, tuple(structural), 0)
    replay = _replay_actions(flow, flow.actions_in_round_order())
    _postcondition(replay)
    races = find_races(flow, replay.accesses)
    violations = tuple(replay.violations) + tuple(races)
    if violations:
        logger.debug("%s: %d violations, first: %s", algorithm.name, len(violations), violations[0])
    return VerificationReport(algorithm.name, not violations, violations, flow.num_rounds)


def check_algorithm(algorithm: Algorithm) -> Algorithm:
    """Return ``algorithm`` unchanged when it implements its collective.

    Raises
    ------
    VerificationError
        Carrying every violation ``verify_algorithm`` found.
    """
    report = verify_algorithm(algorithm)
    if not report.ok:
        raise VerificationError(algorithm.name, report.violations)
    return algorithm


def exported_inplace_form(algorithm: Algorithm) -> tuple[Algorithm | None, str | None]:
    """Return the verified in-place form an export writes beside ``algorithm`` (named ``<name>-inplace``), or why not.

    (None, None) for an algorithm already in place and for AlltoAll, which callers make out of place;
    (None, reason) when the in-place form fails verification. MSCCL XML and MSCCL++ plans both use it.
    """
    if algorithm.inplace or algorithm.collective is Collective.ALLTOALL:
        return None, None
    variant = inplace_variant(algorithm)
    report = verify_algorithm(variant)
    if not report.ok:
        return None, f"its in-place form fails: {report.first}"
    return replace(variant, name=f"{algorithm.name}-inplace"), None
