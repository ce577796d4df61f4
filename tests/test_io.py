"""Atomic writes, gzip-compressed files and unreadable inputs."""

from __future__ import annotations

import os

import pytest

from taccl_py._io import read_text, write_text_atomic
from taccl_py.errors import FormatError


def test_write_is_atomic_readable_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "a.json"
    write_text_atomic(path, "héllo\n")
    assert read_text(path) == "héllo\n"
    assert oct(os.stat(path).st_mode & 0o777) != oct(0o600)
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]


def test_gzip_round_trip_is_reproducible(tmp_path):
    first, second = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    write_text_atomic(first, "x" * 1000)
    write_text_atomic(second, "x" * 1000)
    assert first.read_bytes() == second.read_bytes()
    assert len(first.read_bytes()) < 100
    assert read_text(first) == "x" * 1000


def test_corrupt_gzip_and_missing_files_are_format_errors(tmp_path):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(FormatError, match=r"bad\.json\.gz: cannot read"):
        read_text(bad)
    with pytest.raises(FormatError, match="missing.json: cannot read"):
        read_text(tmp_path / "missing.json")
