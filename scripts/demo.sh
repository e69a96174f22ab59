#!/usr/bin/env bash
# Set up .venv (if missing), install opbuffer with the demo extra (matplotlib), and
# run the main job: examples/tweet_stats.py, per-tweet views and viewers over a
# skewed stream on local Spark through buffering.spark.run_stream, compared with
# Spark's own applyInPandasWithState on the same data (per-batch numbers, the
# speedup, a check that both agree, and a PNG chart).
# Extra arguments go to the job, e.g.:  bash scripts/demo.sh --views 100000 --out /tmp/tweets
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" "[demo]" "demo.sh"

exec "$PY" examples/tweet_stats.py "$@"
