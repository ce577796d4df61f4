"""Size parsing."""

from __future__ import annotations

import pytest

from taccl_py.errors import ArgumentError
from taccl_py.units import format_size, parse_size, parse_sizes


def test_decimal_and_binary_suffixes():
    assert parse_size("1GB") == 10**9
    assert parse_size("1 GiB") == 2**30
    assert parse_size("512") == 512


def test_ranges_grow_by_four_and_keep_both_ends():
    assert parse_sizes("1KB-1GB")[0] == 1000 and parse_sizes("1KB-1GB")[-1] == 10**9


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "no size given"),
        ("12XB", "cannot read size"),
        ("-4MB", "cannot read size"),
        ("0", "not positive"),
        ("1GB-1KB", "runs backwards"),
    ],
)
def test_bad_sizes(text, match):
    with pytest.raises(ArgumentError, match=match):
        parse_sizes(text)


def test_format_size():
    assert format_size(1_500_000) == "1.5MB"
