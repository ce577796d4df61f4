"""File helpers the library shares: read with a clear error, write atomically."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import sys
import tempfile
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from taccl_py.errors import ArgumentError, FormatError, InputError

__all__ = ["XZ_PRESET", "decode_json", "is_readable_file", "read_text", "write_bytes_atomic", "write_text_atomic"]

# xz level for compressed schedules: 64-rank schedules are megabytes of repetitive JSON, which level 9
# packs to less than half of gzip's size; decompressing stays in the tens of milliseconds.
XZ_PRESET = 9


def read_text(path: str | Path | Traversable, error: type[InputError] = FormatError) -> str:
    """Return the text of ``path`` (``-`` for stdin; a package resource too); raise ``error`` if unreadable.

    A name ending in ``.xz`` or ``.gz`` is decompressed.
    """
    if str(path) == "-":
        return sys.stdin.read()
    resource = Path(path) if isinstance(path, str) else path
    try:
        data = resource.read_bytes()
        if resource.name.endswith(".xz"):
            data = lzma.decompress(data)
        elif resource.name.endswith(".gz"):
            data = gzip.decompress(data)
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile, lzma.LZMAError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise error(str(path), None, f"cannot read: {reason}", "a readable UTF-8 text file") from None


def is_readable_file(path: Path) -> bool:
    """Return True when ``path`` names a file; False also for a name the file system refuses (too long)."""
    try:
        return path.is_file()
    except OSError:  # a name too long for the file system, say: not a file we can read
        return False


def decode_json(text: str, source: str, error: type[InputError], expected: str) -> Any:
    """Return the JSON value in ``text``; raise ``error`` naming ``source`` and the line when it is not JSON.

    Arrays or objects nested deeper than the interpreter's recursion limit (``[[[[...``) and
    integers longer than Python converts (4300 digits, ``sys.get_int_max_str_digits``) are errors
    too: the json module raises ``RecursionError`` and a plain ``ValueError`` for them.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(source, f"line {exc.lineno}", f"invalid JSON: {exc.msg}", expected) from None
    except ValueError as exc:
        raise error(source, None, f"invalid JSON: {exc}", expected) from None
    except RecursionError:
        raise error(source, None, "invalid JSON: arrays or objects nested too deeply", expected) from None


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` (``-`` for stdout) through a temporary file and a rename.

    A path ending in ``.xz`` is written xz-compressed, one ending in ``.gz`` gzip-compressed (mtime 0);
    both give the same bytes for the same text.
    """
    if str(path) == "-":
        sys.stdout.write(text)
        return
    data = text.encode("utf-8")
    if str(path).endswith(".xz"):
        data = lzma.compress(data, preset=XZ_PRESET)
    elif str(path).endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    write_bytes_atomic(path, data)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary sibling and a rename, with a plain ``open()``'s mode.

    Raises ArgumentError, writing nothing, when the folder of ``path`` does not exist: a mistyped
    ``-o`` should not leave new folders behind.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise ArgumentError(str(path), None, f"its folder {path.parent} does not exist", "a path in an existing folder")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        # mkstemp creates the file 0600; give it the permissions a plain open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
