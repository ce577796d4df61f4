"""Read and write algorithms in either file format: taccl JSON or MSCCL-IR XML; read MSCCL++ plans too.

Readers take the format a file's name gives (``.json``, ``.xml``, either one ``.xz``- or
``.gz``-compressed), so a bad ``.xml`` file is reported as bad XML; a name without either
extension, and ``-`` (stdin), are told apart by content (XML starts with ``<``).

Writers pick the format by extension (``.json``, ``.xml``; ``-`` writes JSON to stdout, or XML
when a dialect is given), verify the algorithm first and write atomically, so nothing is written
for an incorrect algorithm.

JSON text that is an MSCCL++ execution plan (``looks_like_mscclpp_plan``) is verified with
MSCCL++'s semantics, lifted into our IR (``taccl_py.mscclpp.lift``) and verified again.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from taccl_py._io import read_text, write_text_atomic
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.algorithm_json import generate_algorithm_json, parse_algorithm_json
from taccl_py.ir.provenance import Provenance
from taccl_py.msccl import Dialect, generate_msccl_xml, looks_like_msccl_xml, parse_msccl_xml
from taccl_py.msccl.limits import DEFAULT_RUNTIME, Runtime
from taccl_py.mscclpp.lift import lift_mscclpp_plan
from taccl_py.mscclpp.parse import looks_like_mscclpp_plan, parse_mscclpp_plan
from taccl_py.mscclpp.replay import verify_mscclpp_plan
from taccl_py.verify import check_algorithm

__all__ = [
    "parse_any_algorithm",
    "read_any_algorithm",
    "generate_any_algorithm",
    "write_any_algorithm",
    "algorithm_format",
]

_FORMATS = MappingProxyType({".json": "json", ".xml": "xml"})
_COMPRESSED = frozenset({".xz", ".gz"})  # the endings read_text decompresses


def parse_any_algorithm(text: str, source: str = "<string>", fmt: str | None = None) -> Algorithm:
    """Return the Algorithm in ``text``: MSCCL-IR XML or taccl JSON as ``fmt`` says, or by its content when None.

    JSON holding an MSCCL++ plan is verified, lifted and verified again (``VerificationError`` when
    either check fails, ``FormatError`` for a plan our IR cannot express).
    """
    if fmt is None:
        fmt = "xml" if looks_like_msccl_xml(text) else "json"
    if fmt == "xml":
        return parse_msccl_xml(text, source)
    if looks_like_mscclpp_plan(text):
        plan = parse_mscclpp_plan(text, source)
        verify_mscclpp_plan(plan)
        return check_algorithm(lift_mscclpp_plan(plan))
    return parse_algorithm_json(text, source)


def _input_format(path: str | Path) -> str | None:
    """Return the format the name of ``path`` gives (``a.xml``, ``a.json.xz``), or None for another name."""
    if str(path) == "-":
        return None
    suffixes = [suffix.lower() for suffix in Path(path).suffixes]
    if suffixes and suffixes[-1] in _COMPRESSED:
        suffixes.pop()
    return _FORMATS.get(suffixes[-1]) if suffixes else None


def read_any_algorithm(path: str | Path) -> Algorithm:
    """Return the Algorithm in the file at ``path`` (``-`` for stdin), JSON, XML or an MSCCL++ plan.

    A ``*.xml`` file is read as MSCCL-IR XML and a ``*.json`` file as taccl JSON or, when it holds
    one, an MSCCL++ plan (lifted; see ``parse_any_algorithm``); each may end in ``.xz`` or ``.gz``.
    Any other name, and stdin, by its content.

    Raises
    ------
    FormatError
        When the file cannot be read or does not follow its format (the message names the field
        or element at fault), or an MSCCL++ plan holds ops our IR cannot express.
    VerificationError
        When an MSCCL++ plan, or the algorithm lifted from it, is incorrect.
    """
    return parse_any_algorithm(read_text(path), str(path), _input_format(path))


def algorithm_format(path: str | Path, dialect: Dialect | str | None = None) -> str:
    """Return ``"json"`` or ``"xml"`` for an output ``path``; raise ``ArgumentError`` otherwise.

    >>> algorithm_format("ring.xml"), algorithm_format("-"), algorithm_format("-", "old")
    ('xml', 'json', 'xml')
    """
    if str(path) == "-":
        return "json" if dialect is None else "xml"
    suffix = Path(path).suffix.lower()
    if suffix not in _FORMATS:
        raise ArgumentError(
            str(path), "extension", f"{suffix or 'no extension'!r}", "'.json' (taccl) or '.xml' (MSCCL-IR)"
        )
    if _FORMATS[suffix] == "json" and dialect is not None:
        raise ArgumentError(
            str(path), "dialect", f"dialect {dialect!s} given for a JSON file", "a dialect only with an .xml output"
        )
    return _FORMATS[suffix]


def generate_any_algorithm(
    algorithm: Algorithm,
    fmt: str,
    dialect: Dialect | str | None = None,
    *,
    runtime: Runtime | str = DEFAULT_RUNTIME,
    provenance: Provenance | None = None,
) -> str:
    """Return the text of ``algorithm`` in ``fmt`` (``"json"`` or ``"xml"``, within ``runtime``'s limits) unverified.

    ``provenance`` goes into JSON only: MSCCL-IR XML has no place for it.
    """
    if fmt == "xml":
        return generate_msccl_xml(algorithm, dialect if dialect is not None else Dialect.NEW, runtime=runtime)
    return generate_algorithm_json(algorithm, provenance)


def write_any_algorithm(
    algorithm: Algorithm,
    path: str | Path,
    dialect: Dialect | str | None = None,
    *,
    verify: bool = True,
    runtime: Runtime | str = DEFAULT_RUNTIME,
    provenance: Provenance | None = None,
) -> None:
    """Verify ``algorithm`` and write it to ``path`` in the format its extension names.

    Parameters
    ----------
    algorithm : Algorithm
        What to write; with ``verify`` (the default) it must pass ``check_algorithm``.
    path : str or Path
        ``*.json`` for taccl JSON, ``*.xml`` for MSCCL-IR XML, ``-`` for stdout.
    dialect : {"new", "old"} or None
        XML dialect (default ``new``); an error for JSON.
    runtime : {"portable", "msccl-executor-nccl", "msccl", "rccl"}
        XML only: the MSCCL runtime whose limits the file must meet (default ``portable``, all of them).
    provenance : Provenance or None
        JSON only: how the algorithm was made, recorded in the file (``parse_algorithm_provenance``).

    Raises
    ------
    VerificationError
        When the algorithm is incorrect (nothing is written).
    ArgumentError
        For an unknown extension, a dialect with JSON, or an MSCCL runtime limit.
    """
    fmt = algorithm_format(path, dialect)
    if verify:
        check_algorithm(algorithm)
    write_text_atomic(path, generate_any_algorithm(algorithm, fmt, dialect, runtime=runtime, provenance=provenance))
