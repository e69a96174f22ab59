#!/usr/bin/env bash
# Set up .venv (if missing), install opbuffer with its test extras, run pytest.
# Extra arguments go to pytest, e.g.:  bash scripts/test.sh -m "not spark" -q
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" "[test]" "test.sh"

set +e
"$PY" -m pytest "$@"
rc=$?
set -e

if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests (exit code 5); treating that as a failure" >&2
    exit 1
fi
exit "$rc"
