"""Parse and format sizes in bytes: ``"64MB"`` -> 64_000_000, ranges ``"1KB-1GB"``.

Sizes are decimal (1 MB = 10**6 bytes) as in nccl-tests' tables and TACCL's µs/MB profiles;
binary suffixes (KiB, MiB, GiB) are accepted too.
"""

from __future__ import annotations

import re

from taccl_py.errors import ArgumentError

__all__ = ["BYTES_PER_US_PER_GBPS", "MBPS_PER_GBPS", "parse_size", "parse_sizes", "format_size", "size_range"]

#: Bytes a link of 1 GB/s moves in 1 µs: bandwidths are decimal GB/s (1e9 B/s), times are µs.
BYTES_PER_US_PER_GBPS = 1e3
#: Mb/s in 1 GB/s (8 bits, decimal prefixes), the factor NCCL's topology files divide by.
MBPS_PER_GBPS = 8000.0

_SUFFIX_BYTES = {
    "": 1,
    "B": 1,
    "K": 10**3,
    "KB": 10**3,
    "KIB": 2**10,
    "M": 10**6,
    "MB": 10**6,
    "MIB": 2**20,
    "G": 10**9,
    "GB": 10**9,
    "GIB": 2**30,
    "T": 10**12,
    "TB": 10**12,
    "TIB": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int, field: str = "size") -> int:
    """Return the number of bytes ``text`` names (``"64MB"``, ``"1GiB"``, ``"4096"``).

    >>> parse_size("64MB"), parse_size("1KiB")
    (64000000, 1024)
    """
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(text)
        if not match or match.group(2).upper() not in _SUFFIX_BYTES:
            raise ArgumentError(
                None, field, f"cannot read size {text!r}", "a number with B, KB, MB, GB or KiB, MiB, GiB"
            )
        value = int(float(match.group(1)) * _SUFFIX_BYTES[match.group(2).upper()])
    if value <= 0:
        raise ArgumentError(None, field, f"size {text!r} is not positive", "a size of at least 1 byte")
    return value


def size_range(low_bytes: int, high_bytes: int, factor: int = 4) -> tuple[int, ...]:
    """Return sizes from ``low_bytes`` to ``high_bytes`` growing by ``factor`` (both ends included).

    >>> size_range(1000, 64000)
    (1000, 4000, 16000, 64000)
    """
    sizes = []
    size = low_bytes
    while size < high_bytes:
        sizes.append(size)
        size *= factor
    sizes.append(high_bytes)
    return tuple(sizes)


def parse_sizes(text: str, field: str = "sizes", factor: int = 4) -> tuple[int, ...]:
    """Return the sizes (bytes) a list ``"1KB,1MB"`` or a range ``"1KB-1GB"`` names.

    A range grows by ``factor`` from its low end and always includes its high end.

    >>> parse_sizes("1KB,1MB")
    (1000, 1000000)
    >>> parse_sizes("1MB-16MB")
    (1000000, 4000000, 16000000)
    """
    text = text.strip()
    if "," in text or "-" not in text:
        sizes = tuple(parse_size(part, field) for part in text.split(",") if part.strip())
        if not sizes:
            raise ArgumentError(None, field, "no size given", "sizes like 1KB,1MB or a range 1KB-1GB")
        return sizes
    low_text, _, high_text = text.partition("-")
    low, high = parse_size(low_text, field), parse_size(high_text, field)
    if low > high:
        raise ArgumentError(None, field, f"range {text!r} runs backwards", "LOW-HIGH with LOW <= HIGH")
    return size_range(low, high, factor)


def format_size(size_bytes: int) -> str:
    """Return ``size_bytes`` as a short decimal label (``"64MB"``, ``"1.5KB"``).

    >>> format_size(64_000_000), format_size(1024)
    ('64MB', '1.02KB')
    """
    for suffix, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if size_bytes >= scale:
            value = size_bytes / scale
            return f"{value:.3g}{suffix}"
    return f"{size_bytes}B"
