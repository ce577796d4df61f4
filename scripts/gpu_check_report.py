"""scripts/gpu_check.py's report: outcomes of the checked cases, merged over ranks, as Markdown tables.

One row per (collective, op, entry point, transport), its dtypes in one column; a row with a
difference names the dtype, case and rank of each. The routing table compares the ``taccl``
group's routed and delegated counters with what the library should have made it do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from gpu_check_cases import DTYPES, dtype_name

from taccl_py.ir.collectives import Collective

__all__ = ["Outcome", "ReportRow", "all_exact", "merge_ranks", "report_lines", "routing_lines", "summarize"]


@dataclass(frozen=True)
class Outcome:
    """One checked case and what went wrong (``failure`` None: bit-exact, and routed as expected)."""

    collective: str
    dtype: str
    op: str
    entry: str
    transport: str
    case: str
    failure: str | None = None


@dataclass(frozen=True)
class ReportRow:
    """The cases of one (collective, op, entry point, transport): the dtypes run, how many, which failed."""

    collective: str
    op: str
    entry: str
    transport: str
    dtypes: tuple[str, ...]
    cases: int
    failures: tuple[str, ...]


def summarize(outcomes: Iterable[Outcome]) -> list[ReportRow]:
    """Return one row per (collective, op, entry point, transport), in the order first seen."""
    groups: dict[tuple[str, str, str, str], list[Outcome]] = {}
    for outcome in outcomes:
        groups.setdefault((outcome.collective, outcome.op, outcome.entry, outcome.transport), []).append(outcome)
    return [
        ReportRow(
            *key,
            tuple(dict.fromkeys(o.dtype for o in members)),
            len(members),
            tuple(f"{o.dtype} {o.case}: {o.failure}" for o in members if o.failure),
        )
        for key, members in groups.items()
    ]


def all_exact(rows: Iterable[ReportRow]) -> bool:
    """Return True when no row has a failure."""
    return not any(row.failures for row in rows)


def _short_dtypes(dtypes: Sequence[str]) -> str:
    if set(dtypes) == {dtype_name(d) for d in DTYPES}:
        return "all 6"
    return ", ".join(dtypes)


def report_lines(rows: Sequence[ReportRow], max_shown: int = 3) -> list[str]:
    """Return the rows as a Markdown table (collective, dtype, op, entry point, transport, cases, result)."""
    lines = [
        "| collective | dtype | op | entry point | transport | cases | result |",
        "|---|---|---|---|---|---:|---|",
    ]
    for row in rows:
        if row.failures:
            shown = "; ".join(row.failures[:max_shown])
            more = f"; and {len(row.failures) - max_shown} more" if len(row.failures) > max_shown else ""
            result = f"DIFFER {len(row.failures)}/{row.cases}: {shown}{more}"
        else:
            result = "exact"
        lines.append(
            f"| {row.collective} | {_short_dtypes(row.dtypes)} | {row.op} | {row.entry} | {row.transport} "
            f"| {row.cases} | {result} |"
        )
    return lines


def merge_ranks(per_rank: Sequence[Sequence[Outcome]]) -> list[Outcome]:
    """Return rank 0's outcomes, each failing with every rank's failure of that case (all ranks ran the same cases)."""
    merged = []
    for cases in zip(*per_rank, strict=True):
        failures = [f"rank {rank}: {o.failure}" for rank, o in enumerate(cases) if o.failure]
        merged.append(replace(cases[0], failure="; ".join(failures) or None))
    return merged


def routing_lines(per_rank: Sequence[tuple[Counter, Counter, Counter, Counter]]) -> tuple[list[str], bool]:
    """Return the ``taccl`` group's routing as a Markdown table, and True when every rank's counts were as expected.

    ``per_rank`` holds each rank's calls per collective: (routed, routed expected, delegated,
    delegated expected); the table shows rank 0's.
    """
    lines = [
        "| collective | routed | routed expected | delegated | delegated expected | result |",
        "|---|---:|---:|---:|---:|---|",
    ]
    names = {name for counts in per_rank[0] for name in counts}
    ok = True
    for name in sorted(names, key=_collective_order):
        off = [r for r, c in enumerate(per_rank) if (c[0][name], c[2][name]) != (c[1][name], c[3][name])]
        ok = ok and not off
        result = "as expected" if not off else f"NOT AS EXPECTED on ranks {off}"
        counts = " | ".join(str(c[name]) for c in per_rank[0])
        lines.append(f"| {name} | {counts} | {result} |")
    return lines, ok


def _collective_order(name: str) -> tuple[int, str]:
    values = [c.value for c in Collective]
    return (values.index(name), name) if name in values else (len(values), name)
