"""The sizes each written MSCCL++ plan serves: what its executor takes, within 32-bit offsets, where NCCL is slower.

MSCCL++'s NCCL shim runs NCCL's own collective wherever no plan covers a size, so a band's plan
covers only what it should serve: from the first size its chunk counts take at every framework
size (``sizes.first_accepted_min``), up to the last its offsets address
(``sizes.largest_addressable_size``), and, given NCCL's best times, only the runs of sizes where
the plan, simulated as MSCCL++ runs it (whole chunks), is at least ``KEEP_RATIO`` of NCCL's speed
(``taccl_py.simulate.leave_to_nccl``). A band split that way gets one plan per run:
``<band>``, then ``<band>-part2``...
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from taccl_py.errors import VerificationError, Violation
from taccl_py.ir.library import band_part_name
from taccl_py.mscclpp.parse import parse_mscclpp_plan
from taccl_py.mscclpp.plan import ExecutionPlan
from taccl_py.mscclpp.simulate import simulate_mscclpp_plan
from taccl_py.mscclpp.sizes import (
    MIN_MESSAGE_SIZE_LIMIT,
    AcceptanceRule,
    acceptance_rule,
    first_accepted_min,
    refused_sizes,
)
from taccl_py.simulate import WHOLE_CHUNKS
from taccl_py.simulate.leave_to_nccl import LeftToNccl, NcclTime, Probe, SizeRange, probe_sizes, verdict_of
from taccl_py.topology.model import Topology

__all__ = ["PlanRange", "served_plans"]


@dataclass(frozen=True)
class PlanRange:
    """The sizes (bytes, both inclusive) a written plan serves, the sizes its executor takes, and why they narrow.

    ``narrowed``: why the plan serves less than its band (the sizes left are NCCL's); None: the
    whole band, up to the last size MSCCL++'s 32-bit offsets address.
    """

    file_name: str
    min_bytes: int
    max_bytes: int
    rule: AcceptanceRule
    narrowed: str | None = None


# A size field as json.dumps(indent=2) writes it: two spaces in, where only the top object's members sit.
_RANGE_FIELD = re.compile(r'^  "(min|max)_message_size": -?\d+(,?)$', re.MULTILINE)


def _with_range(text: str, min_bytes: int, max_bytes: int) -> str:
    """Return the plan ``text`` with its size range set to ``min_bytes``..``max_bytes`` (both inclusive).

    The text json.dumps(indent=2) would write of the edited document. Text that json.dumps(indent=2)
    wrote (every plan this package writes) has its two lines replaced: re-encoding a plan of 10^5 ops
    in pure Python took 0.3 s a range. Any other layout is re-encoded.
    """
    fields = list(_RANGE_FIELD.finditer(text))
    laid_out = text.startswith('{\n  "') and text.endswith("\n}\n") and text.isascii()
    if laid_out and sorted(m[1] for m in fields) == ["max", "min"]:
        values = {"min": min_bytes, "max": max_bytes}
        pieces, start = [], 0
        for field in fields:
            pieces += [text[start : field.start()], f'  "{field[1]}_message_size": {values[field[1]]}{field[2]}']
            start = field.end()
        return "".join(pieces) + text[start:]
    document = json.loads(text)
    document["min_message_size"], document["max_message_size"] = min_bytes, max_bytes
    return json.dumps(document, indent=2) + "\n"


def _kept_runs(
    plan: ExecutionPlan,
    band_min: int,
    band_max: int | None,
    topology: Topology | None,
    nccl_times: Mapping[int, NcclTime] | None,
) -> tuple[tuple[SizeRange, ...], tuple[LeftToNccl, ...]]:
    """Return the runs of the band [band_min, band_max) the plan keeps against NCCL, and those it leaves."""
    if topology is None or nccl_times is None:
        return (SizeRange(band_min, band_max),), ()
    sizes = probe_sizes(band_min, band_max)
    times = simulate_mscclpp_plan(plan, topology, sizes, model=WHOLE_CHUNKS)
    verdict = verdict_of(
        [Probe(size, result.time_us, nccl_times[size]) for size, result in zip(sizes, times)], band_min, band_max
    )
    return verdict.kept, verdict.left


def served_plans(
    file_name: str,
    text: str,
    band_min: int,
    band_max: int | None,
    topology: Topology | None = None,
    nccl_times: Mapping[int, NcclTime] | None = None,
) -> tuple[tuple[tuple[str, str, PlanRange], ...], tuple[LeftToNccl, ...]]:
    """Return the plans (file name, text, range) that serve the band [band_min, band_max) of plan ``text``.

    One plan per run of sizes kept, and the runs left to NCCL (faster there). ``nccl_times``: NCCL's
    best at every ``probe_sizes`` size of the band (``nccl_best_times`` under MSCCL's loop); None
    keeps every size. Raises ``VerificationError`` (a fault of ours) where a plan would still refuse
    a framework size in its range.
    """
    plan = parse_mscclpp_plan(text, file_name)
    largest = acceptance_rule(plan).max_bytes
    kept, left = _kept_runs(plan, band_min, band_max, topology, nccl_times)
    pieces = []
    for run in kept:
        high = largest if run.max_bytes is None else min(largest, run.max_bytes - 1)
        if high < run.min_bytes:
            continue
        # the plan the text with this range parses to (high >= min: it parses): no text made or read again
        low = first_accepted_min(replace(plan, min_message_size=run.min_bytes, max_message_size=high))
        # no framework size in this run is taken, or MSCCL++ would misread its least: it stays with NCCL
        if low is None or low >= MIN_MESSAGE_SIZE_LIMIT:
            continue
        name = band_part_name(file_name, len(pieces))
        piece_text = _with_range(text, low, high)
        piece = replace(plan, min_message_size=low, max_message_size=high)  # what piece_text parses to
        if refused := refused_sizes(piece):
            fault = f"refuses {len(refused)} framework sizes in its range, {refused[0]} bytes first"
            raise VerificationError(name, [Violation("unloadable size", fault)])
        why = []
        if low > run.min_bytes:
            why.append(f"serves from {low} bytes, {run.min_bytes}-{low - 1} left to NCCL")
        if run.max_bytes is not None and high < run.max_bytes - 1:  # an open band ends there always
            why.append(f"serves up to {high} bytes (32-bit offsets), {high + 1} and up left to NCCL")
        pieces.append((name, piece_text, PlanRange(name, low, high, acceptance_rule(piece), "; ".join(why) or None)))
    return tuple(pieces), left
