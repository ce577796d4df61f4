"""Every reader, fed mutations of its valid inputs, raises nothing but the project's own ``TacclError``.

Each example applies either raw mutations (truncation; deleted, duplicated, swapped or random bytes;
deleted, duplicated or swapped lines) or ones that mostly keep the syntax, by format: a JSON value
replaced by one of another type (or a huge, negative or non-finite number), a key removed, a list
item doubled, deep nesting, a 5000-digit number; an XML attribute replaced or removed; a text token
replaced. A reader that lets a ``KeyError``, ``TypeError``, ``RecursionError`` or an XML error
escape fails here; the fix belongs in the reader. Examples are derandomized, so a failure
reproduces on every run; raise ``EXAMPLES_PER_READER`` and drop ``derandomize`` to hunt for more.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taccl_py._io import read_text
from taccl_py.cli import main
from taccl_py.errors import TacclError
from taccl_py.files import read_any_algorithm
from taccl_py.ir.algorithm_json import generate_algorithm_json
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary, SizeBand, read_library
from taccl_py.stages.sketch import generate_sketch, read_sketch
from taccl_py.synth.bands import write_library
from taccl_py.topology.cluster import cluster_topology, read_cluster
from taccl_py.topology.importers import parse_nccl_topology_xml, parse_nvidia_smi_topo, parse_taccl_profile
from taccl_py.topology.schema import read_topology
from taccl_py.verify import verify_algorithm

from helpers import FIXTURES, ring_algorithm

EXAMPLES_PER_READER = 60
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES_PER_READER,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Values a JSON field is replaced with: other types, edge and non-finite numbers (json.dumps writes NaN).
JSON_REPLACEMENTS = (
    None,
    True,
    "",
    "x",
    "-1",
    0,
    -1,
    1.5,
    10**30,
    -(10**30),
    10**400,
    1e308,
    float("nan"),
    float("inf"),
    [],
    [1, "a"],
    {},
    {"a": 1},
)
XML_VALUES = ("", "x", "-1", "0", "1.5", "99999999999999999999999", "nan", "inf", "1e999", "-0", " 3", "&amp;")
TEXT_TOKENS = ("X", "NV99", "NV-1", "SYS", "PIX", "nan", "GPU99", "0-999999", "N/A", "-", "\t", "é")
_ATTRIBUTE_RE = re.compile(rb'(\w+)="([^"]*)"')
_TOKEN_RE = re.compile(rb"\S+")
_NUMBER_RE = re.compile(rb"-?\d+")


# -- mutations: each takes the hypothesis data object and bytes, and returns bytes ---------------------


def _truncate(data: st.DataObject, raw: bytes) -> bytes:
    return raw[: data.draw(st.integers(0, len(raw)))]


def _span(data: st.DataObject, raw: bytes) -> tuple[int, int]:
    start = data.draw(st.integers(0, len(raw)))
    return start, min(len(raw), start + data.draw(st.integers(1, 16)))


def _delete_bytes(data: st.DataObject, raw: bytes) -> bytes:
    start, end = _span(data, raw)
    return raw[:start] + raw[end:]


def _duplicate_bytes(data: st.DataObject, raw: bytes) -> bytes:
    start, end = _span(data, raw)
    return raw[:end] + raw[start:end] + raw[end:]


def _swap_bytes(data: st.DataObject, raw: bytes) -> bytes:
    if len(raw) < 2:
        return raw
    i, j = sorted(data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=2, max_size=2, unique=True)))
    return raw[:i] + raw[j : j + 1] + raw[i + 1 : j] + raw[i : i + 1] + raw[j + 1 :]


def _random_bytes(data: st.DataObject, raw: bytes) -> bytes:
    start, end = _span(data, raw)
    return raw[:start] + data.draw(st.binary(min_size=1, max_size=8)) + raw[end:]


def _line_op(data: st.DataObject, raw: bytes) -> bytes:
    lines = raw.split(b"\n")
    i = data.draw(st.integers(0, len(lines) - 1))
    j = data.draw(st.integers(0, len(lines) - 1))
    action = data.draw(st.sampled_from(("delete", "duplicate", "swap")))
    if action == "delete":
        del lines[i]
    elif action == "duplicate":
        lines.insert(j, lines[i])
    else:
        lines[i], lines[j] = lines[j], lines[i]
    return b"\n".join(lines)


def _json_paths(value: Any, path: tuple = ()) -> list[tuple]:
    paths = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            paths += _json_paths(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            paths += _json_paths(item, path + (index,))
    return paths


def _json_op(data: st.DataObject, raw: bytes) -> bytes:
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    paths = _json_paths(document)
    path = data.draw(st.sampled_from(paths[1:] or paths))
    if not path:
        return json.dumps(data.draw(st.sampled_from(JSON_REPLACEMENTS))).encode()
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    action = data.draw(st.sampled_from(("replace", "replace", "remove", "double")))
    if action == "replace":
        parent[last] = data.draw(st.sampled_from(JSON_REPLACEMENTS))
    elif action == "remove":
        del parent[last]
    elif isinstance(parent, list):
        parent.insert(last, parent[last])
    else:
        parent[last] = [parent[last], parent[last]]
    return json.dumps(document, indent=1).encode()


def _json_nest(data: st.DataObject, raw: bytes) -> bytes:
    depth = data.draw(st.sampled_from((50, 100_000)))
    return b"[" * depth + raw + b"]" * depth


def _json_long_number(data: st.DataObject, raw: bytes) -> bytes:
    matches = list(_NUMBER_RE.finditer(raw))
    if not matches:
        return raw
    match = data.draw(st.sampled_from(matches))
    return raw[: match.start()] + b"9" * 5000 + raw[match.end() :]  # beyond Python's 4300-digit int limit


def _xml_attribute(data: st.DataObject, raw: bytes) -> bytes:
    matches = list(_ATTRIBUTE_RE.finditer(raw))
    if not matches:
        return raw
    match = data.draw(st.sampled_from(matches))
    value = data.draw(st.sampled_from(XML_VALUES)).encode()
    return raw[: match.start(2)] + value + raw[match.end(2) :]


def _xml_remove_attribute(data: st.DataObject, raw: bytes) -> bytes:
    matches = list(_ATTRIBUTE_RE.finditer(raw))
    if not matches:
        return raw
    match = data.draw(st.sampled_from(matches))
    return raw[: match.start()] + raw[match.end() :]


def _text_token(data: st.DataObject, raw: bytes) -> bytes:
    matches = list(_TOKEN_RE.finditer(raw))
    if not matches:
        return raw
    match = data.draw(st.sampled_from(matches))
    return raw[: match.start()] + data.draw(st.sampled_from(TEXT_TOKENS)).encode() + raw[match.end() :]


_RAW_OPS = (_truncate, _delete_bytes, _duplicate_bytes, _swap_bytes, _random_bytes, _line_op)
# Mutations that mostly keep the syntax, so the reader gets past its parser to the fields.
_JSON_OPS = (_json_op, _json_op, _json_op, _json_op, _json_op, _json_nest, _json_long_number)
_XML_OPS = (_xml_attribute, _xml_attribute, _xml_remove_attribute, _line_op, _json_long_number)
_TEXT_OPS = (_text_token, _text_token, _line_op)


def _mutant(data: st.DataObject, seeds: list[Path], ops: tuple[Callable, ...]) -> tuple[Path, bytes]:
    """Return a seed and its bytes after one or two raw mutations, or one to three of ``ops``."""
    seed = data.draw(st.sampled_from(seeds))
    raw = seed.read_bytes()
    chosen = (
        data.draw(st.lists(st.sampled_from(ops), min_size=1, max_size=3))
        if data.draw(st.booleans())
        else data.draw(st.lists(st.sampled_from(_RAW_OPS), min_size=1, max_size=2))
    )
    for op in chosen:
        raw = op(data, raw)
    return seed, raw


# -- the readers and their valid inputs --------------------------------------------------------------------


def _import_with(parse: Callable[..., Any]) -> Callable[[Path], Any]:
    return lambda path: parse(read_text(path), str(path))


def _read_and_verify(path: Path) -> None:
    verify_algorithm(read_any_algorithm(path))


@pytest.fixture(scope="module")
def made_inputs(tmp_path_factory) -> Path:
    """Return a folder of valid inputs: an algorithm, a library and our sketch (by our writers), a cluster file."""
    folder = tmp_path_factory.mktemp("made")
    (folder / "ring.json").write_text(generate_algorithm_json(ring_algorithm(Collective.ALLREDUCE, 3)))
    library = AlgorithmLibrary(
        "ring3",
        1,
        Collective.ALLGATHER,
        3,
        (
            SizeBand(0, 1 << 20, ring_algorithm(Collective.ALLGATHER, 3), "x.json"),
            SizeBand(1 << 20, None, None, "native"),
        ),
    )
    write_library(library, folder / "ag.library.json")
    (folder / "ours.sketch.json").write_text(
        generate_sketch(read_sketch(str(FIXTURES / "taccl_sketch/sk1-ndv2-n2.json")))
    )
    cluster = {
        "schema": "taccl-cluster/1",
        "name": "slow-pair",
        "nodes": [
            {"machine": "ndv2"},
            {"machine": "ndv2", "count": 1, "nics_down": [], "nic_speed_GBps": {"nic0": 4.76}},
        ],
        "network": {"alpha_us": 1.0},
    }
    (folder / "pair.cluster.json").write_text(json.dumps(cluster, indent=2))
    return folder


# name -> (seed files: fixtures, or names in made_inputs; mutations; reader of a path)
READERS: dict[str, tuple[list[Path | str], tuple[Callable, ...], Callable[[Path], Any]]] = {
    "topology-json": ([FIXTURES / "cli_topo/pair.json"], _JSON_OPS, read_topology),
    "nvidia-smi": (sorted((FIXTURES / "topo").glob("*.txt")), _TEXT_OPS, _import_with(parse_nvidia_smi_topo)),
    "nccl-xml": (sorted((FIXTURES / "topo").glob("*-topo*.xml")), _XML_OPS, _import_with(parse_nccl_topology_xml)),
    "taccl-profile": (sorted((FIXTURES / "topo").glob("*.json")), _JSON_OPS, _import_with(parse_taccl_profile)),
    "taccl-sketch": (sorted((FIXTURES / "taccl_sketch").glob("sk*.json")), _JSON_OPS, lambda p: read_sketch(str(p))),
    "our-sketch": (["ours.sketch.json"], _JSON_OPS, lambda p: read_sketch(str(p))),
    "msccl-xml": (sorted((FIXTURES / "msccl").glob("*/*.xml")), _XML_OPS, _read_and_verify),
    "algorithm-json": (["ring.json"], _JSON_OPS, _read_and_verify),
    "library-json": (["ag.library.json"], _JSON_OPS, read_library),
    "cluster-json": (["pair.cluster.json"], _JSON_OPS, lambda p: cluster_topology(read_cluster(p))),
}


def _seeds(entry: list[Path | str], made: Path) -> list[Path]:
    return [seed if isinstance(seed, Path) else made / seed for seed in entry]


def test_every_reader_has_seeds(made_inputs) -> None:
    for name, (seeds, _, _) in READERS.items():
        paths = _seeds(seeds, made_inputs)
        assert paths and all(path.is_file() for path in paths), name


@pytest.mark.parametrize("reader", sorted(READERS))
@FUZZ_SETTINGS
@given(data=st.data())
def test_mutated_input_raises_only_taccl_errors(reader, made_inputs, data) -> None:
    seeds, ops, read = READERS[reader]
    seed, raw = _mutant(data, _seeds(seeds, made_inputs), ops)
    # Beside the seed, so a library's band files resolve, and with its name, so the format is the seed's.
    target = seed.parent / f"mutant-{seed.name}" if seed.parent == made_inputs else made_inputs / seed.name
    target.write_bytes(raw)
    try:
        read(target)
    except TacclError:
        pass


# -- the command line: one error line and exit status 2, never a traceback --------------------------------

CLI_CASES = (
    ("verify", FIXTURES / "msccl/microsoft/allgather_ring_4gpu_1ch_simple.xml", _XML_OPS),
    ("verify", FIXTURES / "msccl/azure/reducescatter_allpairs_4gpu_ll.xml", _XML_OPS),
    ("topo show", FIXTURES / "cli_topo/pair.json", _JSON_OPS),
    ("topo show", FIXTURES / "topo/v100-sxm2-8gpu-dgx1-style.txt", _TEXT_OPS),
    ("topo import", FIXTURES / "topo/azure-ndv2-topo.xml", _XML_OPS),
    ("topo import", FIXTURES / "topo/topo-ndv2-1MB.json", _JSON_OPS),
)


@pytest.mark.parametrize("command, seed, ops", CLI_CASES, ids=[f"{c}-{s.name}" for c, s, _ in CLI_CASES])
@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_cli_on_mutated_files_prints_one_error_line(command, seed, ops, data, tmp_path_factory, capsys) -> None:
    _, raw = _mutant(data, [seed], ops)
    folder = tmp_path_factory.mktemp("cli")
    target = folder / seed.name
    target.write_bytes(raw)
    extra = ["-o", str(folder / "out.json")] if command == "topo import" else []
    capsys.readouterr()
    status = main([*command.split(), str(target), *extra])
    out, err = capsys.readouterr()
    if status == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        assert not (folder / "out.json").exists()
    else:
        assert status in (0, 1) and "Traceback" not in err, err
