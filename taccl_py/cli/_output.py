"""Formatting helpers the CLI modules share."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

__all__ = ["ALGORITHM_FILE_HELP", "format_table", "progress_to_stderr"]

ALGORITHM_FILE_HELP = "algorithm file: taccl JSON or MSCCL-IR XML ('-' for stdin)"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Return a plain-text table with right-aligned columns."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def progress_to_stderr(prefix: str = "") -> Callable[[str], None]:
    """Return a progress callback that writes each message as one line on stderr."""

    def report(message: str) -> None:
        print(f"{prefix}{message}", file=sys.stderr, flush=True)

    return report
