"""Atomic writes, gzip-compressed files and unreadable inputs."""

from __future__ import annotations

import os
import re

import pytest

from taccl_py._io import decode_json, read_text, write_text_atomic
from taccl_py.errors import ArgumentError, FormatError


def test_write_is_atomic_readable_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "a.json"
    path.parent.mkdir()
    write_text_atomic(path, "héllo\n")
    assert read_text(path) == "héllo\n"
    assert oct(os.stat(path).st_mode & 0o777) != oct(0o600)
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]


def test_a_missing_folder_is_one_error_and_nothing_is_created(tmp_path):
    path = tmp_path / "no" / "such" / "a.json"
    with pytest.raises(ArgumentError, match="its folder .*/no/such does not exist"):
        write_text_atomic(path, "x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suffix", [".gz", ".xz"])
def test_compressed_round_trip_is_reproducible(tmp_path, suffix):
    first, second = tmp_path / f"a.json{suffix}", tmp_path / f"b.json{suffix}"
    write_text_atomic(first, "x" * 1000)
    write_text_atomic(second, "x" * 1000)
    assert first.read_bytes() == second.read_bytes()
    assert len(first.read_bytes()) < 100
    assert read_text(first) == "x" * 1000


@pytest.mark.parametrize("suffix", [".gz", ".xz"])
def test_corrupt_compressed_and_missing_files_are_format_errors(tmp_path, suffix):
    bad = tmp_path / f"bad.json{suffix}"
    bad.write_bytes(b"not compressed")
    with pytest.raises(FormatError, match=rf"bad\.json\{suffix}: cannot read"):
        read_text(bad)
    with pytest.raises(FormatError, match="missing.json: cannot read"):
        read_text(tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("[" * 100_000 + "]" * 100_000, "invalid JSON: arrays or objects nested too deeply"),
        ('{"n": ' + "9" * 5000 + "}", "invalid JSON: Exceeds the limit (4300 digits)"),
    ],
)
def test_json_python_cannot_hold_is_the_callers_error(text, fault):
    with pytest.raises(FormatError, match="^" + re.escape(f"x.json: {fault}")):
        decode_json(text, "x.json", FormatError, "a JSON file")


def test_writing_onto_a_directory_is_one_error_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "d.json"
    target.mkdir()
    with pytest.raises(ArgumentError, match=rf"^{re.escape(str(target))}: cannot write: Is a directory; expected "):
        write_text_atomic(target, "x")
    assert [p.name for p in tmp_path.iterdir()] == ["d.json"] and list(target.iterdir()) == []


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux's /proc as a folder no file goes into")
def test_writing_into_a_folder_that_takes_no_file_is_one_error():
    with pytest.raises(ArgumentError, match=r"^/proc/a\.json: cannot write: "):
        write_text_atomic("/proc/a.json", "x")
