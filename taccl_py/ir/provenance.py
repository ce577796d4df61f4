"""How a synthesized file was made: tool version, solver with its options and budgets, sketch, sizes.

A library records it (``taccl_py.ir.library``), and so does a one-size algorithm file
(``taccl_py.ir.algorithm_json``), in the same JSON object. Nothing in it depends on the clock, so
the same input writes the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from taccl_py.errors import FormatError

__all__ = ["Provenance", "provenance_from_json", "provenance_to_json", "typed_field"]


@dataclass(frozen=True)
class Provenance:
    """How a library or algorithm was made: tool version, solver with its options and budgets, sketch, sizes.

    ``solver_options`` holds the solver's settings as (name, value) pairs: the work budgets
    (``node_limit`` per MILP, ``threads``, ``random_seed``, ``gap_rel``) and ``time_limit_s``, the
    wall-clock safety cap (s) on the synthesis's MILPs (older libraries: their time budget).
    ``sizes`` are the sizes (bytes) synthesized for. ``budget_bound`` names the budget that
    stopped a MILP early (``node limit`` or ``wall-clock cap``; None: none did, or not recorded);
    ``timed_out`` says whether the wall-clock cap bound (then the file may not be reproducible).
    ``note`` explains anything unusual, such as provenance recorded after the fact.
    ``execution_model`` names the simulator's execution model the choice was made under
    (``taccl_py.simulate.model``; None: whole chunks, as older libraries were chosen).
    """

    taccl_py: str
    solver: str
    solver_options: tuple[tuple[str, Any], ...]
    sketch: str
    sizes: tuple[int, ...]
    timed_out: bool | None = None
    source_commit: str | None = None
    command: str | None = None
    note: str | None = None
    budget_bound: str | None = None
    execution_model: str | None = None


def typed_field(obj: dict[str, Any], key: str, kinds: tuple[type, ...], source: str, where: str, expected: str) -> Any:
    """Return ``obj[key]`` (None when absent) if it has one of ``kinds``; booleans pass only as ``bool``."""
    value = obj.get(key)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        fault = f"{value!r}" if key in obj else "missing"
        raise FormatError(source, f"{where}.{key}" if where else key, fault, expected)
    return value


def provenance_from_json(obj: Any, source: str) -> Provenance | None:
    """Return the ``Provenance`` a file's ``provenance`` object holds (None when absent); raise ``FormatError``."""
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise FormatError(source, "provenance", f"{obj!r}", "an object")
    sizes = typed_field(obj, "sizes", (list,), source, "provenance", "a list of sizes in bytes")
    if not all(type(size) is int and size >= 0 for size in sizes):
        raise FormatError(source, "provenance.sizes", f"{sizes!r}", "a list of sizes in bytes")
    text, optional_text = (str,), (str, type(None))

    def field(key: str, kinds: tuple[type, ...], expected: str) -> Any:
        return typed_field(obj, key, kinds, source, "provenance", expected)

    return Provenance(
        taccl_py=field("taccl_py", text, "a version string"),
        solver=field("solver", text, "a string"),
        solver_options=tuple(sorted(field("solver_options", (dict,), "an object").items())),
        sketch=field("sketch", text, "a string"),
        sizes=tuple(sizes),
        timed_out=field("timed_out", (bool, type(None)), "true, false or null"),
        source_commit=field("source_commit", optional_text, "a string or null"),
        command=field("command", optional_text, "a string or null"),
        note=field("note", optional_text, "a string or null"),
        budget_bound=field("budget_bound", optional_text, "a string or null"),
        execution_model=field("execution_model", optional_text, "a model name or null"),
    )


def provenance_to_json(provenance: Provenance) -> dict[str, Any]:
    """Return the JSON object of ``provenance``; fields left None that older files lack are left out."""
    out: dict[str, Any] = {
        "taccl_py": provenance.taccl_py,
        "solver": provenance.solver,
        "solver_options": dict(provenance.solver_options),
        "sketch": provenance.sketch,
        "sizes": list(provenance.sizes),
        "timed_out": provenance.timed_out,
        "budget_bound": provenance.budget_bound,
    }
    for key in ("source_commit", "command", "note", "execution_model"):
        if getattr(provenance, key) is not None:
            out[key] = getattr(provenance, key)
    return out
