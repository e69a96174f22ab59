"""Built-in sinks for :func:`buffering.spark.run_stream`, idempotent by batch id.

A sink is any ``callable(out_df, batch_id)``. The runner may hand it the same
batch id twice (a batch re-run after a crash before its commit), always with
the same rows, so a sink that overwrites or skips by batch id makes the job
exactly-once end to end.
"""

from __future__ import annotations

import os
import shutil
import uuid
from typing import Any, Callable, Optional, Union

Sink = Callable[[Any, int], None]

#: Marker Spark's own writer also leaves in a finished output directory.
SUCCESS_FILE = "_SUCCESS"


class ParquetSink:
    """Writes each batch to ``{path}/batch_id={N}``, replacing what a previous attempt of N wrote.

    Read the result back with ``spark.read.parquet(path)`` (``batch_id`` is a
    partition column) or :meth:`read`.

    On a local path (no URI scheme, or ``file:``) the operator tasks write
    their output themselves, one ``part-{task}.parquet`` each (pyarrow, an
    atomic rename), so a batch costs one Spark job instead of two (persist
    the output, then write it): see :meth:`local_dir`. Other paths go through
    ``DataFrame.write``.
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], *, task_side: bool = True) -> None:
        self.path = os.fspath(path)
        if not self.path:
            raise ValueError("ParquetSink needs a directory path, got an empty string")
        self.task_side = bool(task_side)

    def __call__(self, df: Any, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(f"{self.path.rstrip('/')}/batch_id={int(batch_id)}")

    # ------------------------------------------------------------ written by the tasks
    def local_dir(self) -> Optional[str]:
        """The local directory the tasks write to, or None when Spark must write (remote path, or disabled)."""
        if not self.task_side:
            return None
        path = self.path
        if path.startswith("file://"):
            path = path[len("file://"):]
        elif path.startswith("file:"):
            path = path[len("file:"):]
        elif "://" in path:
            return None
        return os.path.abspath(path)

    def batch_dir(self, batch_id: int) -> str:
        local = self.local_dir()
        if local is None:
            raise ValueError(f"{self!r} is not written by the tasks")
        return os.path.join(local, f"batch_id={int(batch_id)}")

    def prepare(self, batch_id: int) -> None:
        """Driver, before the batch runs: drop what an earlier run of this batch id wrote."""
        shutil.rmtree(self.batch_dir(batch_id), ignore_errors=True)

    def finish(self, batch_id: int) -> None:
        """Driver, after every task wrote its part: mark the batch complete, drop failed attempts' leftovers."""
        directory = self.batch_dir(batch_id)
        os.makedirs(directory, exist_ok=True)
        for name in os.listdir(directory):
            if name.startswith(".part-"):
                os.remove(os.path.join(directory, name))
        with open(os.path.join(directory, SUCCESS_FILE), "wb"):
            pass

    def read(self, spark: Any) -> Any:
        """Everything written so far, with a ``batch_id`` column."""
        return spark.read.option("basePath", self.path).parquet(f"{self.path.rstrip('/')}/batch_id=*")

    def __repr__(self) -> str:
        return f"ParquetSink({self.path!r})"


def write_task_part(directory: str, task: int, frame: Any, schema: Any) -> int:
    """Worker: write one task's output rows (a pandas frame) as ``part-{task}.parquet``; returns the rows.

    Written under a hidden temporary name and renamed, so a reader sees the
    whole file or none; a retried or speculative attempt of the task writes
    the same rows to the same name.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    table = pa.Table.from_pandas(frame, schema=schema, preserve_index=False)
    tmp = os.path.join(directory, f".part-{task:05d}-{uuid.uuid4().hex}.parquet")
    pq.write_table(table, tmp)
    os.replace(tmp, os.path.join(directory, f"part-{task:05d}.parquet"))
    return table.num_rows


class DeltaSink:
    """Appends each batch to a Delta table with Delta's idempotent-write options (needs ``delta-spark``).

    ``txnAppId``/``txnVersion`` make Delta skip a batch id it has already
    written for this ``app_id``.
    """

    def __init__(self, path: str, app_id: Optional[str] = None) -> None:
        try:
            import delta  # noqa: F401
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError("DeltaSink needs delta-spark: pip install delta-spark") from err
        self.path = path
        self.app_id = app_id or f"opbuffer:{path}"

    def __call__(self, df: Any, batch_id: int) -> None:  # pragma: no cover - needs delta-spark
        (
            df.write.format("delta")
            .option("txnAppId", self.app_id)
            .option("txnVersion", int(batch_id))
            .mode("append")
            .save(self.path)
        )

    def __repr__(self) -> str:
        return f"DeltaSink({self.path!r})"


class NoopSink:
    """Computes the batch and drops it (benchmarks: what the operator costs, not the sink)."""

    def __call__(self, df: Any, batch_id: int) -> None:
        df.write.format("noop").mode("overwrite").save()

    def __repr__(self) -> str:
        return "NoopSink()"


def sink_of(sink: Any) -> Sink:
    """A callable sink from ``sink``: a callable, ``"parquet:PATH"``, ``"delta:PATH"``, ``"console"``,
    ``"memory:NAME"`` (a temporary view of that name, for tests) or ``"noop"``."""
    if isinstance(sink, str):
        kind, _, path = sink.partition(":")
        if kind == "parquet" and path:
            return ParquetSink(path)
        if kind == "delta" and path:
            return DeltaSink(path)
        if sink == "noop":
            return NoopSink()
        if sink == "console":
            from .shapes import ConsoleSink

            return ConsoleSink()
        if kind == "memory" and path:
            from .shapes import MemorySink

            return MemorySink(path)
        raise ValueError(f"sink {sink!r} is not 'parquet:PATH', 'delta:PATH', 'console', 'memory:NAME' or 'noop'")
    if not callable(sink):
        raise TypeError(f"sink must be callable(out_df, batch_id) or a sink name, got {sink!r}")
    return sink
