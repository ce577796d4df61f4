"""MSCCL-IR XML: export an Algorithm for the MSCCL runtimes and import their files.

``generate_msccl_xml``/``write_msccl_xml`` write either dialect (``"new"`` for
Azure/msccl-executor-nccl and RCCL, ``"old"`` for microsoft/msccl), ``check_msccl_limits`` only
checks that they would; ``parse_msccl_xml``/``read_msccl_xml`` read both. Export and import are
inverse up to normalisation: exporting what an import returned reproduces the exported text.
``write_library_xml`` writes a whole library, one file per size band.
"""

from taccl_py.msccl.dialect import COLLECTIVE_SPELLINGS, DIALECTS, Dialect, Protocol, parse_dialect
from taccl_py.msccl.export import check_msccl_limits, generate_msccl_xml, write_msccl_xml
from taccl_py.msccl.library import LibraryXml, generate_library_xml, write_library_xml
from taccl_py.msccl.limits import (
    MAX_CHANNELS,
    MAX_COUNT,
    MAX_STEPS_PER_THREADBLOCK,
    MAX_THREADBLOCKS_PER_CHANNEL,
    MAX_THREADBLOCKS_PER_GPU,
)
from taccl_py.msccl.parse import looks_like_msccl_xml, parse_msccl_xml, read_msccl_xml

__all__ = [
    "Dialect",
    "Protocol",
    "DIALECTS",
    "COLLECTIVE_SPELLINGS",
    "generate_msccl_xml",
    "check_msccl_limits",
    "write_msccl_xml",
    "LibraryXml",
    "generate_library_xml",
    "write_library_xml",
    "parse_dialect",
    "parse_msccl_xml",
    "read_msccl_xml",
    "looks_like_msccl_xml",
    "MAX_STEPS_PER_THREADBLOCK",
    "MAX_THREADBLOCKS_PER_GPU",
    "MAX_THREADBLOCKS_PER_CHANNEL",
    "MAX_COUNT",
    "MAX_CHANNELS",
]
