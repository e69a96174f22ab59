"""Spark's own call shapes: move a stateful job onto opbuffer by changing one call.

A Spark job::

    out = (events.withWatermark("ts", "30 minutes")
           .groupBy("user")
           .applyInPandasWithState(sessionize, "user long, n long", "n long", "Update", "EventTimeTimeout"))
    query = (out.writeStream.outputMode("update").foreachBatch(write)
             .option("checkpointLocation", "/ckpt/sessions").trigger(availableNow=True).start())

becomes::

    from buffering.spark import applyInPandasWithState

    out = applyInPandasWithState(events.withWatermark("ts", "30 minutes").groupBy("user"),
                                 sessionize, "user long, n long", "n long", "Update", "EventTimeTimeout")
    query = (out.writeStream.outputMode("update").foreachBatch(write)
             .option("checkpointLocation", "/ckpt/sessions").trigger(availableNow=True).start())

Everything else keeps Spark's names and meaning: the grouped data, the output
and state schemas, the output mode, the timeout or time mode, the initial state
as a ``GroupedData``, the watermark of the stream's own ``withWatermark``, and
the ``writeStream`` chain (``outputMode``, ``format``, ``option(s)``,
``trigger``, ``queryName``, ``foreachBatch``, ``start``, ``toTable``). The
result is written only through ``.writeStream``: exactly-once needs the
runner's own foreachBatch, which commits the state version of a batch only
after the sink has taken the batch (see :class:`StatefulStream`). opbuffer's
own knobs (``parallelism``, ``placement``, ``memory_budget``, ...) go to the
entry as keywords and reach :func:`~buffering.spark.run_stream` unchanged.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable, Mapping, Optional

from .sinks import DeltaSink, NoopSink, ParquetSink

#: Spark's output modes for these operators (case-insensitive, as Spark takes them).
OUTPUT_MODES = ("append", "update")

#: File formats written one directory per batch id (a re-run batch replaces its directory: idempotent).
_FILE_FORMATS = ("json", "csv", "orc", "text")


def _output_mode(mode: Any) -> str:
    if not isinstance(mode, str) or mode.lower() not in OUTPUT_MODES:
        raise ValueError(
            f"outputMode must be one of 'Append' or 'Update' (as Spark's applyInPandasWithState / "
            f"transformWithStateInPandas take it), got {mode!r}"
        )
    return mode.lower()


def grouping_of(grouped: Any) -> tuple[Any, list[str]]:
    """The DataFrame and the grouping column names of ``df.groupBy(...)`` (classic or Spark Connect).

    PySpark's GroupedData keeps its DataFrame in ``_df`` (Spark's own group_ops read it
    there; there is no public accessor). The column names are read from the schema of
    a lazy ``count()`` over the grouping (no job runs): its first columns are the keys.
    """
    df = getattr(grouped, "_df", None)
    if df is None or not hasattr(grouped, "count"):
        raise TypeError(f"expected the grouped data of df.groupBy(...), got {type(grouped).__name__}: {grouped!r}")
    names = list(grouped.count().columns[:-1])
    missing = [n for n in names if n not in df.columns]
    if not names or missing:
        raise ValueError(
            f"group by column names only (opbuffer keys are columns of the DataFrame): {missing or names!r} "
            f"are not among {df.columns}; add the expression as a column first (withColumn) and group by its name"
        )
    return df, names


class StatefulStream:
    """The output of opbuffer's ``applyInPandasWithState`` / ``transformWithStateInPandas``, before it is written.

    Write it as Spark's output: ``.writeStream`` gives a writer with the methods of
    Spark's DataStreamWriter. It is not a DataFrame: exactly-once needs the runner's
    own foreachBatch to commit a batch's state version after the sink took the batch,
    so further transformations belong in your ``foreachBatch`` function (or a later
    query over what the sink wrote).
    """

    def __init__(self, df: Any, fn: Any, run_options: Mapping[str, Any]) -> None:
        self._df = df
        self._fn = fn
        self._run_options = dict(run_options)

    @property
    def writeStream(self) -> "StatefulStreamWriter":
        return StatefulStreamWriter(self)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(
            f"{type(self).__name__} has no {name!r}: the output of opbuffer's stateful operator is written with "
            ".writeStream only (exactly-once commits each batch's state after the sink took it); transform the rows "
            "in a foreachBatch function, or in a query over what the sink wrote"
        )

    def __repr__(self) -> str:
        return f"StatefulStream({self._fn!r}, key={self._run_options.get('key')!r})"


class StatefulStreamWriter:
    """Spark's ``DataStreamWriter`` for a :class:`StatefulStream`: the same methods, started by :meth:`start`.

    Sinks: ``foreachBatch(fn)`` (your function gets each batch with its id; make it
    idempotent by batch id for end-to-end exactly-once), ``format("parquet")`` /
    ``"delta"`` (idempotent by batch id: a directory per batch), ``"json"`` / ``"csv"``
    / ``"orc"`` / ``"text"`` (a directory per batch, as parquet), ``"console"``,
    ``"memory"`` (a temporary view named by ``queryName``, for tests), ``"noop"``,
    and any other format Spark's batch writer has (``"kafka"`` with its options, ...),
    which is appended to as it is: at-least-once when a batch is re-run after a failure.
    ``toTable(name)`` appends to a table (at-least-once, likewise).
    """

    def __init__(self, stream: StatefulStream) -> None:
        self._stream = stream
        self._format: Optional[str] = None
        self._options: dict[str, str] = {}
        self._output_mode: Optional[str] = None
        self._trigger: Optional[dict[str, Any]] = None
        self._query_name: Optional[str] = None
        self._foreach_batch: Optional[Callable[[Any, int], None]] = None

    def outputMode(self, outputMode: str) -> "StatefulStreamWriter":
        self._output_mode = _output_mode(outputMode)
        return self

    def format(self, source: str) -> "StatefulStreamWriter":
        if not isinstance(source, str) or not source:
            raise ValueError(f"format must name a sink, got {source!r}")
        self._format = source.lower()
        return self

    def option(self, key: str, value: Any) -> "StatefulStreamWriter":
        self._options[str(key)] = value if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
        return self

    def options(self, **options: Any) -> "StatefulStreamWriter":
        for key, value in options.items():
            self.option(key, value)
        return self

    def trigger(
        self,
        *,
        processingTime: Optional[str] = None,
        once: Optional[bool] = None,
        continuous: Optional[str] = None,
        availableNow: Optional[bool] = None,
    ) -> "StatefulStreamWriter":
        given = {k: v for k, v in (("processingTime", processingTime), ("once", once), ("availableNow", availableNow)) if v is not None}
        if continuous is not None:
            raise ValueError(f"trigger(continuous={continuous!r}): continuous processing has no stateful operators in Spark")
        if len(given) != 1:
            raise ValueError(f"give exactly one of processingTime=, once= or availableNow= to trigger(), got {given or 'none'}")
        self._trigger = given
        return self

    def queryName(self, queryName: str) -> "StatefulStreamWriter":
        if not isinstance(queryName, str) or not queryName:
            raise ValueError(f"queryName must be a non-empty string, got {queryName!r}")
        self._query_name = queryName
        return self

    def foreachBatch(self, func: Callable[[Any, int], None]) -> "StatefulStreamWriter":
        if not callable(func):
            raise TypeError(f"foreachBatch takes a callable(batch_df, batch_id), got {func!r}")
        self._foreach_batch = func
        return self

    def foreach(self, f: Any) -> "StatefulStreamWriter":
        raise ValueError("foreach(writer) is not supported: use foreachBatch(func), which gets each batch with its id")

    def toTable(self, tableName: str, **options: Any) -> Any:
        self.options(**options)
        self._format = self._format or "table"
        self._options["__table"] = tableName
        return self.start()

    def start(self, path: Optional[str] = None, format: Optional[str] = None, outputMode: Optional[str] = None,
              queryName: Optional[str] = None, **options: Any) -> Any:
        """Start the query (opbuffer's :func:`~buffering.spark.run_stream`); returns its StreamingQuery."""
        from .stream import run_stream

        if format is not None:
            self.format(format)
        if outputMode is not None:
            self.outputMode(outputMode)
        if queryName is not None:
            self.queryName(queryName)
        self.options(**options)
        if path is not None:
            self._options["path"] = path
        stream = self._stream
        run = dict(stream._run_options)
        spark = stream._df.sparkSession
        checkpoint = self._options.pop("checkpointLocation", None) or run.pop("checkpoint_location", None)
        if checkpoint is None:
            if self._format in ("console", "memory", "noop"):  # as Spark, which takes a temporary one for these
                checkpoint = tempfile.mkdtemp(prefix="opbuffer-checkpoint-")
            else:
                raise ValueError(
                    "checkpointLocation is required: .option('checkpointLocation', PATH) (opbuffer keeps the state "
                    "versions there, and Spark's offsets in PATH/_spark)"
                )
        run.pop("checkpoint_location", None)
        return run_stream(
            stream._df,
            stream._fn,
            checkpoint_location=checkpoint,
            sink=self._sink(spark),
            trigger=self._trigger,
            query_name=self._query_name,
            **run,
        )

    def _sink(self, spark: Any) -> Any:
        if self._foreach_batch is not None:
            if self._format not in (None, "foreachbatch"):
                raise ValueError(f"foreachBatch(...) and format({self._format!r}) name two sinks: keep one")
            return self._foreach_batch
        fmt = self._format
        path = self._options.get("path")
        if fmt is None:
            raise ValueError("no sink: give format(...) (parquet, delta, console, memory, kafka, ...) or foreachBatch(func)")
        if fmt == "console":
            return ConsoleSink(int(self._options.get("numRows", 20)), self._options.get("truncate", "true") != "false")
        if fmt == "memory":
            if self._query_name is None:
                raise ValueError("format('memory') needs queryName(name): the sink is the temporary view of that name")
            return MemorySink(self._query_name, spark)
        if fmt == "noop":
            return NoopSink()
        if fmt == "table":
            return TableSink(self._options.pop("__table"), {k: v for k, v in self._options.items() if k != "path"})
        if fmt in ("parquet", "delta", *_FILE_FORMATS):
            if not path:
                raise ValueError(f"format({fmt!r}) needs a path: start(path) or option('path', ...)")
            if fmt == "parquet":
                return ParquetSink(path)
            if fmt == "delta":
                return DeltaSink(path)
            return FileSink(fmt, path, {k: v for k, v in self._options.items() if k != "path"})
        return FormatSink(fmt, dict(self._options))


class ConsoleSink:
    """Spark's console sink: each batch printed under its id, ``numRows`` rows, truncated or not."""

    def __init__(self, num_rows: int = 20, truncate: bool = True) -> None:
        self.num_rows = num_rows
        self.truncate = truncate

    def __call__(self, df: Any, batch_id: int) -> None:
        print("-------------------------------------------")
        print(f"Batch: {batch_id}")
        print("-------------------------------------------")
        df.show(self.num_rows, self.truncate)

    def __repr__(self) -> str:
        return f"ConsoleSink(num_rows={self.num_rows}, truncate={self.truncate})"


class MemorySink:
    """Spark's memory sink, for tests: every batch's rows in the temporary view ``name``.

    A re-run batch replaces its own rows (kept by batch id), so the view holds each
    committed batch once. It lives in the driver's memory: small outputs only.
    """

    def __init__(self, name: str, session: Any = None) -> None:
        self.name = name
        #: The session whose catalog holds the view: the one that started the query (a batch's
        #: DataFrame belongs to the query's own clone of it, whose temporary views nobody sees).
        self.session = session
        self._batches: dict[int, list[Any]] = {}
        self._schema: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "session": None}

    def __call__(self, df: Any, batch_id: int) -> None:
        self._schema = df.schema
        self._batches[int(batch_id)] = df.collect()
        rows = [row for b in sorted(self._batches) for row in self._batches[b]]
        (self.session or df.sparkSession).createDataFrame(rows, self._schema).createOrReplaceTempView(self.name)

    def __repr__(self) -> str:
        return f"MemorySink({self.name!r})"


class FileSink:
    """A file format (json, csv, orc, text) written to ``path/batch_id=N``: a re-run batch replaces its directory."""

    def __init__(self, fmt: str, path: str, options: Mapping[str, str]) -> None:
        self.fmt, self.path, self.options = fmt, path, dict(options)

    def __call__(self, df: Any, batch_id: int) -> None:
        df.write.format(self.fmt).options(**self.options).mode("overwrite").save(os.path.join(self.path, f"batch_id={batch_id}"))

    def __repr__(self) -> str:
        return f"FileSink({self.fmt!r}, {self.path!r})"


class FormatSink:
    """Any other format of Spark's batch writer (kafka, jdbc, ...), appended to: at-least-once on a re-run batch."""

    def __init__(self, fmt: str, options: Mapping[str, str]) -> None:
        self.fmt, self.options = fmt, dict(options)

    def __call__(self, df: Any, batch_id: int) -> None:
        df.write.format(self.fmt).options(**self.options).mode("append").save()

    def __repr__(self) -> str:
        return f"FormatSink({self.fmt!r})"


class TableSink:
    """``toTable(name)``: appends each batch to the table (at-least-once on a re-run batch)."""

    def __init__(self, table: str, options: Mapping[str, str]) -> None:
        self.table, self.options = table, dict(options)

    def __call__(self, df: Any, batch_id: int) -> None:
        df.write.options(**self.options).mode("append").saveAsTable(self.table)

    def __repr__(self) -> str:
        return f"TableSink({self.table!r})"


def applyInPandasWithState(
    grouped: Any,
    func: Callable[..., Any],
    outputStructType: Any,
    stateStructType: Any,
    outputMode: str,
    timeoutConf: str,
    **options: Any,
) -> StatefulStream:
    """Spark's ``df.groupBy(...).applyInPandasWithState(...)``, run by opbuffer; write it with ``.writeStream``.

    Args:
        grouped: ``df.groupBy(col, ...)`` of a streaming DataFrame (column names).
        func: the function Spark would call, ``func(key, pdf_iter, state)``,
            decorated (``mini_batch``, ``cached_state``) or not.
        outputStructType: the output schema (StructType or DDL string).
        stateStructType: the state schema; the state reads back converted as Spark converts it.
        outputMode: ``"Update"`` or ``"Append"`` (both emit every row the function yields).
        timeoutConf: ``"NoTimeout"``, ``"ProcessingTimeTimeout"`` or ``"EventTimeTimeout"``;
            an event-time timeout takes the stream's own ``withWatermark``.
        options: :func:`~buffering.spark.run_stream`'s own knobs (``parallelism``,
            ``placement``, ``memory_budget``, ``max_parallelism``, ``retain``, ...).
    """
    df, key = grouping_of(grouped)
    _output_mode(outputMode)
    return StatefulStream(
        df, func, {"key": key, "output_schema": outputStructType, "state_schema": stateStructType, "timeout": timeoutConf, **options}
    )


def transformWithStateInPandas(
    grouped: Any,
    statefulProcessor: Any,
    outputStructType: Any,
    outputMode: str,
    timeMode: str,
    initialState: Any = None,
    eventTimeColumnName: str = "",
    **options: Any,
) -> StatefulStream:
    """Spark's ``df.groupBy(...).transformWithStateInPandas(...)``, run by opbuffer; write it with ``.writeStream``.

    Args:
        grouped: ``df.groupBy(col, ...)`` of a streaming DataFrame.
        statefulProcessor: the ``StatefulProcessor``, unchanged.
        outputStructType: the output schema.
        outputMode: ``"Update"`` or ``"Append"``.
        timeMode: ``"None"``, ``"ProcessingTime"`` or ``"EventTime"`` (the stream's ``withWatermark``).
        initialState: ``init_df.groupBy(same keys)``, as Spark takes it (a DataFrame is taken too).
        eventTimeColumnName: Spark's name of an output column that carries the event time to a
            later stateful operator; opbuffer's output goes to a sink, so it only has to be a
            column of ``outputStructType`` if given.
        options: :func:`~buffering.spark.run_stream`'s own knobs.
    """
    df, key = grouping_of(grouped)
    _output_mode(outputMode)
    initial = None
    if initialState is not None:
        if hasattr(initialState, "_df") and hasattr(initialState, "count") and not hasattr(initialState, "schema"):
            initial, initial_key = grouping_of(initialState)
            if initial_key != key:
                raise ValueError(f"initialState is grouped by {initial_key}, the stream by {key}: group both by the same columns")
        else:
            initial = initialState
    return StatefulStream(
        df, statefulProcessor, {"key": key, "output_schema": outputStructType, "time_mode": timeMode, "initial_state": initial, **options}
    )


__all__ = [
    "ConsoleSink",
    "FileSink",
    "FormatSink",
    "MemorySink",
    "StatefulStream",
    "StatefulStreamWriter",
    "TableSink",
    "applyInPandasWithState",
    "transformWithStateInPandas",
]
