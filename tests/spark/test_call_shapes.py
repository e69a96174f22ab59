"""Spark's own call shapes: a job moves by changing one call, its writeStream chain as Spark takes it."""

from __future__ import annotations

import os
from typing import Any, Iterator

import pandas as pd
import pytest

from buffering.spark import MemorySink, applyInPandasWithState, run_stream, transformWithStateInPandas
from buffering.spark.sinks import sink_of
from buffering.spark.shapes import ConsoleSink, StatefulStream
from buffering.spark.stream import trigger_of

from .helpers import collect_sink, stream_of, write_batches

SCHEMA = "user long, ts timestamp"
OUTPUT = "user long, n long, event string"


def sessions(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """A user's session closes once the watermark passes 10 s after its last click (Spark's shape)."""
    if state.hasTimedOut:
        (n,) = state.get
        state.remove()
        yield pd.DataFrame({"user": [key[0]], "n": [n], "event": ["closed"]})
        return
    n = state.get[0] if state.exists else 0
    latest = 0
    for pdf in rows:
        n += len(pdf)
        latest = max(latest, int(pdf["ts"].max().value // 1_000_000))
    state.update((n,))
    state.setTimeoutTimestamp(latest + 10_000)
    yield pd.DataFrame({"user": [key[0]], "n": [n], "event": ["open"]})


def _clicks(users: list[int], seconds: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"user": users, "ts": pd.to_datetime(seconds, unit="s").astype("datetime64[us]")})


FILES = [_clicks([1, 2], [1, 2]), _clicks([3], [60]), _clicks([1], [120])]


def _rows(frames: list[pd.DataFrame]) -> list[tuple]:
    return sorted(tuple(r) for f in frames for r in f[["user", "n", "event"]].itertuples(index=False, name=None))


def _per_file(spark: Any, tmp: str, start: Any) -> list[tuple]:
    out: list = []
    for i, frame in enumerate(FILES):
        write_batches(os.path.join(tmp, "in"), [frame], first=i)
        events = stream_of(spark, os.path.join(tmp, "in"), SCHEMA).withWatermark("ts", "5 seconds")
        start(events, collect_sink(out)).awaitTermination()
    return _rows([pdf for _, pdf in sorted(out, key=lambda t: t[0])])


@pytest.mark.spark
def test_the_one_call_change_gives_sparks_rows_with_the_same_write_stream_chain(spark, tmp_path):
    def spark_job(events: Any, sink: Any) -> Any:
        out = events.groupBy("user").applyInPandasWithState(sessions, OUTPUT, "n long", "Update", "EventTimeTimeout")
        return (out.writeStream.outputMode("update").foreachBatch(sink)
                .option("checkpointLocation", str(tmp_path / "ck-spark")).trigger(availableNow=True).start())

    def opbuffer_job(events: Any, sink: Any) -> Any:
        out = applyInPandasWithState(events.groupBy("user"), sessions, OUTPUT, "n long", "Update", "EventTimeTimeout")
        return (out.writeStream.outputMode("update").foreachBatch(sink)
                .option("checkpointLocation", str(tmp_path / "ck-opbuffer")).trigger(availableNow=True).start())

    reference = _per_file(spark, str(tmp_path / "spark"), spark_job)
    assert any(r[2] == "closed" for r in reference)
    assert _per_file(spark, str(tmp_path / "opbuffer"), opbuffer_job) == reference


@pytest.mark.spark
def test_a_memory_sink_is_the_temporary_view_named_by_query_name(spark, tmp_path):
    write_batches(str(tmp_path / "in"), FILES)
    events = stream_of(spark, str(tmp_path / "in"), SCHEMA).withWatermark("ts", "5 seconds")
    out = applyInPandasWithState(events.groupBy("user"), sessions, OUTPUT, "n long", "Update", "EventTimeTimeout")
    query = out.writeStream.format("memory").queryName("shapes_sessions").trigger(availableNow=True).start()
    query.awaitTermination()
    got = spark.sql("select user, n, event from shapes_sessions").toPandas()
    assert sorted(got.itertuples(index=False, name=None)) == sorted(
        [(1, 1, "open"), (2, 1, "open"), (3, 1, "open"), (1, 2, "open"), (2, 1, "closed"), (3, 1, "closed")]
    )


@pytest.mark.spark
def test_a_processor_takes_its_initial_state_as_grouped_data(spark, tmp_path):
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import LongType, StructField, StructType

    class Running(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.total = handle.getValueState("total", StructType([StructField("v", LongType())]))

        def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
            self.total.update((int(initialState["start"].iloc[0]),))

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[pd.DataFrame]:
            total = (self.total.get()[0] if self.total.exists() else 0) + sum(len(pdf) for pdf in rows)
            self.total.update((total,))
            yield pd.DataFrame({"user": [key[0]], "total": [total]})

        def close(self) -> None:
            pass

    write_batches(str(tmp_path / "in"), [_clicks([1, 2, 2], [1, 2, 3])])
    initial = spark.createDataFrame(pd.DataFrame({"user": [1, 2], "start": [10, 20]}))
    out: list = []
    stream = transformWithStateInPandas(
        stream_of(spark, str(tmp_path / "in"), SCHEMA).groupBy("user"), Running(), "user long, total long",
        "Update", "None", initialState=initial.groupBy("user"),
    )
    (stream.writeStream.foreachBatch(collect_sink(out)).option("checkpointLocation", str(tmp_path / "ck"))
     .trigger(availableNow=True).start().awaitTermination())
    assert sorted(tuple(r) for _, f in out for r in f.itertuples(index=False, name=None)) == [(1, 11), (2, 22)]


@pytest.mark.spark
def test_the_output_is_written_through_write_stream_only(spark, tmp_path):
    write_batches(str(tmp_path / "in"), FILES[:1])
    out = applyInPandasWithState(
        stream_of(spark, str(tmp_path / "in"), SCHEMA).groupBy("user"), sessions, OUTPUT, "n long", "Update", "NoTimeout"
    )
    assert isinstance(out, StatefulStream)
    with pytest.raises(AttributeError, match="writeStream"):
        out.select("user")


@pytest.mark.spark
def test_grouping_by_an_expression_is_refused_naming_it(spark, tmp_path):
    from pyspark.sql import functions as F

    write_batches(str(tmp_path / "in"), FILES[:1])
    events = stream_of(spark, str(tmp_path / "in"), SCHEMA)
    with pytest.raises(ValueError, match=r"user \+ 1"):
        applyInPandasWithState(events.groupBy(F.col("user") + 1), sessions, OUTPUT, "n long", "Update", "NoTimeout")


@pytest.mark.spark
def test_an_output_mode_spark_does_not_take_is_refused_naming_it(spark, tmp_path):
    write_batches(str(tmp_path / "in"), FILES[:1])
    events = stream_of(spark, str(tmp_path / "in"), SCHEMA)
    with pytest.raises(ValueError, match="'Complete'"):
        applyInPandasWithState(events.groupBy("user"), sessions, OUTPUT, "n long", "Complete", "NoTimeout")
    with pytest.raises(ValueError, match="'complete'"):
        run_stream(events, sessions, key="user", output_schema=OUTPUT, checkpoint_location=str(tmp_path / "ck"),
                   sink="noop", output_mode="complete")


def test_triggers_take_sparks_spellings():
    assert trigger_of("availableNow") == {"availableNow": True}
    assert trigger_of("once") == {"once": True}
    assert trigger_of("10 seconds") == {"processingTime": "10 seconds"}
    assert trigger_of({"processingTime": "1 minute"}) == {"processingTime": "1 minute"}
    assert trigger_of(None) is None
    with pytest.raises(ValueError, match="'sometimes'"):
        trigger_of("sometimes")


def test_sinks_take_console_and_memory_by_name():
    assert isinstance(sink_of("console"), ConsoleSink)
    memory = sink_of("memory:results")
    assert isinstance(memory, MemorySink) and memory.name == "results"
    with pytest.raises(ValueError, match="'kafka'"):
        sink_of("kafka")



@pytest.mark.spark
def test_a_query_keeps_the_metrics_of_its_last_hundred_batches_as_spark_keeps_recent_progress(spark, tmp_path):
    from buffering.spark.stream import RECENT_BATCHES, BatchMetrics

    write_batches(str(tmp_path / "in"), FILES[:1])
    query = run_stream(stream_of(spark, str(tmp_path / "in"), SCHEMA), sessions, key="user", output_schema=OUTPUT,
                       checkpoint_location=str(tmp_path / "ck"), sink="noop", trigger="availableNow",
                       timeout="event", event_time="ts")
    query.awaitTermination()
    ran = [m.batch_id for m in query.batch_metrics]
    assert ran == [0, 1]  # its rows, then the batch without data that fires what the watermark allows
    for b in range(2, RECENT_BATCHES + 50):  # as if the query had run that many more batches
        query.runner.batches.append(BatchMetrics(batch_id=b))
    assert [m.batch_id for m in query.batch_metrics] == list(range(50, RECENT_BATCHES + 50))
    assert [m.batch_id for m in query.runner.recorded_batches()] == ran  # every batch it ran, from the checkpoint
