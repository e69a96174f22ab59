# Sourced by demo.sh and test.sh: create .venv in the repository if it is missing
# or broken, install opbuffer into it (with the extras in $1, e.g. "[test]"), and
# point PySpark's workers at it. Sets PY to the venv's python.
# Usage: source scripts/_venv.sh "<extras>" "<caller name>"

_extras="${1:-}"
_caller="${2:-setup}"

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO_ROOT="$(pwd)"

if command -v python3.11 >/dev/null 2>&1; then
    PYTHON_BOOTSTRAP=python3.11
else
    PYTHON_BOOTSTRAP=python3
fi

VENV="$REPO_ROOT/.venv"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    echo "$_caller: creating $VENV with $PYTHON_BOOTSTRAP" >&2
    rm -rf "$VENV"
    "$PYTHON_BOOTSTRAP" -m venv "$VENV"
fi
PY="$VENV/bin/python"

echo "$_caller: installing opbuffer$_extras into .venv (pip -qq: only errors are shown)" >&2
"$PY" -m pip install -qq --upgrade pip
"$PY" -m pip install -qq -e ".$_extras"

export PYSPARK_PYTHON="$PY"
export PYSPARK_DRIVER_PYTHON="$PY"
