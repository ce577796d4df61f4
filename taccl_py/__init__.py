"""taccl_py: synthesize, verify, simulate, export and run collective-communication algorithms.

The synthesizer imports with networkx, pulp and numpy alone; the runtime (``taccl_py.runtime``)
needs torch and is imported on demand.
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = ["__version__"]

__version__ = "0.1.0"

# Names resolved on first use so that ``import taccl_py`` does not import torch (PEP 562).
_LAZY = MappingProxyType({"Communicator": "taccl_py.runtime.communicator"})


def __getattr__(name: str) -> object:
    """Return a lazily imported public name (``taccl_py.Communicator`` imports torch)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'taccl_py' has no attribute {name!r}")


def __dir__() -> list[str]:
    """Return the module's names including the lazy ones."""
    return sorted(set(globals()) | set(_LAZY))
