"""scripts/bench_harness.py: the benchmark scripts' shared arguments, progress lines, tables, ratios and CSVs.

The last tests read every ``scripts/bench_*.py`` as a syntax tree and fail where one defines its own
stderr logger, inserts into ``sys.path`` or defines a shared flag itself, so the copies the harness
replaced cannot come back one script at a time.
"""

from __future__ import annotations

import ast
import math
import sys
from pathlib import Path

import pytest

from taccl_py.topology import builtin_topology_names

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(SCRIPTS) not in sys.path:  # the scripts import the harness by name, as when run
    sys.path.insert(0, str(SCRIPTS))

import bench_harness as harness  # noqa: E402

#: Flags every script takes from the harness's ``add_*_argument`` helpers, never defines itself.
SHARED_FLAGS = ("--topologies", "--nodes", "--sizes", "--collectives", "--jobs", "--instances", "--no-write", "--write")
BENCH_SCRIPTS = sorted(path for path in SCRIPTS.glob("bench_*.py") if path.name != "bench_harness.py")
#: Scripts beside the benchmarks that log through the harness too.
OTHER_SCRIPTS = ("build_algorithms.py", "rechoose_bands.py", "profile_synthesis.py", "solvers_report.py")


# -- progress and command lines ------------------------------------------------------------------------


def test_log_writes_one_line_to_stderr_and_nothing_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    harness.log("[1/2] ndv2 x1")
    captured = capsys.readouterr()
    assert captured.err == "[1/2] ndv2 x1\n"
    assert captured.out == ""


def test_command_line_names_the_script_and_its_arguments() -> None:
    command = harness.command_line("/any/where/scripts/bench_gap.py", ["--nodes", "2", "--no-write"])
    assert command == "python scripts/bench_gap.py --nodes 2 --no-write"
    assert harness.command_line("bench_gap.py", []) == "python scripts/bench_gap.py"


# -- arguments -----------------------------------------------------------------------------------------


def _parser(*adders) -> object:
    parser = harness.argument_parser("First line of the docstring.\n\nMore text.")
    for add in adders:
        add(parser)
    return parser


def test_defaults_of_the_shared_arguments() -> None:
    parser = _parser(
        harness.add_topologies_argument,
        lambda p: harness.add_nodes_argument(p, "1,2,4"),
        harness.add_collectives_argument,
        lambda p: harness.add_sizes_argument(p, "1MB,1GB"),
        harness.add_jobs_argument,
        harness.add_no_write_argument,
    )
    args = parser.parse_args([])
    assert args.topologies == ",".join(builtin_topology_names())
    assert (args.nodes, args.sizes, args.jobs, args.no_write) == ("1,2,4", "1MB,1GB", 2, False)
    assert args.collectives == "allgather,reducescatter,allreduce"
    given = parser.parse_args(["--topologies", "ndv2", "--nodes", "2", "--jobs", "3", "--no-write"])
    assert (given.topologies, given.nodes, given.jobs, given.no_write) == ("ndv2", "2", 3, True)


def test_unset_filters_default_to_none_and_say_what_that_means() -> None:
    parser = _parser(
        lambda p: harness.add_topologies_argument(p, unset="every library"),
        lambda p: harness.add_nodes_argument(p, None, unset="every library"),
        lambda p: harness.add_jobs_argument(p, None, per="instance"),
    )
    args = parser.parse_args([])
    assert (args.topologies, args.nodes, args.jobs) == (None, None, None)
    text = " ".join(parser.format_help().split())
    assert "built-in names (default: every library)" in text
    assert "machine counts (default: every library)" in text
    assert "worker processes per instance (default: the cores; same result)" in text


def test_help_names_defaults_and_what_is_left_alone() -> None:
    parser = _parser(
        lambda p: harness.add_sizes_argument(p, "1KB-1GB"),
        lambda p: harness.add_no_write_argument(p, "BENCHMARKS.md"),
        lambda p: harness.add_write_argument(p, "placement"),
        lambda p: harness.add_csv_argument(p, None, rows="the part's rows"),
        lambda p: harness.add_instances_argument(p, "ndv2:2"),
    )
    text = " ".join(parser.format_help().split())
    assert text.startswith("usage:") and "First line of the docstring." in text and "More text" not in text
    assert "nccl-tests sizes (default 1KB-1GB)" in text
    assert "print only; leave BENCHMARKS.md alone" in text
    assert "update the placement section of BENCHMARKS.md" in text
    assert "where the part's rows go (default scripts/data)" in text
    assert parser.parse_args(["--csv", "x.csv"]).csv == Path("x.csv")
    assert parser.parse_args(["--write"]).write is True


def test_full_doc_parser_keeps_the_docstring_layout() -> None:
    doc = "Title line.\n\n    python scripts/bench_x.py --nodes 1\n"
    assert "    python scripts/bench_x.py --nodes 1" in harness.argument_parser(doc, full_doc=True).format_help()


def test_lists_cases_and_instances_are_parsed_in_order() -> None:
    assert harness.split_names("a,,b,") == ["a", "b"]
    assert harness.split_names(None) == []
    assert harness.machine_cases("ndv2,dgx2", "1,4") == [("ndv2", 1), ("ndv2", 4), ("dgx2", 1), ("dgx2", 4)]
    assert harness.parse_instances("dgx1:2,dgx-a100:8") == [("dgx1", 2), ("dgx-a100", 8)]
    with pytest.raises(ValueError):
        harness.parse_instances("dgx1")


# -- tables and ratios ---------------------------------------------------------------------------------


def test_print_table_prints_right_aligned_columns_and_returns_them(capsys: pytest.CaptureFixture[str]) -> None:
    table = harness.print_table(("size", "time us"), [("1MB", 12.5), ("1GB", 9000)])
    assert capsys.readouterr().out == table + "\n"
    assert table.splitlines() == [
        "size  time us",
        "----  -------",
        " 1MB     12.5",
        " 1GB     9000",
    ]


def test_print_table_in_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    table = harness.print_table(("a", "b"), [(1, "x")], markdown=True)
    assert capsys.readouterr().out == "| a | b |\n|---|---|\n| 1 | x |\n"
    assert table == harness.markdown_table(("a", "b"), [(1, "x")])


def test_speedup_is_baseline_over_ours_and_none_without_a_baseline() -> None:
    assert harness.speedup(30.0, 20.0) == pytest.approx(1.5)
    assert harness.speedup(None, 20.0) is None
    assert harness.speedup(30.0, None) is None


def test_of_bound_is_bound_over_time_and_none_where_nothing_was_found() -> None:
    assert harness.of_bound(9.0, 10.0) == pytest.approx(0.9)
    assert harness.of_bound(9.0, math.inf) is None
    assert harness.of_bound(9.0, None) is None


def test_value_span_and_format_or_dash() -> None:
    assert harness.value_span([0.91, 0.8749, 0.95], 2) == "0.87-0.95"
    assert harness.value_span([1.0001, 1.0004], 3) == "1.000"
    assert harness.format_or_dash(1.23456, ".2f", "x") == "1.23x"
    assert harness.format_or_dash(None, ".2f", "x") == "-"


def test_group_records_keeps_first_seen_order() -> None:
    records = [{"t": "b", "n": 1, "v": 1}, {"t": "a", "n": 1, "v": 2}, {"t": "b", "n": 1, "v": 3}]
    groups = harness.group_records(records, "t", "n")
    assert list(groups) == [("b", 1), ("a", 1)]
    assert [r["v"] for r in groups[("b", 1)]] == [1, 3]


def test_csv_output_writes_only_when_asked_and_returns_the_same_records(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    rows = [("ndv2", 2, 1.234567, None), ("dgx2", 1, 2.0, "x")]
    dry = harness.csv_output(path, ("topology", "nodes", "us", "note"), rows, key=lambda row: row[0], write=False)
    assert not path.exists()
    written = harness.csv_output(path, ("topology", "nodes", "us", "note"), rows, key=lambda row: row[0], write=True)
    assert dry == written == harness.read_csv(path)
    assert written[0] == {"topology": "dgx2", "nodes": 1, "us": 2.0, "note": "x"}
    assert written[1]["us"] == 1.2346 and written[1]["note"] is None


# -- no script repeats the harness ---------------------------------------------------------------------


def _string_argument(call: ast.Call) -> str | None:
    first = call.args[0] if call.args else None
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _is_stderr(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "stderr"


def repeated_harness(source: str, check_flags: bool = True) -> list[str]:
    """Return what a script's source does itself that the harness does: log, sys.path, shared flags, tables."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "_log":
            found.append(f"line {node.lineno}: defines _log")
        if isinstance(node, ast.ImportFrom) and node.module in ("benchmarks_md", "taccl_py.cli._output"):
            found.append(f"line {node.lineno}: imports {node.module} (the harness has it)")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "print":
            if any(keyword.arg == "file" and _is_stderr(keyword.value) for keyword in node.keywords):
                found.append(f"line {node.lineno}: prints to stderr (use log)")
        if isinstance(func, ast.Attribute) and func.attr == "insert" and ast.unparse(func.value) == "sys.path":
            found.append(f"line {node.lineno}: inserts into sys.path")
        if check_flags and isinstance(func, ast.Attribute) and func.attr == "add_argument":
            if _string_argument(node) in SHARED_FLAGS:
                found.append(f"line {node.lineno}: defines {_string_argument(node)} (use its add_*_argument)")
        if check_flags and isinstance(func, ast.Attribute) and func.attr == "ArgumentParser":
            found.append(f"line {node.lineno}: builds its own ArgumentParser (use argument_parser)")
    return found


def test_the_check_finds_each_repeated_piece() -> None:
    source = (
        "import argparse, sys\n"
        "from benchmarks_md import write_csv\n"
        "sys.path.insert(0, 'scripts')\n"
        "def _log(message):\n"
        "    print(message, file=sys.stderr, flush=True)\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--nodes', default='1,2,4')\n"
        "parser.add_argument('--steps', type=int)\n"
    )
    found = repeated_harness(source)
    expected = (
        "imports benchmarks_md",
        "inserts into sys.path",
        "defines _log",
        "prints to stderr",
        "builds its own ArgumentParser",
        "defines --nodes",
    )
    assert sorted(line.split(": ", 1)[1].split(" (")[0] for line in found) == sorted(expected), found
    assert repeated_harness(source, check_flags=False) == [
        line for line in found if "ArgumentParser" not in line and "--nodes" not in line
    ]


def test_every_benchmark_script_was_found() -> None:
    assert len(BENCH_SCRIPTS) >= 16


@pytest.mark.parametrize("path", BENCH_SCRIPTS, ids=lambda path: path.name)
def test_benchmark_scripts_take_the_harness_not_a_copy(path: Path) -> None:
    assert repeated_harness(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("name", OTHER_SCRIPTS)
def test_other_scripts_log_through_the_harness(name: str) -> None:
    # their own flags (rechoose_bands' --write, build_algorithms' --no-write) mean something else
    assert repeated_harness((SCRIPTS / name).read_text(encoding="utf-8"), check_flags=False) == []
