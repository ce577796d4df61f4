"""Reading TACCL's sketch JSON unchanged into a ``Sketch``.

TACCL's fields (its README): ``nnodes``; ``intranode_sketch.strategy`` (``switch``, ``none``,
``maxmin``, ``minmax``), ``.switches`` (lists of local GPU ids), ``.switch_hyperedge_strategy``
(``uc-min``/``uc-max``); ``internode_sketch.strategy`` (``relay``), ``.internode_conn`` (dict
local sender -> local receivers, or ``fully-connected``, or ``direct-map``),
``.gpus_to_sender_rev_map`` (sender -> local GPUs whose chunks it relays), ``.enforce_ordering``
(always in effect here); ``symmetry_offsets`` (list of [offset, group size] rotations);
``hyperparameters.input_chunkup``. Every fault raises ``SketchError`` naming the file and the field,
a key TACCL does not read too (TACCL ignores one; a misspelt key would silently change the sketch).
"""

from __future__ import annotations

import logging

from taccl_py.errors import SketchError
from taccl_py.stages.sketch.fields import (
    check_keys,
    connections_field,
    int_field,
    intranode_field,
    json_object,
    relay_roots_field,
    symmetry_field,
)
from taccl_py.stages.sketch.model import KEYWORD_PAIRS, Sketch

__all__ = ["TACCL_HYPERPARAMETER_KEYS", "TACCL_INTERNODE_KEYS", "TACCL_SKETCH_KEYS", "parse_taccl_sketch"]

logger = logging.getLogger(__name__)

# Every key TACCL reads (taccl/cli/common.py parse_and_get_topo at microsoft/taccl@426bd1e); any other is refused.
TACCL_SKETCH_KEYS = ("nnodes", "intranode_sketch", "internode_sketch", "symmetry_offsets", "hyperparameters")
TACCL_INTERNODE_KEYS = ("strategy", "internode_conn", "gpus_to_sender_rev_map", "enforce_ordering")
TACCL_HYPERPARAMETER_KEYS = ("input_chunkup",)


def parse_taccl_sketch(text: str, source: str = "<string>") -> Sketch:
    """Return the ``Sketch`` a TACCL sketch JSON describes; raise ``SketchError`` naming the field.

    ``internode_conn`` ``"fully-connected"`` and ``"direct-map"`` need the GPU count and are
    expanded by ``check_sketch``; they are kept as the pairs (-1, -1) / (-2, -2) until then.

    >>> s = parse_taccl_sketch('{"nnodes": 2, "internode_sketch": {"strategy": "relay", '
    ...     '"internode_conn": {"0": [1]}}, "symmetry_offsets": [[8, 16]], '
    ...     '"hyperparameters": {"input_chunkup": 2}}')
    >>> s.nodes, s.internode_conn, s.symmetry, s.chunkup
    (2, ((0, 1),), ((8, 16),), 2)
    """
    obj = json_object(text, source)
    check_keys(obj, TACCL_SKETCH_KEYS, source)
    nodes = int_field(obj.get("nnodes", 1), source, "nnodes", 1)
    strategy, switches, policies = intranode_field(obj.get("intranode_sketch"), source)
    conn: tuple[tuple[int, int], ...] | None = None
    relays = None
    inter = obj.get("internode_sketch")
    if inter is not None:
        if not isinstance(inter, dict):
            raise SketchError(source, "internode_sketch", f"{inter!r}", "an object with 'strategy': 'relay'")
        check_keys(inter, TACCL_INTERNODE_KEYS, source, "internode_sketch")
        if inter.get("strategy", "relay") != "relay":
            raise SketchError(source, "internode_sketch.strategy", f"{inter['strategy']!r}", "'relay'")
        raw = connections_field(inter.get("internode_conn", "direct-map"), source, "internode_sketch.internode_conn")
        conn = KEYWORD_PAIRS[raw] if isinstance(raw, str) else raw
        relays = relay_roots_field(
            inter.get("gpus_to_sender_rev_map"), source, "internode_sketch.gpus_to_sender_rev_map"
        )
        if inter.get("enforce_ordering"):
            # Our orderer always fixes the order of the sends that share a NIC or switch port.
            logger.info("%s: internode_sketch.enforce_ordering is implied; the order is always enforced", source)
    symmetry = symmetry_field(obj.get("symmetry_offsets", []), source, "symmetry_offsets")
    hyper = obj.get("hyperparameters", {})
    if not isinstance(hyper, dict):
        raise SketchError(source, "hyperparameters", f"{hyper!r}", "an object with 'input_chunkup'")
    check_keys(hyper, TACCL_HYPERPARAMETER_KEYS, source, "hyperparameters")
    chunkup = int_field(hyper.get("input_chunkup", 1), source, "hyperparameters.input_chunkup", 1)
    return Sketch(
        name=source.rsplit("/", 1)[-1].removesuffix(".json"),
        nodes=nodes,
        intranode=strategy,
        switches=switches,
        switch_policies=policies,
        internode_conn=conn,
        relay_roots=relays,
        symmetry=symmetry,
        chunkup=chunkup,
        source=source,
    )
