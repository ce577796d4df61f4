"""``taccl deploy``: print how a job loads an exported folder (MSCCL++ registration dry run, MSCCL environment).

A package rather than a module of ``taccl_py/cli/`` only because that folder holds its fifteen
modules (tests/test_layout.py).
"""

from __future__ import annotations

import argparse

from taccl_py.errors import ArgumentError

__all__ = ["register"]


def _names(text: str, option: str) -> tuple[str, ...]:
    """Return the comma-separated names of ``text``; raise ArgumentError for an empty one."""
    names = tuple(name.strip() for name in text.split(","))
    if not all(names):
        raise ArgumentError(None, option, f"{text!r} has an empty name", "names separated by commas, e.g. sum,max")
    return names


def _deploy_mscclpp(args: argparse.Namespace) -> int:
    from taccl_py.deploy.mscclpp_report import dry_run, format_dry_run, launch_lines

    job = {
        "world_size": args.world_size,
        "ranks_per_node": args.ranks_per_node,
        "reduce_ops": _names(args.reduce_ops, "--reduce-ops"),
        "collectives": None if args.collectives is None else _names(args.collectives, "--collectives"),
    }
    run = dry_run(args.folder, **job)
    print(format_dry_run(run))
    print()
    print(launch_lines(args.folder, **job))
    return 0


def _deploy_msccl(args: argparse.Namespace) -> int:
    from taccl_py.deploy.msccl import format_environment, msccl_environment

    print(format_environment(msccl_environment(args.folder, args.runtime, keep_rccl_mscclpp=args.keep_rccl_mscclpp)))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``deploy`` (with ``mscclpp`` and ``msccl``) to ``subparsers``."""
    parser = subparsers.add_parser(
        "deploy",
        description="Print how a job loads an exported folder; nothing is written (docs/deploy.md).",
    )
    kinds = parser.add_subparsers(dest="deploy_command", required=True, metavar="RUNTIME")
    mscclpp = kinds.add_parser(
        "mscclpp",
        description="Dry run of taccl_py.deploy.mscclpp.register_plans: which calls each plan of DIR serves and "
        "which fall back (to MSCCL++'s own kernels or NCCL), each plan's accepted sizes, and the launch lines.",
    )
    mscclpp.add_argument("folder", metavar="DIR", help="a folder written by taccl export-mscclpp")
    mscclpp.add_argument("--world-size", type=int, required=True, help="the job's ranks")
    mscclpp.add_argument("--ranks-per-node", type=int, required=True, help="the job's ranks per machine")
    mscclpp.add_argument(
        "--reduce-ops",
        default="sum",
        help="every reduction op the job uses, comma-separated (default sum); MSCCL++ runs every plan's "
        "reduction as a sum, so another op refuses AllReduce and ReduceScatter plans",
    )
    mscclpp.add_argument(
        "--collectives",
        default=None,
        help="register only these collectives' plans, comma-separated (default: allgather,allreduce,reducescatter)",
    )
    mscclpp.set_defaults(func=_deploy_mscclpp)
    msccl = kinds.add_parser(
        "msccl",
        description="Print the environment under which msccl-executor-nccl or RCCL loads the MSCCL XML files of DIR.",
    )
    msccl.add_argument("folder", metavar="DIR", help="a folder written by taccl export-msccl")
    msccl.add_argument(
        "--runtime", choices=("msccl-executor-nccl", "rccl"), default="msccl-executor-nccl", help="default: %(default)s"
    )
    msccl.add_argument(
        "--keep-rccl-mscclpp",
        action="store_true",
        help="rccl: leave RCCL's MSCCL++ path on (it takes small AllReduce and AllGather under graph capture "
        "before any file is consulted)",
    )
    msccl.set_defaults(func=_deploy_msccl)
