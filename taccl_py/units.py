"""Parse and format sizes in bytes: ``"64MB"`` -> 64_000_000, ``"64M"`` -> 67_108_864, ranges ``"1KB-1GB"``.

Suffixes follow nccl-tests (``-b 64M`` means 64 × 2**20 bytes): ``K``, ``M``, ``G``, ``T`` and
``KiB``, ``MiB``, ``GiB``, ``TiB`` are powers of two; ``KB``, ``MB``, ``GB``, ``TB`` are powers of
ten (1 MB = 10**6 bytes, as in TACCL's µs/MB profiles); ``B`` or no suffix means bytes. Suffixes
are case-insensitive.

Labels (``format_size``) read back exactly: the shortest of ``<n>KiB``/``MiB``/``GiB``/``TiB``,
``<n>KB``/``MB``/``GB``/``TB`` (at most three decimals) and ``<n>B`` that names the size without
rounding, so a binary multiple prints with a binary suffix and a decimal one with a decimal suffix.
"""

from __future__ import annotations

import re
from decimal import Decimal

from taccl_py.errors import ArgumentError

__all__ = [
    "BYTES_PER_US_PER_GBPS",
    "MBPS_PER_GBPS",
    "MAX_SIZE_BYTES",
    "SIZE_SUFFIXES_HELP",
    "parse_size",
    "parse_size_range",
    "parse_sizes",
    "format_size",
    "size_range",
]

#: Bytes a link of 1 GB/s moves in 1 µs: bandwidths are decimal GB/s (1e9 B/s), times are µs.
BYTES_PER_US_PER_GBPS = 1e3
#: Mb/s in 1 GB/s (8 bits, decimal prefixes), the factor NCCL's topology files divide by.
MBPS_PER_GBPS = 8000.0

#: The largest size (bytes) any option or API reads: 1 TiB. One collective's buffer lives in one
#: GPU's memory, and the largest GPUs hold under 300 GB (MI355X, B300: 288 GB), so no real call
#: comes near; it also keeps a size times 1024 ranks below 2**53, where floats stop counting bytes
#: exactly. Beyond it a typo (``1000000TB``) is refused, not simulated slice by slice for minutes.
MAX_SIZE_BYTES = 2**40
#: How the CLI's help texts explain size suffixes.
SIZE_SUFFIXES_HELP = "KB/MB/GB are powers of ten; K/M/G and KiB/MiB/GiB powers of two as in nccl-tests"

# Binary K/M/G/T as nccl-tests' parsesize (src/common.cu: 'K' multiplies by 1024); KB/MB/GB/TB decimal.
_SUFFIX_BYTES = {
    "": 1,
    "B": 1,
    "K": 2**10,
    "KB": 10**3,
    "KIB": 2**10,
    "M": 2**20,
    "MB": 10**6,
    "MIB": 2**20,
    "G": 2**30,
    "GB": 10**9,
    "GIB": 2**30,
    "T": 2**40,
    "TB": 10**12,
    "TIB": 2**40,
}
#: Suffixes labels use, largest first within each family: binary spelled KiB..TiB, decimal KB..TB.
_LABEL_UNITS = (
    ("TiB", 2**40),
    ("GiB", 2**30),
    ("MiB", 2**20),
    ("KiB", 2**10),
    ("TB", 10**12),
    ("GB", 10**9),
    ("MB", 10**6),
    ("KB", 10**3),
)
_LABEL_DECIMALS = 3  # a label's number has at most this many digits after the point
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int, field: str = "size") -> int:
    """Return the number of bytes ``text`` names (``"64MB"``, ``"64M"``, ``"1GiB"``, ``"4096"``).

    ``K``/``M``/``G``/``T`` and ``KiB``..``TiB`` are powers of two (nccl-tests), ``KB``..``TB``
    powers of ten, ``B`` or no suffix bytes.

    Raises
    ------
    ArgumentError
        If ``text`` is not a number with a known suffix, names a fraction of a byte, is not
        positive, or is more than ``MAX_SIZE_BYTES`` (1 TiB).

    >>> parse_size("64MB"), parse_size("64M"), parse_size("1KiB"), parse_size("1.5KB")
    (64000000, 67108864, 1024, 1500)
    """
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(text)
        if not match or match.group(2).upper() not in _SUFFIX_BYTES:
            raise ArgumentError(
                None,
                field,
                f"cannot read size {text!r}",
                "a number with B, KB, MB, GB, TB (powers of ten) or K, M, G, T, KiB, MiB, GiB, TiB (powers of two)",
            )
        exact = Decimal(match.group(1)) * _SUFFIX_BYTES[match.group(2).upper()]
        if exact > MAX_SIZE_BYTES:  # before the whole-byte check, which a 28-digit Decimal would round
            raise _too_large(text, field)
        if exact != exact.to_integral_value():
            raise ArgumentError(None, field, f"size {text!r} is {exact} bytes", "a whole number of bytes")
        value = int(exact)
    if value <= 0:
        raise ArgumentError(None, field, f"size {text!r} is not positive", "a size of at least 1 byte")
    if value > MAX_SIZE_BYTES:
        raise _too_large(text, field)
    return value


def _too_large(text: str | int, field: str) -> ArgumentError:
    limit = format_size(MAX_SIZE_BYTES)
    return ArgumentError(
        None, field, f"size {text!r} is more than {limit}", f"at most {limit} ({MAX_SIZE_BYTES} bytes)"
    )


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
    return size_range(*parse_size_range(text, field), factor)


def parse_size_range(text: str, field: str = "sizes") -> tuple[int, int]:
    """Return the low and high ends (bytes) of a range ``"1KB-1GB"``; one size is both ends.

    Raises
    ------
    ArgumentError
        If an end is not a size (``parse_size``) or the range runs backwards.

    >>> parse_size_range("1KiB-1MiB"), parse_size_range("4KB")
    ((1024, 1048576), (4000, 4000))
    """
    text = text.strip()
    low_text, dash, high_text = text.partition("-")
    if dash and (not low_text.strip() or not high_text.strip()):  # "-5", "1MB-": no range; name what was typed
        parse_size(text, field)
    low = parse_size(low_text, field)
    high = parse_size(high_text, field) if dash else low
    if low > high:
        raise ArgumentError(None, field, f"range {text!r} runs backwards", "LOW-HIGH with LOW <= HIGH")
    return low, high


def format_size(size_bytes: int) -> str:
    """Return ``size_bytes`` as the shortest label that reads back exactly (``"64MB"``, ``"64MiB"``, ``"1000003B"``).

    Candidates are ``<n>B`` and ``<n><unit>`` for each unit no larger than the size whose ``n``
    needs at most three decimals; the shortest wins, then a whole ``n``, then the larger unit. So
    binary multiples print as KiB/MiB/GiB/TiB, decimal ones as KB/MB/GB/TB, anything else in bytes,
    and ``parse_size(format_size(n)) == n`` always.

    >>> format_size(64_000_000), format_size(64 * 2**20), format_size(1024), format_size(1_500_000)
    ('64MB', '64MiB', '1KiB', '1.5MB')
    >>> format_size(65_536_000), format_size(1536), format_size(512), format_size(1_000_003)
    ('65536KB', '1536B', '512B', '1000003B')
    """
    candidates = [(len(str(size_bytes)) + 1, 0, 0, f"{size_bytes}B")]
    for order, (suffix, scale) in enumerate(_LABEL_UNITS):
        number = _exact_number(size_bytes, scale) if size_bytes >= scale else None
        if number is not None:
            label = f"{number}{suffix}"
            candidates.append((len(label), "." in number, order - len(_LABEL_UNITS), label))
    return min(candidates)[3]


def _exact_number(size_bytes: int, scale: int) -> str | None:
    """Return ``size_bytes / scale`` written with at most three decimals, or None if that cannot be exact."""
    thousandths, remainder = divmod(size_bytes * 10**_LABEL_DECIMALS, scale)
    if remainder:
        return None
    whole, fraction = divmod(thousandths, 10**_LABEL_DECIMALS)
    digits = f"{fraction:0{_LABEL_DECIMALS}d}".rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)
