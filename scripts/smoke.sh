#!/usr/bin/env bash
# The smoke run on one Python (README, "Set-up"; CI makes it on 3.12 and 3.13):
#
#   scripts/smoke.sh PYTHON [REQUIREMENT ...]
#
# PYTHON is an interpreter on PATH or a path (python3.12, /usr/bin/python3.13) or a pyenv version
# (3.12). In a fresh venv (.venv-smoke-X.Y) with the newest dependencies pip resolves, each
# REQUIREMENT (e.g. 'pulp>=4') pinned, it runs the README's set-up command, the same synthesis
# with --solver cbc (which must work or say in one line how to get CBC), and, with the test,
# runtime and cbc extras added, the tests marked smoke: the CLI, synthesis on small machines,
# the solvers under this pulp (CBC from the cbc extra), the runtime on gloo.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
    echo "usage: scripts/smoke.sh PYTHON [REQUIREMENT ...]" >&2
    exit 2
fi
want=$1
shift
if command -v "$want" >/dev/null 2>&1 && "$want" -c '' >/dev/null 2>&1; then
    python=$(command -v "$want")
elif command -v pyenv >/dev/null 2>&1 && prefix=$(pyenv prefix "$want" 2>/dev/null); then
    python=$prefix/bin/python3
else
    echo "smoke: no Python '$want' here (neither on PATH nor a pyenv version)" >&2
    exit 2
fi
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
venv=.venv-smoke-$version
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
say() { echo "smoke $version: $*"; }

say "the set-up command (${*:-newest dependencies})"
rm -rf "$venv"
"$python" -m venv "$venv" && "$venv/bin/pip" install -q -e . "$@" \
    && "$venv/bin/taccl" synthesize --topology ndv2 --nodes 2 --collective allgather --size 64MB \
        -o "$out/ndv2x2-allgather.json" --xml "$out/ndv2x2-allgather.xml"
"$venv/bin/python" -c 'import importlib.metadata as m, sys
print("smoke: python", sys.version.split()[0], *(f"{p} {m.version(p)}" for p in ("pulp", "highspy", "numpy", "networkx")))'

say "--solver cbc"
set +e
"$venv/bin/taccl" synthesize --topology ndv2 --collective allgather --size 1MB --solver cbc \
    -o "$out/cbc.json" 2>"$out/cbc.err"
status=$?
set -e
if [ $status -eq 0 ]; then
    say "CBC ran: $("$venv/bin/python" -c 'from taccl_py.solvers import SolverOptions as O, describe_solver as d
print(d(O("cbc")))')"
elif [ $status -eq 2 ] && [ "$(wc -l <"$out/cbc.err")" -eq 1 ] && grep -q "no CBC program found" "$out/cbc.err"; then
    say "no CBC here, and one line says how to get it: $(cat "$out/cbc.err")"
else
    cat "$out/cbc.err" >&2
    say "--solver cbc failed (exit $status)" >&2
    exit 1
fi

say "the smoke tests"
"$venv/bin/pip" install -q -e '.[test,runtime,cbc]' torch==2.13.0 "$@"
"$venv/bin/python" -m pytest -q -m smoke
