"""Field readers shared by the two sketch file formats; each raises ``SketchError`` naming the field."""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum
from typing import Any

from taccl_py._io import decode_json
from taccl_py.errors import SketchError
from taccl_py.stages.sketch.model import IntranodeStrategy, SwitchPolicy

__all__ = [
    "INTRANODE_KEYS",
    "check_keys",
    "connections_field",
    "enum_field",
    "int_field",
    "int_key",
    "int_list",
    "intranode_field",
    "json_object",
    "node_relays_field",
    "relay_roots_field",
    "symmetry_field",
]

# The keys of an intra-node sketch object, in TACCL's spelling (taccl/cli/common.py parse_and_get_topo) and ours.
INTRANODE_KEYS = ("strategy", "switches", "switch_hyperedge_strategy")


def check_keys(obj: dict[str, Any], allowed: Collection[str], source: str, where: str | None = None) -> None:
    """Raise ``SketchError`` naming the first key of ``obj`` not in ``allowed`` (a misspelt key is never ignored)."""
    for key in obj:
        if key not in allowed:
            field = f"{where}.{key}" if where else key
            raise SketchError(source, field, f"unknown field {key!r}", "one of " + ", ".join(allowed))


def int_field(value: Any, source: str, field: str, minimum: int = 0) -> int:
    """Return ``value`` as an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SketchError(source, field, f"{value!r} is not an integer >= {minimum}", f"an integer >= {minimum}")
    return value


def int_key(value: Any, source: str, field: str) -> int:
    """Return a JSON object key (a string such as ``"0"``) as a local GPU id."""
    try:
        return int_field(int(value), source, field)
    except (TypeError, ValueError):
        raise SketchError(source, field, f"key {value!r} is not a GPU id", 'a local GPU id such as "0"') from None


def int_list(value: Any, source: str, field: str) -> tuple[int, ...]:
    """Return a JSON list of local GPU ids as a tuple."""
    if not isinstance(value, list):
        raise SketchError(source, field, f"{value!r} is not a list", "a list of local GPU ids")
    return tuple(int_field(item, source, f"{field}[{index}]") for index, item in enumerate(value))


def enum_field(kind: type[Enum], value: Any, source: str, field: str) -> Any:
    """Return the member of ``kind`` whose value is ``value``."""
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(repr(member.value) for member in kind)
        raise SketchError(source, field, f"unknown value {value!r}", f"one of {allowed}") from None


def symmetry_field(value: Any, source: str, field: str) -> tuple[tuple[int, int], ...]:
    """Return a list of [offset, group size] rotations as pairs."""
    if not isinstance(value, list):
        raise SketchError(source, field, f"{value!r} is not a list", "a list of [offset, group size] pairs")
    pairs = []
    for index, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise SketchError(source, f"{field}[{index}]", f"{pair!r} is not a pair", "[offset, group size]")
        pairs.append(
            (int_field(pair[0], source, f"{field}[{index}][0]"), int_field(pair[1], source, f"{field}[{index}][1]", 1))
        )
    return tuple(pairs)


def json_object(text: str, source: str) -> dict[str, Any]:
    """Return the JSON object in ``text``."""
    obj = decode_json(text, source, SketchError, "a sketch JSON object")
    if not isinstance(obj, dict):
        raise SketchError(source, None, "not a JSON object", "a sketch JSON object")
    return obj


def connections_field(value: Any, source: str, field: str) -> tuple[tuple[int, int], ...] | str:
    """Return (sender, receiver) pairs from a dict sender -> receivers, or the keyword."""
    if value in ("fully-connected", "direct-map"):
        return value
    if not isinstance(value, dict):
        raise SketchError(
            source, field, f"{value!r}", "a dict sender -> [receivers], 'fully-connected' or 'direct-map'"
        )
    pairs = []
    for key, receivers in value.items():
        sender = int_key(key, source, f"{field}.{key}")
        pairs.extend((sender, receiver) for receiver in int_list(receivers, source, f"{field}.{key}"))
    return tuple(sorted(pairs))


def intranode_field(
    obj: Any, source: str, where: str = "intranode_sketch"
) -> tuple[IntranodeStrategy, tuple[tuple[int, ...], ...], tuple[SwitchPolicy, ...]]:
    """Return (strategy, switch groups, switch policies) of the intra-node sketch object at field ``where``."""
    if obj is None:
        return IntranodeStrategy.AUTO, (), ()
    if not isinstance(obj, dict):
        raise SketchError(source, where, f"{obj!r}", "an object with 'strategy'")
    check_keys(obj, INTRANODE_KEYS, source, where)
    strategy = enum_field(IntranodeStrategy, obj.get("strategy", "none"), source, f"{where}.strategy")
    groups = obj.get("switches", [])
    if not isinstance(groups, list):
        raise SketchError(source, f"{where}.switches", f"{groups!r} is not a list", "a list of local GPU groups")
    switches = tuple(int_list(group, source, f"{where}.switches[{i}]") for i, group in enumerate(groups))
    policies = obj.get("switch_hyperedge_strategy", [])
    if not isinstance(policies, list):
        raise SketchError(source, f"{where}.switch_hyperedge_strategy", f"{policies!r}", "a list of 'uc-min'/'uc-max'")
    policy = tuple(
        enum_field(SwitchPolicy, p, source, f"{where}.switch_hyperedge_strategy[{i}]") for i, p in enumerate(policies)
    )
    if strategy is IntranodeStrategy.SWITCH and not switches:
        raise SketchError(
            source, f"{where}.switches", "strategy 'switch' without switches", "a list of local GPU groups"
        )
    return strategy, switches, policy


def relay_roots_field(value: Any, source: str, field: str) -> tuple[tuple[int, tuple[int, ...]], ...] | None:
    """Return (sender, local GPUs whose chunks it relays) pairs, or None when absent."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SketchError(source, field, f"{value!r}", "a dict sender -> [local GPUs whose chunks it relays]")
    return tuple(
        sorted((int_key(k, source, f"{field}.{k}"), int_list(v, source, f"{field}.{k}")) for k, v in value.items())
    )


def node_relays_field(value: Any, source: str, field: str) -> tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]:
    """Return (src machine, dst machine, (sender, receiver) pairs) per entry of a ``node_relays`` list."""
    if not isinstance(value, list):
        raise SketchError(source, field, f"{value!r} is not a list", "a list of {from, to, conn} objects")
    out = []
    for index, entry in enumerate(value):
        where = f"{field}[{index}]"
        if not isinstance(entry, dict):
            raise SketchError(source, where, f"{entry!r}", "an object with 'from', 'to' and 'conn'")
        check_keys(entry, ("from", "to", "conn"), source, where)
        for key in ("from", "to", "conn"):
            if key not in entry:
                raise SketchError(source, f"{where}.{key}", "missing", "'from', 'to' and 'conn' on every entry")
        pairs = connections_field(entry["conn"], source, f"{where}.conn")
        if isinstance(pairs, str):
            raise SketchError(source, f"{where}.conn", repr(pairs), "a dict sender -> [receivers]")
        src = int_field(entry["from"], source, f"{where}.from")
        out.append((src, int_field(entry["to"], source, f"{where}.to"), pairs))
    return tuple(out)
