"""File helpers the library shares: read with a clear error, write atomically."""

from __future__ import annotations

import gzip
import os
import sys
import tempfile
from pathlib import Path

from taccl_py.errors import FormatError, InputError

__all__ = ["read_text", "write_text_atomic"]


def read_text(path: str | Path, error: type[InputError] = FormatError) -> str:
    """Return the text of ``path`` (``-`` for stdin); raise ``error`` naming the file if unreadable."""
    if str(path) == "-":
        return sys.stdin.read()
    try:
        if str(path).endswith(".gz"):
            return gzip.decompress(Path(path).read_bytes()).decode("utf-8")
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise error(str(path), None, f"cannot read: {reason}", "a readable UTF-8 text file") from None


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` (``-`` for stdout) through a temporary file and a rename.

    A path ending in ``.gz`` is written gzip-compressed (mtime 0, so the bytes are reproducible).
    """
    if str(path) == "-":
        sys.stdout.write(text)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        data = text.encode("utf-8")
        if path.name.endswith(".gz"):
            data = gzip.compress(data, mtime=0)
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
