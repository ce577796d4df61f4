"""The dry run of a registration: which calls our MSCCL++ plans serve, which fall back, and the lines that launch a job.

Nothing here imports MSCCL++: the report runs the same ``PlanSelector`` that ``register_plans``
installs over the sizes frameworks pass, so what it prints is what the selector will do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

from taccl_py.deploy.mscclpp import PlanSelector, registered_plans
from taccl_py.deploy.mscclpp_plans import FORCE_NCCL_ENV, SHIM_COLLECTIVES, DeployPlan, read_plan_folder
from taccl_py.mscclpp.sizes import FRAMEWORK_SIZES, acceptance_rule
from taccl_py.units import format_size

__all__ = ["DEFAULT_REPORT_SIZES", "DryRun", "dry_run", "format_dry_run", "launch_lines"]

#: The sizes (bytes, nccl-tests' convention) a dry run asks about: powers of two from 1 KiB to
#: 4 GiB, and the framework sizes of ``taccl_py.mscclpp.sizes`` (DDP's 25 MiB bucket among them).
DEFAULT_REPORT_SIZES = tuple(sorted({1 << bit for bit in range(10, 33)} | set(FRAMEWORK_SIZES)))
#: What a call no plan serves gets: the shim's own choice (nccl.cc:222-279, 646-658).
FALLBACK = "fallback to MSCCL++'s own kernels or NCCL"


@dataclass(frozen=True)
class DryRun:
    """A registration worked out without MSCCL++: the plans registered, those left out (file, why), the selector."""

    folder: Path
    registered: tuple[DeployPlan, ...]
    left_out: tuple[tuple[str, str], ...]
    selector: PlanSelector
    reduce_ops: tuple[str, ...]


def dry_run(
    folder: str | Path,
    *,
    world_size: int,
    ranks_per_node: int,
    reduce_ops: Iterable[str] = ("sum",),
    collectives: Iterable[str] | None = None,
) -> DryRun:
    """Return what ``register_plans`` would register from ``folder`` for the job, and what it would leave out.

    Raises what ``register_plans`` raises for the folder and the ops (FormatError, ArgumentError).
    """
    plans = read_plan_folder(folder, world_size=world_size, ranks_per_node=ranks_per_node)
    ops = tuple(op.lower() for op in reduce_ops)
    chosen = registered_plans(plans, ops, collectives)
    left_out = tuple((entry.path.name, _why_left_out(entry)) for entry in plans if entry not in chosen)
    return DryRun(Path(folder), chosen, left_out, PlanSelector(chosen, world_size, ranks_per_node), ops)


def _why_left_out(entry: DeployPlan) -> str:
    if entry.collective not in SHIM_COLLECTIVES:
        return f"MSCCL++'s NCCL shim selects no algorithm for {entry.collective} (its ncclAllToAll is unavailable)"
    return "its collective was not asked for"


def format_dry_run(run: DryRun, sizes: Iterable[int] = DEFAULT_REPORT_SIZES) -> str:
    """Return the dry run as text: each plan and the sizes it accepts, then who serves each call, by runs of sizes."""
    selector = run.selector
    lines = [
        f"MSCCL++ plans of {run.folder} for {selector.world_size} ranks, {selector.ranks_per_node} per machine; "
        f"reduction ops: {', '.join(run.reduce_ops)}",
        f"registered ({len(run.registered)}), each with Algorithm.Constraint() so that only this selector picks it:",
    ]
    for entry in run.registered:
        rule = acceptance_rule(entry.plan)
        placement = "in place" if entry.inplace else "out of place"
        lines.append(
            f"  {entry.name} ({entry.path.name}): {entry.collective} {placement}, "
            f"{format_size(rule.min_bytes)}-{format_size(rule.max_bytes)}, {rule.describe()}"
        )
    for name, why in run.left_out:
        lines.append(f"  not registered: {name}: {why}")
    lines.append(f"calls (bytes as nccl-tests counts them; '{FALLBACK}': the plan is not used):")
    lines.extend(_call_rows(selector, tuple(sizes)))
    return "\n".join(lines)


def _call_rows(selector: PlanSelector, sizes: tuple[int, ...]) -> list[str]:
    rows = [("collective", "placement", "sizes", "served by")]
    collectives = sorted({entry.collective for entry in selector.plans}, key=SHIM_COLLECTIVES.index)
    for collective in collectives:
        for inplace in (False, True):
            placement = "in place" if inplace else "out of place"
            # an AllGather or ReduceScatter call's size is the rank count times a per-rank block
            valid = [size for size in sizes if collective == "allreduce" or size % selector.world_size == 0]
            outcomes = [(size, _outcome(selector.decide(collective, size, inplace))) for size in valid]
            for outcome, run in groupby(outcomes, key=lambda item: item[1]):
                run = list(run)
                first, last = format_size(run[0][0]), format_size(run[-1][0])
                span = first if first == last else f"{first}-{last}"
                rows.append((collective, placement, span, outcome))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3] for row in rows]


def _outcome(decision: tuple[DeployPlan | None, str]) -> str:
    entry, why = decision
    return entry.name if entry is not None else f"{FALLBACK} ({why})"


def launch_lines(
    folder: str | Path,
    *,
    world_size: int,
    ranks_per_node: int,
    reduce_ops: Iterable[str] = ("sum",),
    collectives: Iterable[str] | None = None,
) -> str:
    """Return the environment and the Python lines that run a torchrun job with ``folder``'s plans (docs/deploy.md)."""
    ops = ", ".join(repr(op) for op in reduce_ops)
    wanted = "" if collectives is None else f", collectives=({', '.join(repr(c) for c in collectives)},)"
    absolute = Path(folder).resolve()
    return "\n".join(
        (
            "# environment of every rank (paths are placeholders for your builds):",
            "export LD_PRELOAD=<mscclpp>/build/lib/libmscclpp_nccl.so",
            "export MSCCLPP_NCCL_LIB_PATH=<nccl>/lib/libnccl.so.2  # what no plan and no MSCCL++ kernel serves",
            f"# optional: export {FORCE_NCCL_ENV}=allreduce,reducescatter  # keeps those collectives on NCCL",
            "# in the training script, in every rank, before torch.distributed.init_process_group('nccl'):",
            "import os",
            "from taccl_py.deploy.mscclpp import register_plans",
            f"register_plans({str(absolute)!r}, rank=int(os.environ['RANK']), world_size={world_size}, "
            f"ranks_per_node={ranks_per_node}, reduce_ops=({ops},){wanted})",
        )
    )
