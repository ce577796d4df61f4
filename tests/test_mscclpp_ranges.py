"""taccl_py.mscclpp.ranges: a plan's size range set in its text, byte for byte what the JSON round trip writes."""

from __future__ import annotations

import json

import pytest

from taccl_py.ir.collectives import Collective
from taccl_py.mscclpp.files import mscclpp_plan_text
from taccl_py.mscclpp.parse import parse_mscclpp_plan
from taccl_py.mscclpp.ranges import _with_range, served_plans
from taccl_py.mscclpp.sizes import first_accepted_min, refused_sizes

from helpers import ring_algorithm

RANGES = [(0, 0), (128, 4095), (1 << 20, 2**64 - 1)]


def _round_trip(text: str, min_bytes: int, max_bytes: int) -> str:
    """What _with_range did before: parse the whole plan, set the two fields, encode it again."""
    document = json.loads(text)
    document["min_message_size"], document["max_message_size"] = min_bytes, max_bytes
    return json.dumps(document, indent=2) + "\n"


@pytest.fixture(scope="module")
def plan_text() -> str:
    return mscclpp_plan_text(ring_algorithm(Collective.ALLREDUCE, 4), protocol="Simple")


@pytest.mark.parametrize("low, high", RANGES)
def test_an_exported_plans_range_is_set_as_the_round_trip_sets_it(plan_text, low, high) -> None:
    assert plan_text.count('"min_message_size"') == 1  # the field the fast path edits is there to edit
    assert _with_range(plan_text, low, high) == _round_trip(plan_text, low, high)


def test_the_fields_last_or_missing_and_names_that_look_like_them_match_the_round_trip(plan_text) -> None:
    document = json.loads(plan_text)
    # a name holding a field's line, and the fields moved to the front (the last member has no comma)
    document["name"] = 'x\n  "min_message_size": 5,\n'
    document = {"max_message_size": 7, "min_message_size": 3} | document
    for text in (json.dumps(document, indent=2) + "\n", json.dumps(dict(reversed(document.items())), indent=2) + "\n"):
        assert _with_range(text, 64, 128) == _round_trip(text, 64, 128)
    del document["min_message_size"]  # the round trip adds it at the end
    text = json.dumps(document, indent=2) + "\n"
    assert _with_range(text, 64, 128) == _round_trip(text, 64, 128)


@pytest.mark.parametrize("indent", [None, 1, 4])
def test_other_layouts_are_encoded_again(plan_text, indent) -> None:
    text = json.dumps(json.loads(plan_text), indent=indent)
    assert _with_range(text, 256, 512) == _round_trip(text, 256, 512)


def test_text_the_round_trip_would_escape_is_encoded_again(plan_text) -> None:
    text = json.dumps(json.loads(plan_text) | {"name": "ring-é"}, indent=2, ensure_ascii=False) + "\n"
    assert '"ring-\\u00e9"' in _with_range(text, 256, 512) == _round_trip(text, 256, 512)


def test_each_served_plan_is_its_text_parsed(plan_text) -> None:
    # a band from 0: the ring's 16-byte units of 4 chunks serve from 64 bytes, the rest is NCCL's
    (piece,), left = served_plans("ring.json", plan_text, 0, 1 << 20)
    name, text, served = piece
    assert left == () and name == "ring.json" and text == _round_trip(plan_text, 64, (1 << 20) - 1)
    plan = parse_mscclpp_plan(text, name)
    assert (plan.min_message_size, plan.max_message_size) == (served.min_bytes, served.max_bytes) == (64, (1 << 20) - 1)
    assert first_accepted_min(plan) == 64 and refused_sizes(plan) == ()
    assert served.narrowed == "serves from 64 bytes, 0-63 left to NCCL"
