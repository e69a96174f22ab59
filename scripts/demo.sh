#!/usr/bin/env bash
# Set up .venv (if missing), install opbuffer, run the main job: the state-layer
# benchmark (write-back cache over RocksDB). Extra arguments go to the job.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" "" "demo.sh"

exec "$PY" -m benchmarks.state_cache --size 300000 "$@"
