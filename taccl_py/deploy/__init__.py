"""Put exported files under a real job: MSCCL++ plans registered with its NCCL shim, MSCCL XML for its runtimes.

``taccl_py.deploy.mscclpp`` registers a folder of plans (``register_plans``) behind a selector
that serves only the calls they run right; ``taccl_py.deploy.mscclpp_report`` works the same
choice out without MSCCL++ (a dry run); ``taccl_py.deploy.msccl`` gives the environment under which
msccl-executor-nccl or RCCL loads a folder of XML files. docs/deploy.md walks through both.
"""

from taccl_py.deploy.msccl import MscclEnvironment, MscclRuntime, format_environment, msccl_environment
from taccl_py.deploy.mscclpp import PlanSelector, Registration, register_plans
from taccl_py.deploy.mscclpp_report import DryRun, dry_run, format_dry_run, launch_lines

__all__ = [
    "DryRun",
    "MscclEnvironment",
    "MscclRuntime",
    "PlanSelector",
    "Registration",
    "dry_run",
    "format_dry_run",
    "format_environment",
    "launch_lines",
    "msccl_environment",
    "register_plans",
]
