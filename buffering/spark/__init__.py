"""Spark runners for opbuffer operators.

* :func:`applyInPandasWithState` / :func:`transformWithStateInPandas` -- Spark's own call
  shapes over ``df.groupBy(...)``: move a job by changing one call, its ``writeStream``
  chain unchanged (:mod:`buffering.spark.shapes`).
* :func:`run_stream` -- the production path: foreachBatch + repartition by key
  group + mapInPandas, exactly-once through versioned key-group checkpoints,
  restartable at another parallelism.
* :func:`run_batch` -- the same operator over a batch DataFrame (backfills),
  sort-based with state for one key at a time.
* :mod:`buffering.spark.sinks` -- sinks idempotent by batch id.
* :func:`import_state` / :func:`export_state` -- a live ``applyInPandasWithState``
  job's state from its Spark checkpoint into an opbuffer checkpoint, and back
  out in the shape of Spark's ``initialState``.

The decorated function itself stays a valid ``applyInPandasWithState``
function (see :mod:`buffering.decorators`).
"""

from .sinks import DeltaSink, NoopSink, ParquetSink
from .migrate import export_state, import_state
from .stream import BatchMetrics, StreamRunner, run_stream
from .shapes import MemorySink, ConsoleSink, StatefulStream, applyInPandasWithState, transformWithStateInPandas

try:  # the bounded runner lands separately
    from .bounded import run_batch
except ImportError:  # pragma: no cover
    pass

__all__ = [
    "BatchMetrics",
    "ConsoleSink",
    "DeltaSink",
    "MemorySink",
    "NoopSink",
    "ParquetSink",
    "StatefulStream",
    "StreamRunner",
    "applyInPandasWithState",
    "export_state",
    "import_state",
    "run_batch",
    "run_stream",
    "transformWithStateInPandas",
]
