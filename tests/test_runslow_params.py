"""The default run's sweep trim: which parameters go to ``--runslow`` and how conftest applies the list."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import mark_runslow_params

import runslow_params

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from choose_runslow_params import choose_runslow, render  # noqa: E402


def test_a_parameter_moves_only_where_the_rest_still_cover_its_arcs() -> None:
    arcs = {
        "t.py::sweep[a]": {(1, 1, 2), (1, 2, 3)},
        "t.py::sweep[b]": {(1, 1, 2)},
        "t.py::sweep[c]": {(1, 1, 2), (1, 2, 4)},  # the only test to take 2 -> 4
        "t.py::other": {(1, 2, 3)},
        "t.py::lone[x]": {(1, 1, 2)},  # a sweep of one keeps it
    }
    seconds = {"t.py::sweep[a]": 3.0, "t.py::sweep[b]": 2.0, "t.py::sweep[c]": 9.0, "t.py::lone[x]": 5.0}
    assert choose_runslow(arcs, seconds, kept=set()) == ["t.py::sweep[a]", "t.py::sweep[b]"]
    assert choose_runslow(arcs, seconds, kept={"t.py::sweep[a]"}) == ["t.py::sweep[b]"]
    assert choose_runslow(arcs, seconds, kept={"t.py::sweep"}) == []


def test_every_sweep_keeps_a_parameter_even_where_all_cover_the_same() -> None:
    arcs = {f"t.py::sweep[{k}]": {(1, 1, 2)} for k in "abc"}
    seconds = dict.fromkeys(arcs, 1.0)
    assert choose_runslow(arcs, seconds, kept=set()) == ["t.py::sweep[a]", "t.py::sweep[b]"]


def test_the_rendered_list_is_what_conftest_reads() -> None:
    text = render(["t.py::sweep[b]", "t.py::sweep[a]"], {"t.py::sweep[a]": 1.0, "t.py::sweep[b]": 2.0})
    namespace: dict = {}
    exec(text, namespace)
    assert namespace["RUNSLOW_PARAMS"] == {"t.py::sweep": ("a", "b")}


def _item(nodeid: str) -> SimpleNamespace:
    item = SimpleNamespace(nodeid=nodeid, markers=[])
    item.add_marker = item.markers.append
    return item


def test_conftest_marks_the_named_parameters_slow_and_stops_at_a_stale_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("conftest.RUNSLOW_PARAMS", {"t.py::sweep": ("b",), "u.py::elsewhere": ("z",)})
    items = [_item("t.py::sweep[a]"), _item("t.py::sweep[b]")]
    mark_runslow_params(items)  # u.py was not collected: its name is not checked
    assert [[mark.name for mark in item.markers] for item in items] == [[], ["slow"]]
    stale = [_item("t.py::sweep[a]"), _item("t.py::sweep[c]")]
    with pytest.raises(pytest.UsageError, match=r"t.py::sweep\[b\] is no longer collected"):
        mark_runslow_params(stale)
    mark_runslow_params(stale, whole_sweeps=False)  # tests named by node id: the rest of a sweep is not there


def test_the_shipped_list_names_parameters_of_sweeps_only() -> None:
    assert runslow_params.RUNSLOW_PARAMS, "the default run trims nothing"
    for sweep, params in runslow_params.RUNSLOW_PARAMS.items():
        assert "::" in sweep and "[" not in sweep and params
