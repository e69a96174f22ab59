#!/usr/bin/env bash
# Set up .venv (if missing), install opbuffer, run the main job: the state-layer
# benchmark (write-back cache over RocksDB). Extra arguments go to the job.
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
    echo "demo.sh: creating $VENV with $PYTHON_BOOTSTRAP" >&2
    rm -rf "$VENV"
    "$PYTHON_BOOTSTRAP" -m venv "$VENV"
fi
PY="$VENV/bin/python"

echo "demo.sh: installing opbuffer into .venv (pip -qq: only errors are shown)" >&2
"$PY" -m pip install -qq --upgrade pip
"$PY" -m pip install -qq -e .

export PYSPARK_PYTHON="$PY"
export PYSPARK_DRIVER_PYTHON="$PY"

exec "$PY" -m benchmarks.state_cache --size 300000 "$@"
