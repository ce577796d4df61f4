"""The communication sketch as data: intra-node strategy, NIC relays, symmetry, chunkup.

The fields' meaning is documented in :mod:`taccl_py.stages.sketch`; both file readers
(this package's ``parse_sketch`` for ours, ``taccl`` for TACCL's) build this one dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

__all__ = [
    "DIRECT_MAP",
    "FULLY_CONNECTED",
    "KEYWORD_PAIRS",
    "IntranodeStrategy",
    "Sketch",
    "SwitchPolicy",
    "rotate_rank",
]

# Placeholders for the two connection keywords until the GPU count is known (check_sketch).
FULLY_CONNECTED = ((-1, -1),)
DIRECT_MAP = ((-2, -2),)
KEYWORD_PAIRS = MappingProxyType({"fully-connected": FULLY_CONNECTED, "direct-map": DIRECT_MAP})


class IntranodeStrategy(str, Enum):
    """How GPUs inside one machine may talk; values are TACCL's spelling (plus ``auto``)."""

    AUTO = "auto"
    NONE = "none"
    SWITCH = "switch"
    MAXMIN = "maxmin"
    MINMAX = "minmax"


class SwitchPolicy(str, Enum):
    """TACCL's switch hyperedge strategies: few (uc-min) or many (uc-max) unique connections."""

    UC_MIN = "uc-min"
    UC_MAX = "uc-max"


@dataclass(frozen=True)
class Sketch:
    """A communication sketch; see the module docstring for the fields' meaning."""

    name: str = "auto"
    nodes: int | None = None
    intranode: IntranodeStrategy = IntranodeStrategy.AUTO
    switches: tuple[tuple[int, ...], ...] = ()
    switch_policies: tuple[SwitchPolicy, ...] = ()
    internode_conn: tuple[tuple[int, int], ...] | None = None
    relay_roots: tuple[tuple[int, tuple[int, ...]], ...] | None = None
    node_relays: tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...] = ()
    symmetry: tuple[tuple[int, int], ...] | None = None
    chunkup: int | None = None
    source: str = "<auto>"


def rotate_rank(rank: int, offset: int, group: int) -> int:
    """Return the image of ``rank`` under the rotation by ``offset`` inside blocks of ``group`` ranks.

    >>> rotate_rank(15, 2, 16), rotate_rank(17, 16, 32)
    (1, 1)
    """
    return group * (rank // group) + (rank + offset) % group
