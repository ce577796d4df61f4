"""The DDP communication hook, re-exported from :mod:`taccl_py.runtime.ddp`.

``import taccl_py.ddp`` costs nothing; torch is imported when a name is first used::

    import taccl_py.ddp
    state = taccl_py.ddp.register(ddp_model, library="ndv2")
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["GRADIENT_DTYPES", "HookState", "allreduce_hook", "register"]

_TARGET = "taccl_py.runtime.ddp"


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(_TARGET), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
