"""The exception hierarchy of taccl_py: every user fault is a ``TacclError``.

Messages read ``<source>: <field>: <fault>; expected <what>`` and are built once, here.
The CLI maps any ``TacclError`` to one ``error: ...`` line and exit status 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "TacclError",
    "InputError",
    "TopologyError",
    "SketchError",
    "FormatError",
    "ArgumentError",
    "InfeasibleError",
    "Violation",
    "VerificationError",
    "TransportError",
    "CUDA_INSTALL_HINT",
    "install_hint",
]


def _compose(source: str | None, field: str | None, fault: str, expected: str | None) -> str:
    parts = [p for p in (source, field) if p]
    head = ": ".join(parts + [fault])
    return f"{head}; expected {expected}" if expected else head


def install_hint(*extras: str) -> str:
    """Return how to install any one of ``extras`` (taccl-py's optional dependencies): from PyPI and from a clone.

    A clone is installed editable (``pip install -e``), where ``taccl-py[...]`` would fetch the
    released package instead, so every hint names both.

    >>> install_hint("plot")
    "pip install 'taccl-py[plot]' (from a clone: pip install -e '.[plot]')"
    """
    released = " or ".join(f"'taccl-py[{extra}]'" for extra in extras)
    clone = " or ".join(f"'.[{extra}]'" for extra in extras)
    return f"pip install {released} (from a clone: pip install -e {clone})"


#: CuPy's NCCL transport and the live probe: the extra must match the CUDA torch was built for.
CUDA_INSTALL_HINT = (
    f"{install_hint('cuda13', 'cuda12')}: cuda13 for CUDA 13 (current torch wheels), cuda12 for CUDA 12, "
    "as torch.version.cuda says"
)


class TacclError(Exception):
    """Root of every error taccl_py raises for a fault of its input or environment."""


class InputError(TacclError):
    """A fault in a file or value the user gave; carries where it is.

    Parameters
    ----------
    source : str or None
        The file (or other origin, e.g. ``"<string>"``) holding the fault.
    field : str or None
        The field, element or line inside the source (``"links[3].bandwidth_GBps"``, ``"line 7"``).
    fault : str
        What is wrong, in words.
    expected : str or None
        What would have been right.
    """

    def __init__(
        self,
        source: str | None,
        field: str | None,
        fault: str,
        expected: str | None = None,
    ) -> None:
        self.source = source
        self.field = field
        self.fault = fault
        self.expected = expected
        super().__init__(_compose(source, field, fault, expected))

    def __reduce__(self) -> tuple:
        # Rebuilt from its parts, so it crosses processes (a broadcast, a rank's report) intact.
        return type(self), (self.source, self.field, self.fault, self.expected)


class TopologyError(InputError):
    """A topology description is malformed or inconsistent."""


class SketchError(InputError):
    """A communication sketch is malformed or does not fit its topology."""


class FormatError(InputError):
    """A file (XML, JSON) does not follow its format."""


class ArgumentError(InputError):
    """An argument (size, world size, dtype, shape, option) is out of range."""


class InfeasibleError(TacclError):
    """A model has no solution (e.g. a sketch that forbids every route)."""


@dataclass(frozen=True)
class Violation:
    """One way an algorithm fails its collective, located by rank, step and chunk."""

    kind: str
    message: str
    rank: int | None = None
    threadblock: int | None = None
    step: int | None = None
    chunk: int | None = None

    def __str__(self) -> str:
        where = []
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.threadblock is not None:
            where.append(f"tb {self.threadblock}")
        if self.step is not None:
            where.append(f"step {self.step}")
        if self.chunk is not None:
            where.append(f"chunk {self.chunk}")
        loc = f" ({', '.join(where)})" if where else ""
        return f"{self.kind}{loc}: {self.message}"


class VerificationError(TacclError):
    """An algorithm does not implement its collective; ``violations`` says how."""

    def __init__(self, name: str, violations: Sequence[Violation]) -> None:
        self.name = name
        self.violations = tuple(violations)
        first = str(self.violations[0]) if self.violations else "unknown fault"
        more = f" (+{len(self.violations) - 1} more)" if len(self.violations) > 1 else ""
        super().__init__(f"{name}: incorrect: {first}{more}")


class TransportError(TacclError):
    """A peer failed, timed out or disagreed during a collective."""
