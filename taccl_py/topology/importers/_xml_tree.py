"""A minimal XML reader for the importers: elements with attributes, children and line numbers.

``xml.etree`` drops line numbers; errors about a ``<gpu>`` listed twice should name its line,
and so do the attribute readers ``int_attr`` and ``float_attr``. The parser is the hardened one of
``taccl_py._xml.create_xml_parser``: a DOCTYPE (entity bombs, external entities) or elements nested
deeper than ``MAX_XML_DEPTH`` are one ``FormatError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from xml.parsers import expat

from taccl_py._xml import create_xml_parser
from taccl_py.errors import FormatError, TopologyError

__all__ = ["XmlElement", "float_attr", "int_attr", "parse_xml_tree"]


@dataclass(frozen=True)
class XmlElement:
    """One element: its tag, attributes, 1-based line and children in document order."""

    tag: str
    attrs: Mapping[str, str]
    line: int
    children: list[XmlElement] = field(default_factory=list)


class _TreeBuilder:
    """Collect expat events into ``XmlElement`` trees."""

    __slots__ = ("parser", "stack")

    def __init__(self, source: str, expected: str) -> None:
        self.parser = create_xml_parser(source, expected, self.start, self.end)
        self.stack = [XmlElement("#document", {}, 0)]

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        element = XmlElement(tag, attrs, self.parser.CurrentLineNumber)
        self.stack[-1].children.append(element)
        self.stack.append(element)

    def end(self, tag: str) -> None:
        self.stack.pop()


def parse_xml_tree(text: str, source: str, root_tag: str, *, expected: str | None = None) -> XmlElement:
    """Return the root element of ``text``; raise ``FormatError`` (with the line) if malformed.

    ``expected`` names what the file should be (``"an NCCL topology XML document"``) for the errors
    about a DOCTYPE or deep nesting; by default, an XML document with a ``root_tag`` root.

    >>> parse_xml_tree('<system version="1">\\n<cpu numaid="0"/></system>', "<string>", "system").children[0].line
    2
    """
    builder = _TreeBuilder(source, expected or f"an XML document with a <{root_tag}> root")
    try:
        builder.parser.Parse(text, True)
    except expat.ExpatError as exc:
        raise FormatError(
            source,
            f"line {exc.lineno}",
            f"malformed XML: {expat.ErrorString(exc.code)}",
            f"well-formed XML with a <{root_tag}> root",
        ) from None
    root = builder.stack[0].children[0]
    if root.tag != root_tag:
        raise FormatError(source, f"line {root.line}", f"root element <{root.tag}>", f"<{root_tag}>")
    return root


def int_attr(element: XmlElement, key: str, source: str, *, default: int | None = None, minimum: int = 0) -> int:
    """Return the integer attribute ``key`` (decimal or 0x hex) of ``element``, at least ``minimum``.

    A missing attribute gives ``default``; without one, or for a non-integer or a value below
    ``minimum``, raise ``TopologyError`` naming the element's line.

    >>> element = XmlElement("gpu", {"dev": "3", "class": "0x10"}, 7)
    >>> (int_attr(element, "dev", "<string>"), int_attr(element, "class", "<string>"),
    ...  int_attr(element, "sm", "<string>", default=0))
    (3, 16, 0)
    """
    raw = element.attrs.get(key)
    if raw is None:
        if default is None:
            raise TopologyError(source, f"line {element.line}", f"<{element.tag}> has no {key}", f"a {key} attribute")
        return default
    try:
        value = int(raw, 0) if raw.strip().lower().startswith("0x") else int(raw)
    except ValueError:
        raise TopologyError(
            source, f"line {element.line}", f"<{element.tag}> {key}={raw!r} is not an integer", "an integer"
        ) from None
    if value < minimum:
        raise TopologyError(
            source,
            f"line {element.line}",
            f"<{element.tag}> {key}={value} is below {minimum}",
            f"an integer >= {minimum}",
        )
    return value


def float_attr(element: XmlElement, key: str, source: str) -> float:
    """Return the non-negative number attribute ``key`` of ``element`` (0.0 when missing).

    >>> float_attr(XmlElement("net", {"latency": "2.5"}, 4), "latency", "<string>")
    2.5
    """
    raw = element.attrs.get(key, "0")
    try:
        value = float(raw)
    except ValueError:
        raise TopologyError(
            source, f"line {element.line}", f"<{element.tag}> {key}={raw!r} is not a number", "a number"
        ) from None
    if not value >= 0:
        raise TopologyError(source, f"line {element.line}", f"<{element.tag}> {key}={raw} is negative", "a number >= 0")
    return value
