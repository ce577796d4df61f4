"""Formatting helpers the CLI modules share."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from taccl_py.simulate.result import FLOAT_TIE

__all__ = [
    "ALGORITHM_FILE_HELP",
    "NVLS_HEADERS",
    "StderrProgress",
    "format_ratio",
    "format_table",
    "nvls_cells",
    "progress_to_stderr",
]

ALGORITHM_FILE_HELP = "algorithm file: taccl JSON or MSCCL-IR XML ('-' for stdin)"
#: The columns AllReduce tables add on machines with NVLink SHARP: NCCL's NVLS time and its time over ours.
NVLS_HEADERS = ("nccl nvls (us)", "vs nvls")
_RATIO_DECIMALS = 2  # decimals of a ratio that is not close to 1
_RATIO_MAX_DECIMALS = 6  # decimals at which a ratio still reading 1 is rounded away from it


def format_ratio(ratio: float) -> str:
    """Return ``ratio`` as ``"1.07x"``, with the decimals it takes to stay on its side of 1.

    A ratio other than 1 never reads ``1.00x``: 433.5 µs against 431.4 µs is ``0.995x``, and a
    ratio within 1e-6 of 1 is rounded away from 1 (``0.999999x``); within ``FLOAT_TIE`` it is a tie.

    >>> format_ratio(1.0704), format_ratio(431.4 / 433.5), format_ratio(1 - 1e-16), format_ratio(1 - 1e-9)
    ('1.07x', '0.995x', '1.00x', '0.999999x')
    """
    if abs(ratio - 1) <= FLOAT_TIE:
        ratio = 1.0
    for decimals in range(_RATIO_DECIMALS, _RATIO_MAX_DECIMALS + 1):
        text = f"{ratio:.{decimals}f}"
        if ratio == 1 or float(text) != 1:
            return f"{text}x"
    scale = 10**_RATIO_MAX_DECIMALS
    away = math.floor(ratio * scale) if ratio < 1 else math.ceil(ratio * scale)
    return f"{away / scale:.{_RATIO_MAX_DECIMALS}f}x"


def nvls_cells(nvls_time_us: float, ours_us: float) -> tuple[str, str]:
    """Return the ``NVLS_HEADERS`` cells: NCCL's NVLS time (µs) and that time over ours (above 1: ours is faster).

    >>> nvls_cells(8.0, 4.0)
    ('8.00', '2.00x')
    """
    return f"{nvls_time_us:.2f}", format_ratio(nvls_time_us / ours_us)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Return a plain-text table with right-aligned columns."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


class StderrProgress:
    """A progress callback that writes each message as one line on stderr, after ``prefix``.

    A class rather than a closure so that it pickles: ``taccl bench`` hands it to the ranks it
    starts, and synthesis workers (``--jobs``) get it to report as they go.
    """

    __slots__ = ("prefix",)

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def __call__(self, message: str) -> None:
        print(f"{self.prefix}{message}", file=sys.stderr, flush=True)

    def __getstate__(self) -> str:
        return self.prefix

    def __setstate__(self, prefix: str) -> None:
        self.prefix = prefix


def progress_to_stderr(prefix: str = "") -> StderrProgress:
    """Return a picklable progress callback that writes each message as one line on stderr."""
    return StderrProgress(prefix)
