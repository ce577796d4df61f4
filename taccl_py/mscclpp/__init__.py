"""MSCCL++ execution plans: export our algorithms as the JSON plans MSCCL++'s executor runs, read and verify plans.

``generate_mscclpp_plan`` lowers an Algorithm to a plan; ``write_mscclpp_plan`` and
``write_library_plans`` write verified plan files (one per library band and placement).
``parse_mscclpp_plan``/``read_mscclpp_plan`` read a plan into frozen dataclasses
(``ExecutionPlan``), ``generate_mscclpp_plan_json`` writes one back, and
``verify_mscclpp_plan``/``check_mscclpp_plan`` replay it symbolically against its collective,
``simulate_mscclpp_plan`` times it on the α-β engine (µs), and ``lift_mscclpp_plan`` turns it into
an Algorithm of our IR.
"""

from taccl_py.mscclpp.export import generate_mscclpp_plan
from taccl_py.mscclpp.files import (
    LibraryPlans,
    generate_library_plans,
    mscclpp_plan_text,
    write_library_plans,
    write_mscclpp_plan,
)
from taccl_py.mscclpp.lift import lift_mscclpp_plan
from taccl_py.mscclpp.parse import looks_like_mscclpp_plan, parse_mscclpp_plan, read_mscclpp_plan
from taccl_py.mscclpp.plan import (
    BufferKind,
    BufferRef,
    Channel,
    ChannelKind,
    ExecutionPlan,
    Gpu,
    Operation,
    OpName,
    Protocol,
    RankGroup,
    RemoteBuffer,
    RemoteBufferRefs,
    Threadblock,
    ThreadblockChannels,
    ThreadblockGroup,
    generate_mscclpp_plan_json,
)
from taccl_py.mscclpp.replay import check_mscclpp_plan, mscclpp_report, verify_mscclpp_plan
from taccl_py.mscclpp.simulate import prepare_plan_simulation, simulate_mscclpp_plan

__all__ = [
    "LibraryPlans",
    "generate_library_plans",
    "generate_mscclpp_plan",
    "lift_mscclpp_plan",
    "looks_like_mscclpp_plan",
    "mscclpp_plan_text",
    "mscclpp_report",
    "write_library_plans",
    "write_mscclpp_plan",
    "BufferKind",
    "BufferRef",
    "Channel",
    "ChannelKind",
    "ExecutionPlan",
    "Gpu",
    "Operation",
    "OpName",
    "Protocol",
    "RankGroup",
    "RemoteBuffer",
    "RemoteBufferRefs",
    "Threadblock",
    "ThreadblockChannels",
    "ThreadblockGroup",
    "check_mscclpp_plan",
    "generate_mscclpp_plan_json",
    "parse_mscclpp_plan",
    "read_mscclpp_plan",
    "prepare_plan_simulation",
    "simulate_mscclpp_plan",
    "verify_mscclpp_plan",
]
