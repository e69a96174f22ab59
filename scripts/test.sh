#!/usr/bin/env bash
# Set up .venv (if missing), install opbuffer with its test extras, run pytest.
# Extra arguments go to pytest, e.g.:  bash scripts/test.sh -m "not spark" -q
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO_ROOT="$(pwd)"

if command -v python3.11 >/dev/null 2>&1; then
    PYTHON_BOOTSTRAP=python3.11
else
    PYTHON_BOOTSTRAP=python3
fi

VENV="$REPO_ROOT/.venv"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    echo "test.sh: creating $VENV with $PYTHON_BOOTSTRAP" >&2
    rm -rf "$VENV"
    "$PYTHON_BOOTSTRAP" -m venv "$VENV"
fi
PY="$VENV/bin/python"

echo "test.sh: installing opbuffer[test] into .venv (pip -qq: only errors are shown)" >&2
"$PY" -m pip install -qq --upgrade pip
"$PY" -m pip install -qq -e '.[test]'

export PYSPARK_PYTHON="$PY"
export PYSPARK_DRIVER_PYTHON="$PY"

set +e
"$PY" -m pytest "$@"
rc=$?
set -e

if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests (exit code 5); treating that as a failure" >&2
    exit 1
fi
exit "$rc"
