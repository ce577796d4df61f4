"""A minimal XML reader for the importers: elements with attributes, children and line numbers.

``xml.etree`` drops line numbers; errors about a ``<gpu>`` listed twice should name its line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from xml.parsers import expat

from taccl_py.errors import FormatError

__all__ = ["XmlElement", "parse_xml_tree"]


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

    def __init__(self) -> None:
        self.parser = expat.ParserCreate()
        self.stack = [XmlElement("#document", {}, 0)]
        self.parser.StartElementHandler = self.start
        self.parser.EndElementHandler = self.end

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        element = XmlElement(tag, attrs, self.parser.CurrentLineNumber)
        self.stack[-1].children.append(element)
        self.stack.append(element)

    def end(self, tag: str) -> None:
        self.stack.pop()


def parse_xml_tree(text: str, source: str, root_tag: str) -> XmlElement:
    """Return the root element of ``text``; raise ``FormatError`` (with the line) if malformed.

    >>> parse_xml_tree('<system version="1">\\n<cpu numaid="0"/></system>', "<string>", "system").children[0].line
    2
    """
    builder = _TreeBuilder()
    try:
        builder.parser.Parse(text, True)
    except expat.ExpatError as exc:
        raise FormatError(source, f"line {exc.lineno}", f"malformed XML: {expat.ErrorString(exc.code)}",
                          f"well-formed XML with a <{root_tag}> root") from None
    root = builder.stack[0].children[0]
    if root.tag != root_tag:
        raise FormatError(source, f"line {root.line}", f"root element <{root.tag}>", f"<{root_tag}>")
    return root
