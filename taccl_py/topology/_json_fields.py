"""Typed access to the fields of a parsed JSON document, raising ``TopologyError`` naming the file and field."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from taccl_py.errors import TopologyError

__all__ = ["FieldReader", "is_finite", "join_field", "reject_constant"]


class FieldReader:
    """Typed field access that raises ``TopologyError`` naming the file and the field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str | None, fault: str, expected: str) -> TopologyError:
        return TopologyError(self.source, field, fault, expected)

    def check_fields(self, obj: Any, where: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
        if not isinstance(obj, dict):
            raise self.fail(where or None, f"found {type(obj).__name__}", "a JSON object")
        for key in obj:
            if key not in allowed:
                raise self.fail(join_field(where, key), f"unknown field {key!r}", "one of " + ", ".join(allowed))
        return obj

    def required(self, obj: Mapping[str, Any], where: str, key: str) -> Any:
        if key not in obj:
            raise self.fail(join_field(where, key), "missing field", f"a value for {key!r}")
        return obj[key]

    def string(self, value: Any, field: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(field, f"found {value!r}", "a non-empty string")
        return value

    def integer(self, value: Any, field: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(field, f"found {value!r}", f"an integer >= {minimum}")
        return value

    def number(self, value: Any, field: str, what: str, positive: bool) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not is_finite(value):
            raise self.fail(field, f"found {value!r}", "a finite number")
        if positive and not value > 0:
            raise self.fail(field, f"{what} {value} is not positive", "a number > 0")
        if not positive and value < 0:
            raise self.fail(field, f"{what} {value} is negative", "a number >= 0")
        return float(value)

    def enum(self, value: Any, field: str, enum: type, what: str, allowed: tuple = ()) -> Any:
        choices = allowed or tuple(enum)
        for member in choices:
            if value == member.value:
                return member
        raise self.fail(field, f"unknown {what} {value!r}", "one of " + ", ".join(m.value for m in choices))


def join_field(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def is_finite(value: int | float) -> bool:
    """Return True when ``value`` is a finite float or an int a float can hold (json reads 10**400 exactly)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def reject_constant(token: str) -> float:
    raise ValueError(f"{token} is not a JSON number")
