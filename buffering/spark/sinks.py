"""Built-in sinks for :func:`buffering.spark.run_stream`, idempotent by batch id.

A sink is any ``callable(out_df, batch_id)``. The runner may hand it the same
batch id twice (a batch re-run after a crash before its commit), always with
the same rows, so a sink that overwrites or skips by batch id makes the job
exactly-once end to end.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Union

Sink = Callable[[Any, int], None]


class ParquetSink:
    """Writes each batch to ``{path}/batch_id={N}``, replacing what a previous attempt of N wrote.

    Read the result back with ``spark.read.parquet(path)`` (``batch_id`` is a
    partition column) or :meth:`read`.
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"]) -> None:
        self.path = os.fspath(path)
        if not self.path:
            raise ValueError("ParquetSink needs a directory path, got an empty string")

    def __call__(self, df: Any, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(f"{self.path.rstrip('/')}/batch_id={int(batch_id)}")

    def read(self, spark: Any) -> Any:
        """Everything written so far, with a ``batch_id`` column."""
        return spark.read.option("basePath", self.path).parquet(f"{self.path.rstrip('/')}/batch_id=*")

    def __repr__(self) -> str:
        return f"ParquetSink({self.path!r})"


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
    """A callable sink from ``sink``: a callable, ``"parquet:PATH"``, ``"delta:PATH"`` or ``"noop"``."""
    if isinstance(sink, str):
        kind, _, path = sink.partition(":")
        if kind == "parquet" and path:
            return ParquetSink(path)
        if kind == "delta" and path:
            return DeltaSink(path)
        if sink == "noop":
            return NoopSink()
        raise ValueError(f"sink {sink!r} is not 'parquet:PATH', 'delta:PATH' or 'noop'")
    if not callable(sink):
        raise TypeError(f"sink must be callable(out_df, batch_id) or a sink name, got {sink!r}")
    return sink
