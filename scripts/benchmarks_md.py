"""Replace one named section of BENCHMARKS.md, leaving the others as they are; write the raw tables as CSV.

Each benchmark script owns the text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``.
Long raw tables go to CSV files under ``scripts/data/`` (:func:`write_csv`); the section keeps a short
summary computed from the same rows (:func:`csv_records`, or :func:`read_csv` on the written file)
and a line pointing at the file (:func:`csv_pointer`).
"""

from __future__ import annotations

import csv
import datetime
import io
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BENCHMARKS_PATH",
    "DATA_DIR",
    "csv_pointer",
    "csv_records",
    "markdown_table",
    "read_csv",
    "update_benchmarks_section",
    "write_csv",
    "COLLECTIVES",
    "collective_order",
    "row_bound_us",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_PATH = REPO_ROOT / "BENCHMARKS.md"
DATA_DIR = REPO_ROOT / "scripts" / "data"
_HEADER = "# Benchmarks\n\nEach section is written by the script it names; rerun that command to refresh it.\n"
#: Decimal places a float keeps in a CSV cell (µs times and fractions of the bound).
CSV_DECIMALS = 4


#: The collectives the tables cover, in the order their rows are written.
COLLECTIVES = ("allgather", "reducescatter", "allreduce")


def collective_order(collective: str) -> tuple[int, str]:
    """Return a sort key that puts ``collective`` in ``COLLECTIVES`` order (unknown names last, by name)."""
    return (COLLECTIVES.index(collective) if collective in COLLECTIVES else len(COLLECTIVES), collective)


def row_bound_us(row: dict[str, Any], cache: dict[tuple, float]) -> float:
    """Return the lower bound (µs) of a CSV row's ``topology`` x ``nodes``, ``collective`` and ``size_bytes``.

    Computed as the code computes it now, so a table rendered from older CSV rows shows today's bound;
    ``cache`` keeps one per distinct row key.
    """
    from taccl_py.topology import load_topology, lower_bound  # only the scripts that render bounds need it

    key = (row["topology"], row["nodes"], row["collective"], row["size_bytes"])
    if key not in cache:
        cache[key] = lower_bound(load_topology(key[0], key[1]), key[2], key[3]).time_us
    return cache[key]


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


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Return the rows of a CSV written by :func:`write_csv`: column -> None, int, float or text."""
    return _records(path.read_text(encoding="utf-8"))


def csv_pointer(path: Path, rows: int, what: str = "Full table") -> str:
    """Return the BENCHMARKS.md line that points at a CSV file (repository-relative link)."""
    relative = path.resolve().relative_to(REPO_ROOT).as_posix()
    return f"{what}: [`{relative}`]({relative}) ({rows} rows)."


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Return a GitHub markdown table."""
    lines = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
