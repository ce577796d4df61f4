"""Read MSCCL-IR XML (either dialect) into an Algorithm, naming the element and line of any fault.

The document is read with expat into a small tree that remembers each element's line, in time
linear in its length; a DOCTYPE (entity bombs, external entities) or elements nested deeper than
``taccl_py._xml.MAX_XML_DEPTH`` are refused (``taccl_py._xml.create_xml_parser``). Step
types, buffers, collectives (both spellings) and protocols must be known values; integers must
be integers; threadblock peers must be other GPUs; ``s`` must count the steps of a threadblock
from 0. Of a step's two buffer slots only those its type uses (``STEP_OPERANDS``) enter the IR;
the other names the peer's side (msccl-tools, RCCL, our exports) or repeats the step's own
operand (older taccl_py exports), is read in either style and is checked by
``taccl_py.msccl.convention``.

A dependency (``depid``, ``deps``) is honoured as the runtime does: the waiting threadblock
resumes when the named threadblock publishes a step at or after ``deps``, and only steps marked
``hasdep="1"`` publish. The IR therefore records the first such step; a dependency no step can
satisfy would hang the runtime and is a ``FormatError``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from xml.parsers import expat

from taccl_py._io import read_text
from taccl_py._xml import create_xml_parser
from taccl_py.errors import ArgumentError, FormatError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective, chunk_layout
from taccl_py.msccl.dialect import COLLECTIVE_SPELLINGS, NO_DEPENDENCY, NO_PEER, STEP_OPERANDS, Protocol
from taccl_py.msccl.export import BOTH_PLACES_KEY, METADATA_COMMENT
from taccl_py.msccl.selection import SelectionKey

__all__ = ["parse_msccl_xml", "read_msccl_xml", "looks_like_msccl_xml", "parse_msccl_selection_key"]

logger = logging.getLogger(__name__)

_EXPECTED = "an MSCCL-IR XML document"  # what a file should be, for the errors the parser raises
# The values of each enumerated attribute by their on-disk spelling, built once: building the table
# for every step cost more than the rest of the step's parsing.
_OP_TYPES: Mapping[str, OpType] = MappingProxyType({op.value: op for op in OpType})
_BUFFERS: Mapping[str, Buffer] = MappingProxyType({buffer.value: buffer for buffer in Buffer})
_PROTOCOLS: Mapping[str, Protocol] = MappingProxyType({protocol.value: protocol for protocol in Protocol})


@dataclass(eq=False, slots=True)
class _Node:
    """One element: tag, attributes, line, the element it is in and the ones in it, in document order."""

    tag: str
    attrs: dict[str, str]
    line: int
    parent: _Node | None = field(default=None, repr=False)
    children: list[_Node] = field(default_factory=list, repr=False)

    @property
    def path(self) -> str:
        """Return the element's path, ``algo/gpu[0]/tb[1]/step[3]``: built on demand, for messages only."""
        parts = []
        node = self
        while node.parent is not None:
            parts.append(f"{node.tag}[{node.key}]")
            node = node.parent
        return "/".join([node.tag, *reversed(parts)])

    @property
    def key(self) -> str:
        """Return the element's ``id`` or ``s``, else its index among its parent's like-named children.

        The index is counted when asked for, in time linear in the siblings, so that building the
        tree stays linear in the document (counting siblings at each element made it quadratic).
        """
        if "id" in self.attrs or "s" in self.attrs:
            return self.attrs.get("id", self.attrs.get("s"))
        index = 0
        for sibling in self.parent.children if self.parent is not None else ():
            if sibling is self:
                break
            index += sibling.tag == self.tag
        return str(index)


@dataclass
class _Doc:
    source: str
    root: _Node | None = None
    comments: list[str] = field(default_factory=list)


def looks_like_msccl_xml(text: str) -> bool:
    """Return True when ``text`` starts (after comments and blanks) like an XML document."""
    return text.lstrip().startswith("<")


class _TreeBuilder:
    """Collect expat events into a ``_Doc``, in time linear in the document's length."""

    __slots__ = ("doc", "parser", "stack")

    def __init__(self, source: str) -> None:
        self.doc = _Doc(source)
        self.parser = create_xml_parser(source, _EXPECTED, self.start, self.end)
        self.parser.CommentHandler = self.doc.comments.append
        self.stack: list[_Node] = []

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        parent = self.stack[-1] if self.stack else None
        node = _Node(tag, attrs, self.parser.CurrentLineNumber, parent)
        if parent is None:
            self.doc.root = node
        else:
            parent.children.append(node)
        self.stack.append(node)

    def end(self, tag: str) -> None:
        self.stack.pop()


def _malformed(source: str, error: expat.ExpatError) -> FormatError:
    """Return the one-line fault of XML that expat could not parse, at its line and column."""
    return FormatError(
        source,
        f"line {error.lineno}, column {error.offset + 1}",
        f"malformed XML: {expat.ErrorString(error.code)}",
        "a well-formed MSCCL-IR XML document",
    )


def _build_tree(text: str, source: str) -> _Doc:
    builder = _TreeBuilder(source)
    try:
        builder.parser.Parse(text, True)
    except expat.ExpatError as error:
        raise _malformed(source, error) from None
    if builder.doc.root is None:
        raise FormatError(source, "line 1", "no element", "an <algo> element")
    return builder.doc


def _where(node: _Node, attr: str | None = None) -> str:
    return f"{node.path}{'@' + attr if attr else ''} (line {node.line})"


def _raw(doc: _Doc, node: _Node, attr: str) -> str:
    if attr not in node.attrs:
        raise FormatError(doc.source, _where(node, attr), "missing attribute", f'{attr}="..." on <{node.tag}>')
    return node.attrs[attr]


def _int(
    doc: _Doc, node: _Node, attr: str, low: int | None = None, high: int | None = None, default: int | None = None
) -> int:
    if default is not None and attr not in node.attrs:
        return default
    text = _raw(doc, node, attr)
    try:
        value = int(text)
    except ValueError:
        raise FormatError(doc.source, _where(node, attr), f"{text!r} is not an integer", "a decimal integer") from None
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"{low if low is not None else '-inf'}..{high if high is not None else 'inf'}"
        raise FormatError(doc.source, _where(node, attr), f"{value} out of range", f"an integer in {bounds}")
    return value


def _choice(doc: _Doc, node: _Node, attr: str, table: Mapping[str, Any]) -> Any:
    text = _raw(doc, node, attr)
    if text not in table:
        raise FormatError(
            doc.source, _where(node, attr), f"unknown value {text!r}", "one of " + ", ".join(repr(k) for k in table)
        )
    return table[text]


def _children(doc: _Doc, node: _Node, tag: str) -> list[_Node]:
    for child in node.children:
        if child.tag != tag:
            raise FormatError(
                doc.source, _where(child), f"unexpected element <{child.tag}>", f"<{tag}> inside <{node.tag}>"
            )
    return node.children


@dataclass(frozen=True)
class _RawStep:
    node: _Node
    step: Step
    dep: tuple[int, int] | None
    hasdep: bool


def _parse_step(doc: _Doc, node: _Node, position: int) -> _RawStep:
    index = _int(doc, node, "s")
    if index != position:
        raise FormatError(
            doc.source,
            _where(node, "s"),
            f"step index {index} at position {position}",
            "steps numbered 0, 1, 2, ... in order",
        )
    op = _choice(doc, node, "type", _OP_TYPES)
    src = (_choice(doc, node, "srcbuf", _BUFFERS), _int(doc, node, "srcoff"))
    dst = (_choice(doc, node, "dstbuf", _BUFFERS), _int(doc, node, "dstoff"))
    count = _int(doc, node, "cnt", low=0)
    depid, deps = _int(doc, node, "depid", low=-1), _int(doc, node, "deps", low=-1)
    hasdep = bool(_int(doc, node, "hasdep", low=0, high=1))
    uses_src, uses_dst = STEP_OPERANDS[op]
    step = Step(
        op,
        src[0] if uses_src else None,
        src[1] if uses_src else 0,
        dst[0] if uses_dst else None,
        dst[1] if uses_dst else 0,
        count,
    )
    dep = (depid, deps) if depid != NO_DEPENDENCY else None
    if dep is not None and deps == NO_DEPENDENCY:
        raise FormatError(
            doc.source, _where(node, "deps"), f"depid={depid} without a step", "deps naming a step of that threadblock"
        )
    return _RawStep(node, step, dep, hasdep)


def _parse_threadblock(
    doc: _Doc, node: _Node, rank: int, num_ranks: int, num_channels: int
) -> tuple[Threadblock, list[_RawStep]]:
    tb_id = _int(doc, node, "id", low=0)
    peers = []
    for attr in ("send", "recv"):
        peer = _int(doc, node, attr, low=NO_PEER, high=num_ranks - 1)
        if peer == rank:
            raise FormatError(doc.source, _where(node, attr), f"peer {peer} is the GPU itself", "another GPU or -1")
        peers.append(None if peer == NO_PEER else peer)
    channel = _int(doc, node, "chan", low=0, high=num_channels - 1)
    raw = [_parse_step(doc, child, position) for position, child in enumerate(_children(doc, node, "step"))]
    return Threadblock(tb_id, (), peers[0], peers[1], channel), raw


def _publishers(raw: list[_RawStep]) -> list[int | None]:
    """Return, for each step of a threadblock, the first step at or after it that publishes (None: none does).

    Only steps marked ``hasdep="1"`` that are not NOPs publish; one backward pass answers every
    dependency on the threadblock, where a forward search per waiting step would be quadratic.
    """
    first: list[int | None] = [None] * len(raw)
    later: int | None = None
    for index in range(len(raw) - 1, -1, -1):
        if raw[index].hasdep and raw[index].step.op is not OpType.NOP:
            later = index
        first[index] = later
    return first


def _resolve_dependency(doc: _Doc, raw: _RawStep, publishers: dict[int, list[int | None]]) -> tuple[int, int]:
    """Return the (threadblock, step) whose published flag releases ``raw``'s dependency."""
    dep_tb, dep_step = raw.dep
    target = publishers.get(dep_tb)
    if target is None or dep_step >= len(target):
        raise FormatError(
            doc.source,
            _where(raw.node, "depid"),
            f"depends on tb {dep_tb} step {dep_step}, which does not exist",
            "a dependency on a step of this GPU",
        )
    index = target[dep_step]
    if index is None:
        raise FormatError(
            doc.source,
            _where(raw.node, "depid"),
            f'depends on tb {dep_tb} step {dep_step}, but neither it nor a later step of tb {dep_tb} has hasdep="1", '
            "so the runtime would wait forever",
            'hasdep="1" on the step depended on',
        )
    if index != dep_step:
        logger.debug(
            "%s: %s waits for tb %d step %d, published at step %d", doc.source, raw.node.path, dep_tb, dep_step, index
        )
    return dep_tb, index


def _parse_gpu(doc: _Doc, node: _Node, num_ranks: int, num_channels: int) -> RankProgram:
    rank = _int(doc, node, "id", low=0, high=num_ranks - 1)
    chunks = [_int(doc, node, attr, low=0) for attr in ("i_chunks", "o_chunks", "s_chunks")]
    parsed = [_parse_threadblock(doc, child, rank, num_ranks, num_channels) for child in _children(doc, node, "tb")]
    publishers: dict[int, list[int | None]] = {}
    for tb, raw in parsed:
        if tb.id in publishers:
            raise FormatError(doc.source, _where(node), f"threadblock id {tb.id} used twice", "unique <tb id> per GPU")
        publishers[tb.id] = _publishers(raw)
    threadblocks = []
    for tb, raw in parsed:
        steps = tuple(
            r.step
            if r.dep is None
            else Step(
                r.step.op,
                r.step.src_buffer,
                r.step.src_offset,
                r.step.dst_buffer,
                r.step.dst_offset,
                r.step.count,
                (_resolve_dependency(doc, r, publishers),),
            )
            for r in raw
        )
        threadblocks.append(Threadblock(tb.id, steps, tb.send_peer, tb.recv_peer, tb.channel))
    return RankProgram(rank, tuple(threadblocks), *chunks)


def _metadata(doc: _Doc) -> tuple[tuple[str, str], ...]:
    for comment in doc.comments:
        text = comment.strip()
        if text.startswith(METADATA_COMMENT):
            try:
                items = json.loads(text[len(METADATA_COMMENT) :])
            except (ValueError, RecursionError) as error:  # ValueError: JSONDecodeError, or an int too long
                fault = f"invalid JSON: {getattr(error, 'msg', error)}"
                raise FormatError(doc.source, f"<!-- {METADATA_COMMENT} --> comment", fault, "a JSON object") from None
            if not isinstance(items, dict):
                raise FormatError(doc.source, f"<!-- {METADATA_COMMENT} --> comment", "not an object", "a JSON object")
            return tuple(sorted((str(k), str(v)) for k, v in items.items()))
    return ()


def _aliased(collective: Collective, ranks: list[RankProgram]) -> bool:
    """Return True when the buffer an in-place call shares is absent (0 chunks) on every rank."""
    if collective is Collective.ALLGATHER:
        return all(prog.input_chunks == 0 for prog in ranks)
    return all(prog.output_chunks == 0 for prog in ranks)


def _parse_algo(doc: _Doc) -> Algorithm:
    root = doc.root
    if root.tag == "system":  # NCCL's topology XML (NCCL_TOPO_FILE)
        raise FormatError(doc.source, None, "a topology file (NCCL XML), not an algorithm", "an <algo> element")
    if root.tag != "algo":
        raise FormatError(doc.source, _where(root), f"root element <{root.tag}>", "<algo>")
    num_ranks = _int(doc, root, "ngpus", low=1)
    chunks_per_loop = _int(doc, root, "nchunksperloop", low=1)
    collective: Collective = _choice(doc, root, "coll", COLLECTIVE_SPELLINGS)
    try:
        chunk_layout(collective, num_ranks, chunks_per_loop)
    except ArgumentError as error:
        raise FormatError(doc.source, _where(root, "nchunksperloop"), error.fault, error.expected) from None
    inplace = bool(_int(doc, root, "inplace", low=0, high=1))
    outofplace = bool(_int(doc, root, "outofplace", low=0, high=1, default=int(not inplace)))
    max_bytes = _int(doc, root, "maxBytes", low=0, default=0)
    num_channels = _int(doc, root, "nchannels", low=1)
    gpus = [_parse_gpu(doc, child, num_ranks, num_channels) for child in _children(doc, root, "gpu")]
    ranks = sorted(gpus, key=lambda prog: prog.rank)
    # the length first: list(range(num_ranks)) of a huge ngpus would exhaust memory
    if len(ranks) != num_ranks or [prog.rank for prog in ranks] != list(range(num_ranks)):
        found = ", ".join(str(prog.rank) for prog in ranks)
        raise FormatError(
            doc.source,
            _where(root, "ngpus"),
            f"<gpu> ids [{found}] for {num_ranks} GPUs",
            f"one <gpu> for each id 0..{num_ranks - 1}",
        )
    metadata = _metadata(doc)
    if inplace and outofplace:  # serves both call forms: the IR models the out-of-place one
        inplace = _aliased(collective, ranks)
        metadata = tuple(sorted(dict(metadata, **{BOTH_PLACES_KEY: "1"}).items()))
    return Algorithm(
        name=_raw(doc, root, "name"),
        collective=collective,
        num_ranks=num_ranks,
        chunks_per_loop=chunks_per_loop,
        ranks=tuple(ranks),
        inplace=inplace,
        protocol=_choice(doc, root, "proto", _PROTOCOLS).value,
        min_bytes=_int(doc, root, "minBytes", low=0, default=0),
        max_bytes=max_bytes + 1 if max_bytes else None,  # MSCCL's maxBytes is inclusive, ours exclusive
        metadata=metadata,
    )


def parse_msccl_xml(text: str, source: str = "<string>") -> Algorithm:
    """Return the Algorithm an MSCCL-IR XML text describes (old or new dialect).

    Parameters
    ----------
    text : str
        The XML document.
    source : str
        Name used in error messages (usually the file path).

    Raises
    ------
    FormatError
        Naming the element path, attribute and line: malformed XML, a missing or non-integer
        attribute, an unknown step type, buffer, collective or protocol, a bad peer or channel,
        misnumbered steps, a dependency on a missing step or on one that never publishes.

    Examples
    --------
    >>> algo = parse_msccl_xml('<algo name="x" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="1" '
    ...                        'coll="allreduce" inplace="1">'
    ...                        '<gpu id="0" i_chunks="1" o_chunks="0" s_chunks="0"/></algo>')
    >>> algo.collective.value, algo.inplace, algo.max_bytes
    ('allreduce', True, None)
    """
    return _parse_algo(_build_tree(text, source))


def read_msccl_xml(path: str) -> Algorithm:
    """Return the Algorithm in the MSCCL-IR XML file at ``path`` (``-`` for stdin)."""
    return parse_msccl_xml(read_text(path), str(path))


class _RootRead(Exception):
    """Stops expat at the root element: the selection fields are all on ``<algo>``."""


def parse_msccl_selection_key(text: str, source: str = "<string>") -> SelectionKey:
    """Return the selection fields of an MSCCL-IR XML text's ``<algo>`` element, named ``source``; no step is read.

    What an MSCCL runtime reads of every file in its folder (``taccl_py.msccl.selection``): the
    old dialect's missing ``outofplace`` means ``not inplace``, missing ``minBytes``/``maxBytes``
    every size. Raises ``FormatError`` as ``parse_msccl_xml`` does for the element.
    """
    doc = _Doc(source)

    def start(tag: str, attrs: dict[str, str]) -> None:
        doc.root = _Node(tag, attrs, parser.CurrentLineNumber)
        raise _RootRead

    parser = create_xml_parser(source, _EXPECTED, start, lambda tag: None)
    try:
        parser.Parse(text, True)
    except _RootRead:
        pass
    except expat.ExpatError as error:
        raise _malformed(source, error) from None
    root = doc.root
    if root is None or root.tag != "algo":
        found = "no element" if root is None else f"root element <{root.tag}>"
        raise FormatError(source, "line 1" if root is None else _where(root), found, "an <algo> element")
    inplace = bool(_int(doc, root, "inplace", low=0, high=1))
    return SelectionKey(
        source,
        _choice(doc, root, "coll", COLLECTIVE_SPELLINGS),
        _int(doc, root, "ngpus", low=1),
        _int(doc, root, "nchunksperloop", low=1),
        _int(doc, root, "minBytes", low=0, default=0),
        _int(doc, root, "maxBytes", low=0, default=0),
        inplace,
        bool(_int(doc, root, "outofplace", low=0, high=1, default=int(not inplace))),
    )
