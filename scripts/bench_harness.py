"""The benchmark scripts' shared harness: arguments, progress, tables, ratios, CSV files and BENCHMARKS.md sections.

Each ``scripts/bench_*.py`` builds its parser with :func:`argument_parser` and the ``add_*_argument``
helpers (one flag name, default and help wording everywhere), writes progress lines with :func:`log`
(stderr, so stdout holds only the tables), prints tables with :func:`print_table` and computes its
ratios with :func:`speedup` and :func:`of_bound`.

Each script owns the text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` of
BENCHMARKS.md (:func:`update_benchmarks_section`, recording :func:`command_line`). Long raw tables go
to CSV files under ``scripts/data/`` (:func:`write_csv`, or :func:`csv_output` which writes only when
asked); the section keeps a short summary computed from the same rows (:func:`csv_records`, or
:func:`read_csv` on the written file) and a line pointing at the file (:func:`csv_pointer`).

Scripts run as ``python scripts/NAME.py``: Python puts ``scripts/`` first on ``sys.path``, so they
import this module and each other by name, and ``taccl_py`` comes from the editable install
(``pip install -e .``, README "Set-up"); no script needs a ``sys.path`` line.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import math
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from taccl_py.topology import builtin_topology_names

__all__ = [
    "BENCHMARKS_PATH",
    "COLLECTIVES",
    "DATA_DIR",
    "add_collectives_argument",
    "add_csv_argument",
    "add_instances_argument",
    "add_jobs_argument",
    "add_no_write_argument",
    "add_nodes_argument",
    "add_sizes_argument",
    "add_topologies_argument",
    "add_write_argument",
    "argument_parser",
    "collective_order",
    "command_line",
    "csv_output",
    "csv_pointer",
    "csv_records",
    "format_or_dash",
    "group_records",
    "log",
    "machine_cases",
    "markdown_table",
    "of_bound",
    "parse_instances",
    "print_table",
    "read_csv",
    "row_bound_us",
    "speedup",
    "split_names",
    "text_table",
    "update_benchmarks_section",
    "value_span",
    "write_csv",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_PATH = REPO_ROOT / "BENCHMARKS.md"
DATA_DIR = REPO_ROOT / "scripts" / "data"
_HEADER = "# Benchmarks\n\nEach section is written by the script it names; rerun that command to refresh it.\n"
#: Decimal places a float keeps in a CSV cell (µs times and fractions of the bound).
CSV_DECIMALS = 4
#: The collectives the tables cover, in the order their rows are written.
COLLECTIVES = ("allgather", "reducescatter", "allreduce")


# -- progress and command lines ------------------------------------------------------------------------


def log(message: str) -> None:
    """Write one progress line to stderr at once: stdout carries only the tables, and a long run shows as it goes."""
    print(message, file=sys.stderr, flush=True)


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """Return ``python scripts/NAME.py ARGS`` for BENCHMARKS.md: ``script`` is the caller's ``__file__``."""
    given = sys.argv[1:] if argv is None else argv
    return " ".join([f"python scripts/{Path(script).name}", *given])


# -- arguments -----------------------------------------------------------------------------------------


def doc_prose(doc: str, usage: str) -> str:
    """Return a script docstring's prose for its BENCHMARKS.md section: after the first paragraph, before ``usage``."""
    return doc.split("\n\n", 1)[1].split(usage)[0].strip()


def argument_parser(doc: str, *, full_doc: bool = False) -> argparse.ArgumentParser:
    """Return a parser described by the docstring's first line, or by all of it kept as written (``full_doc``)."""
    if full_doc:
        return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    return argparse.ArgumentParser(description=doc.splitlines()[0])


def add_topologies_argument(parser: argparse.ArgumentParser, *, unset: str | None = None) -> None:
    """Add ``--topologies``: built-in machine names, by default all; with ``unset``, default None meaning ``unset``."""
    if unset is None:
        parser.add_argument(
            "--topologies",
            default=",".join(builtin_topology_names()),
            help="comma-separated built-in names (default: all)",
        )
    else:
        parser.add_argument("--topologies", default=None, help=f"comma-separated built-in names (default: {unset})")


def add_nodes_argument(
    parser: argparse.ArgumentParser, default: str | None, *, what: str = "machine counts", unset: str = ""
) -> None:
    """Add ``--nodes``: comma-separated machine counts; a None ``default`` means ``unset`` (e.g. every library)."""
    shown = f"default {default}" if default is not None else f"default: {unset}"
    parser.add_argument("--nodes", default=default, help=f"comma-separated {what} ({shown})")


def add_collectives_argument(
    parser: argparse.ArgumentParser, default: str = ",".join(COLLECTIVES), *, what: str = "collectives"
) -> None:
    """Add ``--collectives``: comma-separated collective names (default the three of ``COLLECTIVES``)."""
    parser.add_argument("--collectives", default=default, help=f"comma-separated {what} (default {default})")


def add_sizes_argument(parser: argparse.ArgumentParser, default: str, *, what: str = "nccl-tests sizes") -> None:
    """Add ``--sizes``: a list ``1MB,1GB`` or a range ``1KB-1GB`` (``taccl_py.units.parse_sizes``), kept as text."""
    parser.add_argument("--sizes", default=default, help=f"{what} (default {default})")


def add_instances_argument(parser: argparse.ArgumentParser, default: str) -> None:
    """Add ``--instances``: ``topology:nodes`` pairs, comma-separated (:func:`parse_instances`)."""
    parser.add_argument("--instances", default=default, help="topology:nodes, comma-separated")


def add_jobs_argument(parser: argparse.ArgumentParser, default: int | None = 2, *, per: str = "synthesis") -> None:
    """Add ``--jobs``: worker processes per synthesis (None: one per core); the result does not depend on it."""
    shown = "the cores" if default is None else str(default)
    parser.add_argument(
        "--jobs", type=int, default=default, help=f"worker processes per {per} (default: {shown}; same result)"
    )


def add_no_write_argument(parser: argparse.ArgumentParser, kept: str = "BENCHMARKS.md and the CSV") -> None:
    """Add ``--no-write`` for a script that writes ``kept`` unless told not to."""
    parser.add_argument("--no-write", action="store_true", help=f"print only; leave {kept} alone")


def add_write_argument(parser: argparse.ArgumentParser, section: str) -> None:
    """Add ``--write`` for a script that only prints unless told to update ``section`` of BENCHMARKS.md."""
    parser.add_argument("--write", action="store_true", help=f"update the {section} section of BENCHMARKS.md")


def add_csv_argument(parser: argparse.ArgumentParser, default: Path | None, *, rows: str = "the rows") -> None:
    """Add ``--csv``: where the script's CSV ``rows`` go instead of their file under ``scripts/data``."""
    parser.add_argument("--csv", type=Path, default=default, help=f"where {rows} go (default scripts/data)")


def split_names(text: str | None) -> list[str]:
    """Return the non-empty items of a comma-separated argument ([] for None)."""
    return [item for item in (text or "").split(",") if item]


def machine_cases(topologies: str, nodes: str) -> list[tuple[str, int]]:
    """Return every (built-in name, machine count) pair of ``--topologies`` x ``--nodes``, machines outermost."""
    return [(name, int(count)) for name in split_names(topologies) for count in split_names(nodes)]


def parse_instances(text: str) -> list[tuple[str, int]]:
    """Return the (name, machine count) pairs of an ``--instances`` argument such as ``ndv2:2,dgx2:4``."""
    pairs = []
    for item in split_names(text):
        name, _, count = item.partition(":")
        pairs.append((name, int(count)))
    return pairs


# -- tables and ratios ---------------------------------------------------------------------------------


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Return a GitHub markdown table."""
    lines = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Return a plain-text table with right-aligned columns, laid out as the ``taccl`` CLI prints its tables."""
    # the CLI's layout, so scripts and ``taccl`` print alike; imported here as the CLI package is slow to load
    from taccl_py.cli._output import format_table

    return format_table(headers, rows)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, markdown: bool = False) -> str:
    """Print a plain-text (or ``markdown``) table to stdout; return the text printed, for BENCHMARKS.md."""
    table = markdown_table(headers, rows) if markdown else text_table(headers, rows)
    print(table)
    return table


def speedup(baseline_us: float | None, ours_us: float | None) -> float | None:
    """Return a baseline's time over ours (above 1: ours is faster); None where either time is missing or zero."""
    if not baseline_us or not ours_us:
        return None
    return baseline_us / ours_us


def of_bound(bound_us: float, time_us: float | None) -> float | None:
    """Return the fraction of the lower bound a time reaches (bound / time, 1 = optimal); None where none was found."""
    if time_us is None or math.isinf(time_us):
        return None
    return bound_us / time_us


def value_span(values: Sequence[float], digits: int) -> str:
    """Return ``low-high`` of ``values`` at ``digits`` decimals, or one value where both print the same."""
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def format_or_dash(value: float | None, spec: str, suffix: str = "") -> str:
    """Return ``value`` formatted by ``spec`` with ``suffix``, or ``-`` where there is none."""
    return "-" if value is None else f"{value:{spec}}{suffix}"


def group_records(records: Iterable[dict[str, Any]], *columns: str) -> dict[tuple, list[dict[str, Any]]]:
    """Return the records by their values of ``columns``, groups in first-seen order, rows in given order."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(tuple(record[column] for column in columns), []).append(record)
    return groups


def collective_order(collective: str) -> tuple[int, str]:
    """Return a sort key that puts ``collective`` in ``COLLECTIVES`` order (unknown names last, by name)."""
    return (COLLECTIVES.index(collective) if collective in COLLECTIVES else len(COLLECTIVES), collective)


def row_bound_us(row: dict[str, Any], cache: dict[tuple, float]) -> float:
    """Return the lower bound (µs) of a CSV row's ``topology`` x ``nodes``, ``collective`` and ``size_bytes``.

    Computed as the code computes it now, so a table rendered from older CSV rows shows today's bound;
    ``cache`` keeps one per distinct row key.
    """
    from taccl_py.bounds import lower_bound  # only the scripts that render bounds need it
    from taccl_py.topology import load_topology

    key = (row["topology"], row["nodes"], row["collective"], row["size_bytes"])
    if key not in cache:
        cache[key] = lower_bound(load_topology(key[0], key[1]), key[2], key[3]).time_us
    return cache[key]


# -- BENCHMARKS.md and CSV files -----------------------------------------------------------------------


def update_benchmarks_section(
    name: str,
    title: str,
    command: str,
    body: str,
    path: Path = BENCHMARKS_PATH,
    date: str | None = None,
) -> None:
    """Write section ``name`` of BENCHMARKS.md with its title, reproducing command, date (default today) and body."""
    text = path.read_text(encoding="utf-8") if path.exists() else _HEADER
    date = date or datetime.date.today().isoformat()
    section = (
        f"<!-- bench:{name} -->\n## {title}\n\n"
        f"Command: `{command}`  \nDate: {date}\n\n{body.rstrip()}\n<!-- /bench:{name} -->\n"
    )
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->\n?", re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _match: section, text)
    else:
        text = text.rstrip() + "\n\n" + section
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _format_cell(value: Any) -> str:
    """Return one CSV cell: empty for None, floats rounded to ``CSV_DECIMALS`` places without trailing zeros."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = f"{round(value, CSV_DECIMALS):.{CSV_DECIMALS}f}".rstrip("0").rstrip(".")
        return "0" if text in ("", "-0") else text
    return str(value)


_INT_RE = re.compile(r"^-?\d+$")
_FLOAT_RE = re.compile(r"^-?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$")


def _parse_cell(text: str) -> Any:
    """Return a CSV cell as read back: None for empty, int or float where it is a number, else the text."""
    if text == "":
        return None
    if _INT_RE.match(text):
        return int(text)
    if _FLOAT_RE.match(text):
        return float(text)
    return text


def _csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]], key: Callable[[Sequence[Any]], Any] | None) -> str:
    rows = [tuple(row) for row in rows]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"row has {len(row)} cells for {len(header)} columns: {row!r}")
    if key is not None:
        rows.sort(key=key)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([_format_cell(value) for value in row] for row in rows)
    return out.getvalue()


def _records(text: str) -> list[dict[str, Any]]:
    return [{name: _parse_cell(value) for name, value in row.items()} for row in csv.DictReader(io.StringIO(text))]


def write_csv(
    path: Path,
    header: Sequence[str],
    rows: Iterable[Sequence[Any]],
    key: Callable[[Sequence[Any]], Any] | None = None,
) -> list[dict[str, Any]]:
    """Write ``rows`` (one value per ``header`` column) to ``path`` as CSV; return them as :func:`read_csv` reads them.

    Rows keep their given order, or are sorted by ``key`` (stable) so a rerun writes the same file for the
    same numbers; floats are rounded to ``CSV_DECIMALS`` places, None is an empty cell.
    """
    text = _csv_text(header, rows, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return _records(text)


def csv_records(
    header: Sequence[str],
    rows: Iterable[Sequence[Any]],
    key: Callable[[Sequence[Any]], Any] | None = None,
) -> list[dict[str, Any]]:
    """Return ``rows`` exactly as :func:`write_csv` would write and :func:`read_csv` read them back, writing nothing."""
    return _records(_csv_text(header, rows, key))


def csv_output(
    path: Path,
    header: Sequence[str],
    rows: Iterable[Sequence[Any]],
    key: Callable[[Sequence[Any]], Any] | None = None,
    *,
    write: bool,
) -> list[dict[str, Any]]:
    """Return ``rows`` as :func:`read_csv` reads them back, writing them to ``path`` only when ``write`` is true."""
    return write_csv(path, header, rows, key) if write else csv_records(header, rows, key)


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Return the rows of a CSV written by :func:`write_csv`: column -> None, int, float or text."""
    return _records(path.read_text(encoding="utf-8"))


def csv_pointer(path: Path, rows: int, what: str = "Full table") -> str:
    """Return the BENCHMARKS.md line that points at a CSV file (repository-relative link)."""
    relative = path.resolve().relative_to(REPO_ROOT).as_posix()
    return f"{what}: [`{relative}`]({relative}) ({rows} rows)."
