"""taccl_py: synthesize, verify, simulate, export and run collective-communication algorithms.

The synthesizer imports with networkx, pulp and numpy alone; the runtime (``taccl_py.runtime``)
needs torch and is imported on demand.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
