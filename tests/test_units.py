"""Size parsing."""

from __future__ import annotations

import pytest

from taccl_py.errors import ArgumentError
from taccl_py.units import MAX_SIZE_BYTES, format_size, parse_size, parse_size_range, parse_sizes


def test_decimal_and_binary_suffixes():
    assert parse_size("1GB") == 10**9
    assert parse_size("1 GiB") == 2**30
    assert parse_size("512") == 512 and parse_size("512B") == 512


@pytest.mark.parametrize(
    ("text", "size_bytes"),
    [("1K", 2**10), ("64M", 64 * 2**20), ("1G", 2**30), ("1T", 2**40), ("64m", 64 * 2**20), ("1.5K", 1536)],
)
def test_single_letter_suffixes_are_binary_as_in_nccl_tests(text, size_bytes):
    assert parse_size(text) == size_bytes


def test_a_fraction_of_a_byte_is_refused():
    with pytest.raises(ArgumentError, match=r"size '1.5B' is 1.5 bytes; expected a whole number of bytes"):
        parse_size("1.5B")


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


@pytest.mark.parametrize(
    ("size_bytes", "label"),
    [
        (1_500_000, "1.5MB"),
        (2**20, "1MiB"),
        (1024, "1KiB"),
        (64 * 10**6, "64MB"),
        (10**9, "1GB"),
        (2**30, "1GiB"),
        (1_024_000, "1024KB"),  # the 1KB x4 ladder stays exact, not "1.02MB"
        (65_536_000, "65536KB"),  # not "65.5MB"
        (262_144_000, "250MiB"),
        (1536, "1536B"),
        (1_000_003, "1000003B"),
        (999, "999B"),
    ],
)
def test_format_size_prints_exactly_what_was_meant(size_bytes, label):
    assert format_size(size_bytes) == label


def test_labels_read_back_exactly():
    sizes = [*parse_sizes("1KB-1GB"), *parse_sizes("1K-1G"), 1, 3, 1023, 10**12 + 1, MAX_SIZE_BYTES, 123_456_789]
    for size_bytes in sizes:
        assert parse_size(format_size(size_bytes)) == size_bytes


@pytest.mark.parametrize("text", ["-5", "-4MB", "1MB-", "-1KB-2KB"])
def test_a_range_with_an_end_missing_names_the_whole_text(text):
    with pytest.raises(ArgumentError, match=f"^sizes: cannot read size '{text}'; expected a number"):
        parse_sizes(text)


@pytest.mark.parametrize("text", ["99999999999999999999999999GB", "2TB", "1TiB-2TiB", "1KB,1025GiB", "1099511627777"])
def test_sizes_past_one_tebibyte_are_refused_with_the_field_named(text):
    with pytest.raises(ArgumentError, match=r"^--sizes: size '[^']+' is more than 1TiB; expected at most 1TiB"):
        parse_sizes(text, "--sizes")


def test_the_size_limit_itself_is_accepted_from_text_and_from_an_int():
    assert parse_size("1TiB") == parse_size("1T") == MAX_SIZE_BYTES == 2**40
    assert parse_size("1TB") == 10**12
    with pytest.raises(ArgumentError, match=r"^size: size 1099511627777 is more than 1TiB"):
        parse_size(MAX_SIZE_BYTES + 1)


@pytest.mark.parametrize("text", ["1GiB-1KiB", " 4MB-1MB "])
def test_a_backwards_range_reads_the_same_from_every_range_parser(text):
    expected = f"^--x: range '{text.strip()}' runs backwards; expected LOW-HIGH with LOW <= HIGH$"
    with pytest.raises(ArgumentError, match=expected):
        parse_size_range(text, "--x")
    with pytest.raises(ArgumentError, match=expected):
        parse_sizes(text, "--x")


def test_a_range_of_one_size_has_both_ends_there():
    assert parse_size_range("64KiB") == (65536, 65536)
    assert parse_size_range("1KB-1MB") == (1000, 10**6)
