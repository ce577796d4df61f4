"""Reading sketch files: TACCL's sketch JSON, and the field readers our own format shares.

TACCL's fields (its README): ``nnodes``; ``intranode_sketch.strategy`` (``switch``, ``none``,
``maxmin``, ``minmax``), ``.switches`` (lists of local GPU ids), ``.switch_hyperedge_strategy``
(``uc-min``/``uc-max``); ``internode_sketch.strategy`` (``relay``), ``.internode_conn`` (dict
local sender -> local receivers, or ``fully-connected``, or ``direct-map``),
``.gpus_to_sender_rev_map`` (sender -> local GPUs whose chunks it relays), ``.enforce_ordering``;
``symmetry_offsets`` (list of [offset, group size] rotations); ``hyperparameters.input_chunkup``.
Every fault raises ``SketchError`` naming the file and the field.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from taccl_py.errors import SketchError
from taccl_py.sketch import IntranodeStrategy, Sketch, SwitchPolicy

__all__ = ["parse_taccl_sketch", "FULLY_CONNECTED", "DIRECT_MAP", "KEYWORD_PAIRS"]


def _int(value: Any, source: str, field: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SketchError(source, field, f"{value!r} is not an integer >= {minimum}", f"an integer >= {minimum}")
    return value


def _int_key(value: Any, source: str, field: str) -> int:
    try:
        return _int(int(value), source, field)
    except (TypeError, ValueError):
        raise SketchError(source, field, f"key {value!r} is not a GPU id", "a local GPU id such as \"0\"") from None


def _int_list(value: Any, source: str, field: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise SketchError(source, field, f"{value!r} is not a list", "a list of local GPU ids")
    return tuple(_int(item, source, f"{field}[{index}]") for index, item in enumerate(value))


def _enum(kind: type[Enum], value: Any, source: str, field: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(repr(member.value) for member in kind)
        raise SketchError(source, field, f"unknown value {value!r}", f"one of {allowed}") from None


def _symmetry(value: Any, source: str, field: str) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list):
        raise SketchError(source, field, f"{value!r} is not a list", "a list of [offset, group size] pairs")
    pairs = []
    for index, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise SketchError(source, f"{field}[{index}]", f"{pair!r} is not a pair", "[offset, group size]")
        pairs.append((_int(pair[0], source, f"{field}[{index}][0]"), _int(pair[1], source, f"{field}[{index}][1]", 1)))
    return tuple(pairs)


def _json_object(text: str, source: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as error:
        raise SketchError(source, f"line {error.lineno}", f"invalid JSON: {error.msg}", "a sketch JSON object") from None
    if not isinstance(obj, dict):
        raise SketchError(source, None, "not a JSON object", "a sketch JSON object")
    return obj


def _connections(value: Any, source: str, field: str, gpus_per_node: int | None) -> tuple[tuple[int, int], ...] | str:
    """Return (sender, receiver) pairs from a dict sender -> receivers, or the keyword."""
    if value in ("fully-connected", "direct-map"):
        return value
    if not isinstance(value, dict):
        raise SketchError(source, field, f"{value!r}", "a dict sender -> [receivers], 'fully-connected' or 'direct-map'")
    pairs = []
    for key, receivers in value.items():
        sender = _int_key(key, source, f"{field}.{key}")
        pairs.extend((sender, receiver) for receiver in _int_list(receivers, source, f"{field}.{key}"))
    return tuple(sorted(pairs))


def _intranode(obj: Any, source: str) -> tuple[IntranodeStrategy, tuple[tuple[int, ...], ...], tuple[SwitchPolicy, ...]]:
    if obj is None:
        return IntranodeStrategy.AUTO, (), ()
    if not isinstance(obj, dict):
        raise SketchError(source, "intranode_sketch", f"{obj!r}", "an object with 'strategy'")
    strategy = _enum(IntranodeStrategy, obj.get("strategy", "none"), source, "intranode_sketch.strategy")
    switches = tuple(_int_list(group, source, f"intranode_sketch.switches[{i}]") for i, group in enumerate(obj.get("switches", [])))
    policies = obj.get("switch_hyperedge_strategy", [])
    if not isinstance(policies, list):
        raise SketchError(source, "intranode_sketch.switch_hyperedge_strategy", f"{policies!r}", "a list of 'uc-min'/'uc-max'")
    policy = tuple(_enum(SwitchPolicy, p, source, f"intranode_sketch.switch_hyperedge_strategy[{i}]") for i, p in enumerate(policies))
    if strategy is IntranodeStrategy.SWITCH and not switches:
        raise SketchError(source, "intranode_sketch.switches", "strategy 'switch' without switches", "a list of local GPU groups")
    return strategy, switches, policy


def _relay_roots(value: Any, source: str, field: str) -> tuple[tuple[int, tuple[int, ...]], ...] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SketchError(source, field, f"{value!r}", "a dict sender -> [local GPUs whose chunks it relays]")
    return tuple(sorted((_int_key(k, source, f"{field}.{k}"), _int_list(v, source, f"{field}.{k}")) for k, v in value.items()))


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
    obj = _json_object(text, source)
    nodes = _int(obj.get("nnodes", 1), source, "nnodes", 1)
    strategy, switches, policies = _intranode(obj.get("intranode_sketch"), source)
    conn: tuple[tuple[int, int], ...] | None = None
    relays = None
    enforce = False
    inter = obj.get("internode_sketch")
    if inter is not None:
        if not isinstance(inter, dict) or inter.get("strategy", "relay") != "relay":
            raise SketchError(source, "internode_sketch.strategy", f"{inter!r}", "'relay'")
        raw = _connections(inter.get("internode_conn", "direct-map"), source, "internode_sketch.internode_conn", None)
        conn = KEYWORD_PAIRS[raw] if isinstance(raw, str) else raw
        relays = _relay_roots(inter.get("gpus_to_sender_rev_map"), source, "internode_sketch.gpus_to_sender_rev_map")
        enforce = bool(inter.get("enforce_ordering", False))
    symmetry = _symmetry(obj.get("symmetry_offsets", []), source, "symmetry_offsets")
    hyper = obj.get("hyperparameters", {})
    chunkup = _int(hyper.get("input_chunkup", 1), source, "hyperparameters.input_chunkup", 1) if isinstance(hyper, dict) else 1
    return Sketch(
        name=source.rsplit("/", 1)[-1].removesuffix(".json"), nodes=nodes, intranode=strategy, switches=switches,
        switch_policies=policies, internode_conn=conn, relay_roots=relays, enforce_ordering=enforce,
        symmetry=symmetry, chunkup=chunkup, source=source,
    )


# Placeholders for the two connection keywords until the GPU count is known (check_sketch).
FULLY_CONNECTED = ((-1, -1),)
DIRECT_MAP = ((-2, -2),)
KEYWORD_PAIRS = {"fully-connected": FULLY_CONNECTED, "direct-map": DIRECT_MAP}
