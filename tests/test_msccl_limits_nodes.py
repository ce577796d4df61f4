"""MSCCL's XML reader limits (msccl-executor-nccl msccl_parser.h:22-23): nodes per rank's parse tree, children per node.

A rank keeps ``<algo>``, every ``<gpu>``, and its own ``<tb>`` and ``<step>`` elements; the reader fails
on reaching 4096 of them, so a rank holds at most 4095.
"""

from __future__ import annotations

import re

import pytest

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective
from taccl_py.msccl import generate_msccl_xml
from taccl_py.msccl.limits import MAX_PARSE_NODES, check_parse_tree, runtime_limits

COPY = Step(OpType.COPY, Buffer.INPUT, 0, Buffer.OUTPUT, 0)


def _wide(last_tb_steps: int) -> Algorithm:
    """Return a 2-rank AllGather whose rank 0 has 62 copy threadblocks of 64 steps and one of ``last_tb_steps``.

    Rank 0's tree: 1 algo + 2 gpu + 63 tb + 3968 + ``last_tb_steps`` steps = 4034 + ``last_tb_steps``.
    """
    tbs = [Threadblock(t, (COPY,) * 64) for t in range(62)] + [Threadblock(62, (COPY,) * last_tb_steps)]
    ranks = (
        RankProgram(0, tuple(tbs), 1, 2),
        RankProgram(1, (Threadblock(0, (Step(OpType.COPY, Buffer.INPUT, 0, Buffer.OUTPUT, 1),)),), 1, 2),
    )
    return Algorithm("wide", Collective.ALLGATHER, 2, 2, ranks)


def _elements_of_rank(text: str, rank: int) -> int:
    """Return the elements rank ``rank``'s reader keeps, counted from the XML text itself."""
    gpus = re.split(r"(?=<gpu )", text)
    own = next(part for part in gpus if part.startswith(f'<gpu id="{rank}"'))
    own = own.split("</gpu>")[0]
    return 1 + text.count("<gpu ") + own.count("<tb ") + own.count("<step ")


@pytest.mark.parametrize("runtime", ["msccl-executor-nccl", "portable"])
def test_a_rank_past_the_node_limit_is_refused_and_one_just_under_is_written(runtime):
    text = generate_msccl_xml(_wide(61), runtime=runtime)  # 4095 elements: the most the reader keeps
    assert _elements_of_rank(text, 0) == MAX_PARSE_NODES == 4095
    with pytest.raises(ArgumentError) as error:
        generate_msccl_xml(_wide(62), runtime=runtime)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("wide: rank 0: 4096 XML elements (1 algo, 2 gpu, 63 tb, 4030 step)")
    assert "at most 4095 per rank" in message and "MAX_NODES" in message


def test_runtimes_without_that_reader_take_the_same_file():
    # RCCL and microsoft/msccl are not given these limits here; the old runtime's larger step limit holds
    assert "<algo " in generate_msccl_xml(_wide(62), runtime="rccl")
    assert runtime_limits("rccl").max_parse_nodes is None and runtime_limits("msccl").max_parse_nodes is None


def test_children_per_element_are_at_most_1024():
    limits = runtime_limits("msccl-executor-nccl")
    check_parse_tree("x", 0, 1024, [1], limits)
    with pytest.raises(ArgumentError, match=r"x: rank 3: 1025 gpu elements; expected at most 1024 children"):
        check_parse_tree("x", 3, 1025, [1], limits)
    with pytest.raises(ArgumentError, match=r"1025 steps in a threadblock"):
        check_parse_tree("x", 0, 2, [1025], limits)
