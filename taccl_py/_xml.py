"""Create the expat parser every XML reader of user files uses, hardened against hostile documents.

A user's XML file (an MSCCL-IR schedule, an NCCL topology) may come from anywhere, so the parser

- refuses any DOCTYPE as soon as expat meets ``<!DOCTYPE``, before its internal subset is read:
  no entity is declared, so none is expanded (the "billion laughs" and quadratic-blowup bombs) and
  no external entity or DTD is fetched (https://docs.python.org/3/library/xml.html#xml-vulnerabilities).
  Neither format uses a DOCTYPE. Parameter entities are never parsed, and entity declarations and
  external references raise too, should expat report one anyway;
- refuses elements nested more than ``MAX_XML_DEPTH`` deep, so that a reader walking the tree
  recursively (NCCL's ``<pci>`` switches) cannot exhaust the interpreter's stack.

Each refusal is one ``FormatError`` naming the file and the line.
"""

from __future__ import annotations

from collections.abc import Callable
from xml.parsers import expat

from taccl_py.errors import FormatError

__all__ = ["MAX_XML_DEPTH", "create_xml_parser"]

# Deepest element nesting accepted, in elements counting the root. MSCCL-IR nests 4 deep
# (algo/gpu/tb/step); NCCL topology dumps about 10 (system/cpu/pci/pci/pci/gpu/nvlink, a few more
# PCIe switch levels at most); far below Python's recursion limit of 1000 frames.
MAX_XML_DEPTH = 64

_DOCTYPE_FAULT = "DOCTYPE declarations are not accepted (entity expansion, external entities)"


class _Guard:
    """Expat handlers that refuse DOCTYPEs, entities and deep nesting, passing elements on."""

    __slots__ = ("parser", "source", "expected", "depth", "start", "end")

    def __init__(
        self,
        parser: expat.XMLParserType,
        source: str,
        expected: str,
        start: Callable[[str, dict[str, str]], None],
        end: Callable[[str], None],
    ) -> None:
        self.parser = parser
        self.source = source
        self.expected = expected
        self.depth = 0
        self.start = start
        self.end = end

    def start_element(self, tag: str, attrs: dict[str, str]) -> None:
        self.depth += 1
        if self.depth > MAX_XML_DEPTH:
            raise FormatError(
                self.source,
                f"line {self.parser.CurrentLineNumber}",
                f"elements nested more than {MAX_XML_DEPTH} deep",
                f"{self.expected} nested at most {MAX_XML_DEPTH} deep",
            )
        self.start(tag, attrs)

    def end_element(self, tag: str) -> None:
        self.depth -= 1
        self.end(tag)

    def refuse(self, *_: object) -> None:
        raise FormatError(
            self.source,
            f"line {self.parser.CurrentLineNumber}",
            _DOCTYPE_FAULT,
            f"{self.expected} without a DOCTYPE",
        )


def create_xml_parser(
    source: str,
    expected: str,
    start: Callable[[str, dict[str, str]], None],
    end: Callable[[str], None],
) -> expat.XMLParserType:
    """Return an expat parser calling ``start(tag, attrs)`` and ``end(tag)``, refusing DOCTYPEs and deep nesting.

    Parameters
    ----------
    source : str
        The file name the errors give.
    expected : str
        What the file should be, for the errors: ``"an MSCCL-IR XML document"``.
    start, end : callable
        The element handlers; the caller sets any others (comments) on the parser it gets.

    Raises
    ------
    FormatError
        From ``Parse``: at a DOCTYPE, an entity declaration or external entity reference, or an
        element nested more than ``MAX_XML_DEPTH`` deep; the field is the line.

    Examples
    --------
    >>> tags = []
    >>> parser = create_xml_parser("x.xml", "a test document", lambda tag, attrs: tags.append(tag), lambda tag: None)
    >>> parser.Parse("<a><b/></a>", True), tags
    (1, ['a', 'b'])
    >>> parser = create_xml_parser("x.xml", "a test document", lambda tag, attrs: None, lambda tag: None)
    >>> parser.Parse('<!DOCTYPE a [<!ENTITY e "e">]><a/>', True)
    Traceback (most recent call last):
    ...
    taccl_py.errors.FormatError: x.xml: line 1: DOCTYPE declarations are not accepted (entity expansion, \
external entities); expected a test document without a DOCTYPE
    """
    parser = expat.ParserCreate()
    guard = _Guard(parser, source, expected, start, end)
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = guard.refuse
    parser.EntityDeclHandler = guard.refuse
    parser.UnparsedEntityDeclHandler = guard.refuse
    parser.ExternalEntityRefHandler = guard.refuse
    parser.StartElementHandler = guard.start_element
    parser.EndElementHandler = guard.end_element
    return parser
