"""File helpers the library shares: read with a clear error and a size limit, write atomically.

Every reader of a user's file goes through ``read_text``, which reads at most
``max_input_bytes()`` bytes (256 MiB unless the environment variable ``TACCL_MAX_INPUT_BYTES``
says otherwise) and lets an ``.xz`` or ``.gz`` file expand to no more than that, so neither a
huge file nor a small decompression bomb can exhaust memory.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import os
import sys
import tempfile
from collections.abc import Mapping
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import IO, Any

from taccl_py.errors import ArgumentError, FormatError, InputError
from taccl_py.units import parse_size

__all__ = [
    "DEFAULT_MAX_INPUT_BYTES",
    "MAX_INPUT_BYTES_ENV",
    "XZ_PRESET",
    "decode_json",
    "is_readable_file",
    "max_input_bytes",
    "read_text",
    "write_bytes_atomic",
    "write_text_atomic",
]

# xz level for compressed schedules: 64-rank schedules are megabytes of repetitive JSON, which level 9
# packs to less than half of gzip's size; decompressing stays in the tens of milliseconds.
XZ_PRESET = 9


# Largest input a reader takes, in bytes, both as read and once decompressed: far above any real
# file (the largest shipped schedule, dgx2/n4/allreduce-4.json.xz, is 5.7 MB of JSON decompressed;
# 64-rank schedules run to tens of MB) and far below what a hostile file could claim (a 50 KB xz
# file expands to gigabytes). The environment variable, read at each call, raises or lowers it.
DEFAULT_MAX_INPUT_BYTES = 256 * 2**20
MAX_INPUT_BYTES_ENV = "TACCL_MAX_INPUT_BYTES"
# Read in pieces of this many bytes, so that a high limit reserves no memory up front.
_READ_CHUNK_BYTES = 2**20


def max_input_bytes(environ: Mapping[str, str] | None = None) -> int:
    """Return the input limit in bytes: ``TACCL_MAX_INPUT_BYTES`` of ``environ`` (``os.environ``), else 256 MiB.

    The variable takes a size as ``taccl_py.units.parse_size`` reads it: bytes, ``512M``, ``1G``.

    Raises
    ------
    ArgumentError
        Naming the variable, when its value is not a positive whole number of bytes.

    Examples
    --------
    >>> max_input_bytes({}), max_input_bytes({"TACCL_MAX_INPUT_BYTES": "1G"})
    (268435456, 1073741824)
    """
    raw = (os.environ if environ is None else environ).get(MAX_INPUT_BYTES_ENV, "").strip()
    return parse_size(raw, MAX_INPUT_BYTES_ENV) if raw else DEFAULT_MAX_INPUT_BYTES


def read_text(path: str | Path | Traversable, error: type[InputError] = FormatError) -> str:
    """Return the text of ``path`` (``-`` for stdin; a package resource too); raise ``error`` if unreadable.

    A name ending in ``.xz`` or ``.gz`` is decompressed. At most ``max_input_bytes()`` bytes are
    read, and a compressed file may expand to no more: a larger one raises ``error`` naming the
    limit and ``TACCL_MAX_INPUT_BYTES``, having read no more than one byte past the limit.
    """
    limit = max_input_bytes()
    source = str(path)
    try:
        if source == "-":
            return _read_stdin(limit, source, error)
        resource = Path(path) if isinstance(path, str) else path
        with resource.open("rb") as handle:
            data = _read_at_most(handle, limit)
        if data is None:
            raise _too_large(error, source, "larger than", limit)
        if resource.name.endswith((".xz", ".gz")):
            data = _decompress_at_most(data, resource.name, limit)
            if data is None:
                raise _too_large(error, source, "decompresses to more than", limit)
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile, lzma.LZMAError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise error(source, None, f"cannot read: {reason}", "a readable UTF-8 text file") from None


def _read_stdin(limit: int, source: str, error: type[InputError]) -> str:
    """Return standard input as text, at most ``limit`` bytes (characters, for a stream without bytes)."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is not None:
        data = _read_at_most(buffer, limit)
        if data is None:
            raise _too_large(error, source, "larger than", limit)
        return data.decode("utf-8")
    text = sys.stdin.read(limit + 1)  # a text stream, such as io.StringIO
    if len(text) > limit:
        raise _too_large(error, source, "larger than", limit)
    return text


def _read_at_most(handle: IO[bytes], limit: int) -> bytes | None:
    """Return the rest of ``handle``, or None when it holds more than ``limit`` bytes (reading limit + 1 at most)."""
    chunks = []
    total = 0
    while total <= limit:
        chunk = handle.read(min(_READ_CHUNK_BYTES, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
    return None


def _decompress_at_most(data: bytes, name: str, limit: int) -> bytes | None:
    """Return ``data`` decompressed (xz or gzip by ``name``, concatenated streams too), or None past ``limit`` bytes."""
    raw = io.BytesIO(data)
    stream = lzma.LZMAFile(raw) if name.endswith(".xz") else gzip.GzipFile(fileobj=raw, mode="rb")
    with stream:
        return _read_at_most(stream, limit)


def _too_large(error: type[InputError], source: str, what: str, limit: int) -> InputError:
    raise_it = f"a higher limit in the environment variable {MAX_INPUT_BYTES_ENV} (bytes, or a size like 1G)"
    return error(source, None, f"{what} the input limit of {limit} bytes", f"a smaller file, or {raise_it}")


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

    Raises ArgumentError, writing nothing, when the folder of ``path`` does not exist (a mistyped
    ``-o`` should not leave new folders behind) and when the file cannot be written: ``path`` is a
    directory, its folder takes no new file (permissions, a read-only or virtual file system), the
    disk is full. No temporary file is left behind.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise ArgumentError(str(path), None, f"its folder {path.parent} does not exist", "a path in an existing folder")
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise _unwritable(path, error) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        # mkstemp creates the file 0600; give it the permissions a plain open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise _unwritable(path, error) from None
        raise


def _unwritable(path: Path, error: OSError) -> ArgumentError:
    reason = error.strerror or str(error)
    return ArgumentError(str(path), None, f"cannot write: {reason}", "a file path in a folder you can write to")
