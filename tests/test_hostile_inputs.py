"""Hostile input files get a result or one ``TacclError``, within seconds and bounded memory.

The cases: XML with a DOCTYPE (entity bombs, external and parameter entities) or nested deeper
than any real document, MSCCL-IR threadblocks of tens of thousands of steps, and files larger than
the input limit before or after decompression (xz and gzip bombs). The hypothesis tests are
derandomized, with modest example counts, so the default run stays fast and a failure reproduces.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taccl_py._io import DEFAULT_MAX_INPUT_BYTES, MAX_INPUT_BYTES_ENV, max_input_bytes, read_text
from taccl_py.cli import main
from taccl_py.errors import ArgumentError, FormatError, TacclError
from taccl_py.ir.algorithm_json import generate_algorithm_json
from taccl_py.ir.collectives import Collective
from taccl_py.msccl import parse_msccl_xml
from taccl_py.runtime.communicator.calibration import read_calibration
from taccl_py.topology.importers import parse_nccl_topology_xml
from taccl_py.verify import verify_algorithm

from helpers import FIXTURES, one_error_line, ring_algorithm

pytestmark = pytest.mark.smoke

ENV = "TACCL_MAX_INPUT_BYTES"
NCCL_SEED = FIXTURES / "topo/azure-ndv2-topo.xml"
MSCCL_SEED = FIXTURES / "msccl/microsoft/allgather_ring_4gpu_1ch_simple.xml"
LONG_STEPS = 20_000  # the threadblock length that took 6 to 12 s to read while each step recounted its siblings
HOSTILE_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- hostile documents --------------------------------------------------------------------------------------


def _billion_laughs(root: str, levels: int = 10) -> str:
    """Return a DOCTYPE whose entity ``lol{levels-1}`` expands to 3 x 10**(levels-1) characters."""
    entities = ['<!ENTITY lol0 "lol">'] + [f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, levels)]
    return f"<!DOCTYPE {root} [\n" + "\n".join(entities) + "\n]>"


def _doctypes(root: str) -> dict[str, str]:
    """Return hostile DOCTYPEs for a document whose root is ``root``, by name."""
    return {
        "billion-laughs": _billion_laughs(root),
        "quadratic-blowup": f'<!DOCTYPE {root} [<!ENTITY a "{"a" * 50_000}">]>',
        "external-entity": f'<!DOCTYPE {root} [<!ENTITY ext SYSTEM "file:///etc/passwd">]>',
        "parameter-entity": f'<!DOCTYPE {root} [<!ENTITY % p SYSTEM "http://127.0.0.1:9/p.dtd"> %p;]>',
        "external-dtd": f'<!DOCTYPE {root} SYSTEM "http://127.0.0.1:9/x.dtd">',
        "bare": f"<!DOCTYPE {root}>",
    }


ENTITY_REFERENCES = ("&lol9;", "&a;", "&ext;", "%p;", "&#0;", "&#x10FFFF;", "&amp;", "&undefined;")


def _with_doctype(doctype: str, document: str) -> str:
    """Return ``document`` with an XML declaration and ``doctype`` in front (the DOCTYPE on line 2)."""
    return '<?xml version="1.0"?>\n' + doctype + "\n" + document


def _step(s: int, op: str = "nop", offset: int = 0, depid: int = -1, deps: int = -1, hasdep: int = 0) -> str:
    return (
        f'<step s="{s}" type="{op}" srcbuf="o" srcoff="{offset}" dstbuf="o" dstoff="{offset}" cnt="1" '
        f'depid="{depid}" deps="{deps}" hasdep="{hasdep}"/>\n'
    )


def _allgather_xml(sender: list[str], receiver: list[str]) -> str:
    """Return a 2-GPU allgather where GPU 0 runs ``sender`` (tb 0, to GPU 1) and ``receiver`` (tb 1, from it)."""

    def tb(tb_id: int, send: int, recv: int, steps: list[str]) -> str:
        return f'<tb id="{tb_id}" send="{send}" recv="{recv}" chan="0">\n{"".join(steps)}</tb>\n'

    gpu0 = tb(0, 1, -1, sender) + tb(1, -1, 1, receiver)
    gpu1 = tb(0, 0, -1, [_step(0, "s", 1)]) + tb(1, -1, 0, [_step(0, "r", 0)])
    gpus = "".join(
        f'<gpu id="{rank}" i_chunks="0" o_chunks="2" s_chunks="0">\n{body}</gpu>\n'
        for rank, body in ((0, gpu0), (1, gpu1))
    )
    head = '<algo name="long" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" inplace="1">'
    return f"{head}\n{gpus}</algo>\n"


def _long_threadblock_xml(steps: int) -> str:
    """Return a correct 2-GPU allgather whose GPU 0 sends its chunk in a threadblock of ``steps`` steps."""
    return _allgather_xml([_step(0, "s", 0)] + [_step(s) for s in range(1, steps)], [_step(0, "r", 1)])


def _xz_bomb(size_bytes: int) -> bytes:
    """Return a small xz file that decompresses to a JSON array of ``size_bytes`` bytes."""
    compressor = lzma.LZMACompressor(preset=1)
    block = b" " * (1 << 20)
    parts = [compressor.compress(b"[")]
    parts += [compressor.compress(block) for _ in range((size_bytes - 2) // len(block))]
    parts += [compressor.compress(b" " * ((size_bytes - 2) % len(block)) + b"]"), compressor.flush()]
    return b"".join(parts)


# -- DOCTYPE: refused before anything in it is read ---------------------------------------------------------


# (reader, root element, seed document, what the error says the file should be) per XML reader
XML_READERS = {
    "msccl": (parse_msccl_xml, "algo", MSCCL_SEED, "an MSCCL-IR XML document"),
    "nccl": (parse_nccl_topology_xml, "system", NCCL_SEED, "an NCCL topology XML document"),
}


@pytest.mark.parametrize(
    ("reader", "kind"), [(reader, kind) for reader in XML_READERS for kind in sorted(_doctypes("root"))]
)
def test_every_xml_reader_refuses_any_doctype(reader: str, kind: str) -> None:
    parse, root, seed, expected = XML_READERS[reader]
    text = _with_doctype(_doctypes(root)[kind], seed.read_text())
    fault = "DOCTYPE declarations are not accepted (entity expansion, external entities)"
    with pytest.raises(
        FormatError, match="^" + re.escape(f"x.xml: line 2: {fault}; expected {expected} without a DOCTYPE") + "$"
    ):
        parse(text, "x.xml")


def test_an_entity_without_a_doctype_is_undefined() -> None:
    text = MSCCL_SEED.read_text().replace('name="allgather_ring_1channelsperring"', 'name="&lol9;"')
    with pytest.raises(FormatError, match=r"^x\.xml: line 1, column \d+: malformed XML: undefined entity"):
        parse_msccl_xml(text, "x.xml")


# -- nesting and long threadblocks ----------------------------------------------------------------------------


def test_nccl_pci_nested_too_deep_is_one_error_not_a_recursion_error() -> None:
    depth = 5000
    opening = "".join(f'<pci busid="{i:04x}:00:00.0" class="0x060400" link_width="16">\n' for i in range(depth))
    text = f'<system version="1">\n<cpu numaid="0">\n{opening}{"</pci>" * depth}\n</cpu>\n</system>\n'
    with pytest.raises(FormatError, match=r"^x\.xml: line 65: elements nested more than 64 deep; expected an NCCL"):
        parse_nccl_topology_xml(text, "x.xml")


def test_msccl_elements_nested_too_deep_are_one_error() -> None:
    text = MSCCL_SEED.read_text().replace("<step ", "<x>" * 100_000 + "<step ", 1)
    with pytest.raises(FormatError, match=r"^x\.xml: line 4: elements nested more than 64 deep; expected an MSCCL"):
        parse_msccl_xml(text, "x.xml")


def test_a_20000_step_threadblock_reads_and_verifies() -> None:
    algorithm = parse_msccl_xml(_long_threadblock_xml(LONG_STEPS), "long.xml")
    assert len(algorithm.ranks[0].threadblocks[0].steps) == LONG_STEPS
    assert verify_algorithm(algorithm).ok


def test_a_fault_at_the_end_of_a_long_threadblock_names_its_step() -> None:
    text = _long_threadblock_xml(LONG_STEPS)
    text = text.replace(f'<step s="{LONG_STEPS - 1}" type="nop"', f'<step s="{LONG_STEPS - 1}" type="xchg"')
    line = LONG_STEPS + 3  # <algo>, <gpu>, <tb>, then one step a line
    where = rf"algo/gpu\[0\]/tb\[0\]/step\[{LONG_STEPS - 1}\]@type \(line {line}\)"
    with pytest.raises(FormatError, match=rf"^long\.xml: {where}: unknown value 'xchg'; expected one of 's'"):
        parse_msccl_xml(text, "long.xml")


def test_many_dependencies_on_a_late_publisher_resolve_in_one_pass() -> None:
    # 20,000 steps wait on tb 0 step 0, which publishes only at its last step: the runtime releases
    # them all there; looking for the publisher once per waiting step would take 4 x 10**8 checks.
    sender = [_step(s) for s in range(LONG_STEPS - 1)] + [_step(LONG_STEPS - 1, "s", 0, hasdep=1)]
    receiver = [_step(0, "r", 1)] + [_step(s, depid=0, deps=0) for s in range(1, LONG_STEPS)]
    algorithm = parse_msccl_xml(_allgather_xml(sender, receiver), "deps.xml")
    waits = {step.depends for step in algorithm.ranks[0].threadblocks[1].steps[1:]}
    assert waits == {((0, LONG_STEPS - 1),)}


# -- the input limit ----------------------------------------------------------------------------------------


def _limit_fault(path: str, what: str, limit: int) -> str:
    expected = f"a smaller file, or a higher limit in the environment variable {ENV} (bytes, or a size like 1G)"
    return "^" + re.escape(f"{path}: {what} the input limit of {limit} bytes; expected {expected}") + "$"


def test_the_limit_is_read_from_the_environment_at_each_call(monkeypatch) -> None:
    assert MAX_INPUT_BYTES_ENV == ENV
    monkeypatch.delenv(ENV, raising=False)
    assert max_input_bytes() == DEFAULT_MAX_INPUT_BYTES == 256 * 2**20
    monkeypatch.setenv(ENV, "1G")
    assert max_input_bytes() == 2**30
    assert max_input_bytes({ENV: "4096"}) == 4096


@pytest.mark.parametrize("value", ["lots", "0", "-5", "1.5"])
def test_a_bad_limit_in_the_environment_is_an_argument_error(tmp_path, monkeypatch, value: str) -> None:
    (tmp_path / "a.json").write_text("{}")
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ArgumentError, match=rf"^{ENV}: .*size '{re.escape(value)}'"):
        read_text(tmp_path / "a.json")


def test_a_file_over_the_limit_is_refused_at_the_limit_plus_one(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(ENV, "1000")
    path = tmp_path / "a.json"
    path.write_bytes(b" " * 1000)
    assert len(read_text(path)) == 1000
    path.write_bytes(b" " * 1001)
    with pytest.raises(FormatError, match=_limit_fault(str(path), "larger than", 1000)):
        read_text(path)


def test_stdin_over_the_limit_is_refused(monkeypatch) -> None:
    monkeypatch.setenv(ENV, "1000")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"x" * 5000), encoding="utf-8"))
    with pytest.raises(FormatError, match=_limit_fault("-", "larger than", 1000)):
        read_text("-")
    monkeypatch.setattr("sys.stdin", io.StringIO("é" * 5000))  # a text stream without a byte buffer
    with pytest.raises(FormatError, match=_limit_fault("-", "larger than", 1000)):
        read_text("-")


@pytest.mark.parametrize("suffix, compress", [(".xz", lzma.compress), (".gz", gzip.compress)], ids=["xz", "gz"])
def test_a_file_that_decompresses_past_the_limit_is_refused(tmp_path, monkeypatch, suffix: str, compress) -> None:
    monkeypatch.setenv(ENV, "1000")
    path = tmp_path / f"a.json{suffix}"
    path.write_bytes(compress(b" " * 1000))
    assert len(read_text(path)) == 1000
    path.write_bytes(compress(b" " * 600) + compress(b" " * 401))  # two concatenated streams
    with pytest.raises(FormatError, match=_limit_fault(str(path), "decompresses to more than", 1000)):
        read_text(path)


def test_the_limit_applies_to_calibration_files_too(tmp_path, monkeypatch) -> None:
    path = tmp_path / "cal.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(FormatError, match=rf"^{re.escape(str(path))}: invalid JSON: arrays or objects nested too"):
        read_calibration(path)
    monkeypatch.setenv(ENV, "1000")
    with pytest.raises(ArgumentError, match=_limit_fault(str(path), "larger than", 1000)):
        read_calibration(path)


# -- the command line ---------------------------------------------------------------------------------------


def test_cli_verifies_a_20000_step_threadblock(tmp_path, capsys) -> None:
    path = tmp_path / "long.xml"
    path.write_text(_long_threadblock_xml(LONG_STEPS))
    assert main(["verify", str(path)]) == 0
    assert capsys.readouterr().out.startswith("ok: long: allgather, 2 ranks")


@pytest.mark.parametrize(
    "command, root, seed",
    [("verify", "algo", MSCCL_SEED), ("topo show", "system", NCCL_SEED)],
    ids=["verify", "topo-show"],
)
def test_cli_refuses_an_entity_bomb_in_one_line(tmp_path, capsys, command: str, root: str, seed: Path) -> None:
    path = tmp_path / "bomb.xml"
    path.write_text(
        _with_doctype(_billion_laughs(root), seed.read_text().replace(f"<{root} ", f'<{root} x="&lol9;" ', 1))
    )
    assert main([*command.split(), str(path)]) == 2
    assert one_error_line(capsys).startswith(f"error: {path}: line 2: DOCTYPE declarations are not accepted")


def test_cli_refuses_a_file_over_the_limit_in_one_line(tmp_path, monkeypatch, capsys) -> None:
    path = tmp_path / "ring.json"
    path.write_text(generate_algorithm_json(ring_algorithm(Collective.ALLREDUCE, 3)))
    monkeypatch.setenv(ENV, "1000")
    assert main(["verify", str(path)]) == 2
    assert re.match(_limit_fault(f"error: {path}", "larger than", 1000), one_error_line(capsys))


def test_cli_refuses_an_xz_bomb_in_one_line(tmp_path, monkeypatch, capsys) -> None:
    path = tmp_path / "bomb.json.xz"
    path.write_bytes(_xz_bomb(4 << 20))
    assert path.stat().st_size < 2000
    monkeypatch.setenv(ENV, "1M")
    assert main(["verify", str(path)]) == 2
    assert re.match(_limit_fault(f"error: {path}", "decompresses to more than", 1 << 20), one_error_line(capsys))


MSCCLPP_SEED = FIXTURES / "mscclpp/allreduce.json"
TOPOLOGY_SEED = Path(__file__).parents[1] / "topologies/ndv2.json"
LIBRARY_SEED = Path(__file__).parents[1] / "algorithms/ndv2/n1/allgather.library.json"


@pytest.mark.parametrize(
    "change, fault",
    [
        ({"collective": "allfoo"}, "collective: unknown value 'allfoo'; expected one of allgather, allreduce"),
        ({"min_message_size": 100, "max_message_size": 10}, "min_message_size: 100 above max_message_size 10"),
        ({"num_threads_per_block": 10**9}, "num_threads_per_block: 1000000000 out of range; expected an integer in"),
        ({"gpus": None}, "gpus: missing; expected a list of per-GPU programs"),
    ],
    ids=["collective", "size-window", "threads", "no-gpus"],
)
def test_cli_refuses_a_faulty_mscclpp_plan_in_one_line(tmp_path, capsys, change: dict, fault: str) -> None:
    document = {**json.loads(MSCCLPP_SEED.read_text()), **change}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({key: value for key, value in document.items() if value is not None}))
    assert main(["verify", str(path)]) == 2
    assert one_error_line(capsys).startswith(f"error: {path}: {fault}")


@pytest.mark.parametrize(
    "command, seed, fault",
    [
        ("topo show", MSCCLPP_SEED, "an algorithm file, not a topology"),
        ("topo show", MSCCL_SEED, "an algorithm file (MSCCL XML), not a topology"),
        ("topo show", LIBRARY_SEED, "an algorithm library file, not a topology"),
        ("verify", TOPOLOGY_SEED, "a topology file, not an algorithm;"),
        ("verify", NCCL_SEED, "a topology file (NCCL XML), not an algorithm;"),
        ("export-msccl", TOPOLOGY_SEED, "a topology file, not an algorithm library;"),
    ],
    ids=["topo-show-plan", "topo-show-xml", "topo-show-library", "verify-json", "verify-xml", "export-msccl"],
)
def test_cli_names_an_algorithm_given_as_a_topology_and_back(tmp_path, capsys, command, seed, fault) -> None:
    path = tmp_path / seed.name  # a copy: the shipped library's bands are not beside it, nor needed
    path.write_text(seed.read_text())
    output = ["-o", str(tmp_path / "out")] if command == "export-msccl" else []
    assert main([*command.split(), str(path), *output]) == 2
    assert one_error_line(capsys).startswith(f"error: {path}: {fault}")
    assert not (tmp_path / "out").exists()


def test_cli_names_a_synthesized_algorithm_given_as_a_topology(tmp_path, capsys) -> None:
    path = tmp_path / "ag.json"
    path.write_text(generate_algorithm_json(ring_algorithm(Collective.ALLGATHER, 3)))
    assert main(["topo", "show", str(path)]) == 2
    assert (
        one_error_line(capsys)
        == f"error: {path}: an algorithm file, not a topology; expected a taccl-topology/1 JSON document"
    )


# -- fuzzing: hostile XML and compressed files --------------------------------------------------------------


def _insert_at_line(data: st.DataObject, text: str, piece: str) -> str:
    lines = text.split("\n")
    at = data.draw(st.integers(0, len(lines)))
    return "\n".join(lines[:at] + [piece] + lines[at:])


def _hostile_xml(data: st.DataObject, text: str, root: str) -> str:
    """Return ``text`` with one or two DOCTYPEs, entity references or deep nestings put in."""
    for _ in range(data.draw(st.integers(1, 2))):
        action = data.draw(st.sampled_from(("doctype", "doctype-first", "reference", "nesting")))
        if action == "doctype":
            text = _insert_at_line(data, text, data.draw(st.sampled_from(sorted(_doctypes(root).values()))))
        elif action == "doctype-first":
            text = _with_doctype(data.draw(st.sampled_from(sorted(_doctypes(root).values()))), text)
        elif action == "reference":
            at = data.draw(st.integers(0, len(text)))
            text = text[:at] + data.draw(st.sampled_from(ENTITY_REFERENCES)) + text[at:]
        else:
            depth = data.draw(st.sampled_from((3, 64, 65, 5000, 5000)))
            opening = "".join(f'<pci busid="{i:04x}:ff:00.0" class="0x060400">' for i in range(depth))
            text = _insert_at_line(data, text, opening + "</pci>" * depth)
    return text


def _read_msccl(text: str) -> None:
    verify_algorithm(parse_msccl_xml(text, "x.xml"))


def _read_nccl(text: str) -> None:
    parse_nccl_topology_xml(text, "x.xml")


@pytest.mark.parametrize(
    "read, root, seed", [(_read_msccl, "algo", MSCCL_SEED), (_read_nccl, "system", NCCL_SEED)], ids=["msccl", "nccl"]
)
@HOSTILE_SETTINGS
@given(data=st.data())
def test_hostile_xml_gives_a_result_or_one_taccl_error(read, root: str, seed: Path, data) -> None:
    text = _hostile_xml(data, seed.read_text(), root)
    try:
        read(text)
    except TacclError:
        pass


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    steps=st.integers(1, 3000),
    published=st.sets(st.integers(0, 2999), max_size=20),
    waits=st.lists(st.integers(-1, 3100), max_size=50),
)
def test_long_threadblocks_with_any_dependencies_give_a_result_or_one_error(steps, published, waits) -> None:
    sender = [_step(0, "s", 0, hasdep=int(0 in published))]
    sender += [_step(s, "cpy" if s in published else "nop", 0, hasdep=int(s in published)) for s in range(1, steps)]
    receiver = [_step(0, "r", 1)] + [_step(s, depid=0, deps=dep) for s, dep in enumerate(waits, 1)]
    try:
        verify_algorithm(parse_msccl_xml(_allgather_xml(sender, receiver), "deps.xml"))
    except TacclError:
        pass


_COMPRESSORS = {".xz": lzma.compress, ".gz": gzip.compress, ".json": bytes}


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    suffix=st.sampled_from(sorted(_COMPRESSORS)),
    size=st.integers(0, 3000),
    streams=st.integers(1, 3),
    cut=st.one_of(st.none(), st.integers(0, 200)),
    tail=st.binary(max_size=8),
)
def test_compressed_files_near_the_limit_give_their_text_or_one_error(
    tmp_path_factory, monkeypatch, suffix, size, streams, cut, tail
) -> None:
    monkeypatch.setenv(ENV, "2000")
    payload = b"x" * size
    raw = b"".join(_COMPRESSORS[suffix](payload) for _ in range(streams))
    raw = (raw[:cut] if cut is not None else raw) + tail
    path = tmp_path_factory.mktemp("limit") / f"a{suffix}"
    path.write_bytes(raw)
    try:
        text = read_text(path)
    except TacclError:
        return
    assert len(text) <= 2000
