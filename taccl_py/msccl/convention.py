"""Check that the send and receive steps of an MSCCL-IR XML file agree on the slots they name.

The runtime reads only the operands a step type uses (``STEP_OPERANDS``); msccl-tools and RCCL's
own files fill the other slot with the peer's side: a send step names its own source and the
receiver's destination, the matching receive names the sender's source and its own destination.
Simulators of a file (threadblocks as threads, a FIFO per peer and channel) check that both
sides agree and reject a file where they do not; earlier taccl_py exports repeated the step's
own operand there instead. ``check_send_recv_fields`` accepts either and reports anything else.

Steps meet as in ``taccl_py.ir.dataflow``: the k-th sending step on (rank, send peer, channel)
meets the k-th receiving step of the peer on that channel, in document order. For each pair:

- a sender that does not use ``dst`` (``s``, ``rrs``) must name in ``dstbuf``/``dstoff`` what
  the receiver names there, or its own ``src``;
- a receiver that does not use ``src`` (``r``, ``rcs``) must name in ``srcbuf``/``srcoff`` the
  sender's data source (``dst`` of an ``rcs`` or ``rrcs``, what it stored and forwards; else
  ``src``), or its own ``dst``.
"""

from __future__ import annotations

from dataclasses import dataclass

from taccl_py._xml import create_xml_parser
from taccl_py.errors import Violation
from taccl_py.ir.algorithm import Buffer, OpType
from taccl_py.msccl.dialect import STEP_OPERANDS, StepKey, pair_transfers
from taccl_py.msccl.parse import parse_msccl_xml

__all__ = ["VIOLATION_KIND", "check_send_recv_fields"]

VIOLATION_KIND = "send/recv fields"  # Violation.kind of every record check_send_recv_fields returns
_NAMES_RECEIVER = frozenset(op for op, (_, uses_dst) in STEP_OPERANDS.items() if op.sends and not uses_dst)
_NAMES_SENDER = frozenset(op for op, (uses_src, _) in STEP_OPERANDS.items() if op.receives and not uses_src)
_FORWARDS_DST = frozenset({OpType.RECV_COPY_SEND, OpType.RECV_REDUCE_COPY_SEND})

_Slot = tuple[Buffer, int]


@dataclass(frozen=True, slots=True)
class _Fields:
    """The two slots a step element names, as written, and its line."""

    src: _Slot
    dst: _Slot
    line: int


class _FieldReader:
    """Collect each step's written slots from expat events; the document was validated by the parser first."""

    __slots__ = ("parser", "fields", "rank", "tb")

    def __init__(self, source: str) -> None:
        self.parser = create_xml_parser(source, "an MSCCL-IR XML document", self.start, self.end)
        self.fields: dict[StepKey, _Fields] = {}
        self.rank = self.tb = 0

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        if tag == "gpu":
            self.rank = int(attrs["id"])
        elif tag == "tb":
            self.tb = int(attrs["id"])
        elif tag == "step":
            src = (Buffer(attrs["srcbuf"]), int(attrs["srcoff"]))
            dst = (Buffer(attrs["dstbuf"]), int(attrs["dstoff"]))
            self.fields[(self.rank, self.tb, int(attrs["s"]))] = _Fields(src, dst, self.parser.CurrentLineNumber)

    def end(self, tag: str) -> None:
        pass


def _slot(slot: _Slot) -> str:
    return f"{slot[0].value}[{slot[1]}]"


def _expected(peer_side: _Slot, own: _Slot, own_name: str) -> str:
    if peer_side == own:
        return _slot(peer_side)
    return f"{_slot(peer_side)} (msccl-tools) or the step's own {own_name} {_slot(own)} (older taccl_py)"


def _check_pair(
    ops: dict[StepKey, OpType], fields: dict[StepKey, _Fields], send: StepKey, recv: StepKey
) -> list[Violation]:
    """Return the violations of one matched pair: at most one on each side."""
    found = []
    sent, received = fields[send], fields[recv]
    send_op, recv_op = ops[send], ops[recv]
    if send_op in _NAMES_RECEIVER and sent.dst not in (received.dst, sent.src):
        message = (
            f"{send_op.value} at line {sent.line} names dst {_slot(sent.dst)} on rank {recv[0]}, where the matching "
            f"{recv_op.value} (tb {recv[1]}, step {recv[2]}) names dst {_slot(received.dst)}; "
            f"expected {_expected(received.dst, sent.src, 'src')}"
        )
        found.append(Violation(VIOLATION_KIND, message, *send))
    source = sent.dst if send_op in _FORWARDS_DST else sent.src
    if recv_op in _NAMES_SENDER and received.src not in (source, received.dst):
        message = (
            f"{recv_op.value} at line {received.line} names src {_slot(received.src)} on rank {send[0]}, where the "
            f"matching {send_op.value} (tb {send[1]}, step {send[2]}) sends from {_slot(source)}; "
            f"expected {_expected(source, received.dst, 'dst')}"
        )
        found.append(Violation(VIOLATION_KIND, message, *recv))
    return found


def check_send_recv_fields(text: str, source: str = "<string>") -> tuple[Violation, ...]:
    """Return a ``Violation`` for each step whose peer-side slot disagrees with its matching step.

    Parameters
    ----------
    text : str
        An MSCCL-IR XML document (either dialect).
    source : str
        Name used in error messages (usually the file path).

    Returns
    -------
    tuple of Violation
        Kind ``VIOLATION_KIND``, located by rank, threadblock and step, sorted by them; the message names
        the step's line, what each side names and what was expected. Empty when the file follows
        msccl-tools' convention or taccl_py's older one.

    Raises
    ------
    FormatError
        When ``text`` is not a valid MSCCL-IR document (as ``parse_msccl_xml``).

    Notes
    -----
    Linear in the document: it is parsed twice, once by ``parse_msccl_xml`` to validate it and
    match the steps, once for the written slots the import leaves out.

    Examples
    --------
    Rank 1 sends into rank 0's ``o[1]`` but names ``o[0]`` there:

    >>> step = '<step s="0" type="{}" srcbuf="i" srcoff="0" dstbuf="o" dstoff="{}" cnt="1" depid="-1" deps="-1" hasdep="0"/>'
    >>> gpu = ('<gpu id="{0}" i_chunks="1" o_chunks="2" s_chunks="0"><tb id="0" send="{1}" recv="-1" chan="0">{2}</tb>'
    ...        '<tb id="1" send="-1" recv="{1}" chan="0">{3}</tb></gpu>')
    >>> text = ('<algo name="x" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" inplace="0">'
    ...         + gpu.format(0, 1, step.format("s", 1), step.format("r", 1))
    ...         + gpu.format(1, 0, step.format("s", 0), step.format("r", 1)) + "</algo>")
    >>> [(v.rank, v.threadblock, v.step) for v in check_send_recv_fields(text)]
    [(1, 0, 0)]
    """  # noqa: E501
    algorithm = parse_msccl_xml(text, source)
    reader = _FieldReader(source)
    reader.parser.Parse(text, True)
    ops = {
        (prog.rank, tb.id, i): step.op
        for prog in algorithm.ranks
        for tb in prog.threadblocks
        for i, step in enumerate(tb.steps)
    }
    pairs = pair_transfers(
        (prog.rank, tb, i, step.op)
        for prog in algorithm.ranks
        for tb in prog.threadblocks
        for i, step in enumerate(tb.steps)
    )
    found = [v for send, recv in pairs.items() for v in _check_pair(ops, reader.fields, send, recv)]
    return tuple(sorted(found, key=lambda v: (v.rank, v.threadblock, v.step)))
