"""Same answers as Spark: the upstream applyInPandasWithState scenarios through every runner.

The user functions are ported from PySpark's
``python/pyspark/sql/tests/pandas/test_pandas_grouped_map_with_state.py`` and
from the Python source strings of Spark's ``FlatMapGroupsInPandasWithStateSuite.scala``.
Each scenario's input goes through a parquet file source, one micro-batch per
file, and runs through four runners:

* ``spark``: plain ``groupBy().applyInPandasWithState`` (the reference);
* ``passthrough``: the decorated function under Spark's own applyInPandasWithState;
* ``run_stream``: opbuffer's Spark runner, called in Spark's shape (``buffering.spark.applyInPandasWithState`` over
  ``df.groupBy(...)``, with the reference's ``writeStream`` chain);
* ``local``: opbuffer's LocalRunner over the same files read with ``pd.read_parquet``.

Every runner's output rows over the whole stream (a multiset) must equal the
reference's, except where ``documented`` names a difference listed in the
README's "Documented differences" and the exact rows the runner gives instead. Porting changes, forced by the file source
and the lack of Spark's manual clock in Python: processing-time timeouts use a
1 ms duration (every batch after a key's last data times it out, as the
upstream's clock advances do); the random worker failure is deterministic (one
raise per runner, retried).

Run ``python -m tests.spark.test_upstream_parity`` for the comparison table.
"""

from __future__ import annotations

import datetime as dt
import contextlib
import glob
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pandas as pd
import pytest

import buffering
from buffering import LocalRunner
from buffering.spark import applyInPandasWithState

from .helpers import collect_sink, stream_of, write_batches

pytestmark = [pytest.mark.spark, pytest.mark.slow]

RUNNERS = ("spark", "passthrough", "run_stream", "local")


# ---------------------------------------------------------------- the user functions (ported)


def basic(key, pdf_iter, state):
    from pyspark.sql.streaming.state import GroupState

    assert isinstance(state, GroupState)
    total_len = 0
    for pdf in pdf_iter:
        total_len += len(pdf)
    state.update((total_len,))
    assert state.get[0] == 1
    yield pd.DataFrame({"key": [key[0]], "countAsString": [str(total_len)]})


def basic_no_state(key, pdf_iter, state):
    from pyspark.sql.streaming.state import GroupState

    assert isinstance(state, GroupState)
    yield pd.DataFrame({"key": [key[0], "foo"], "countAsString": ["100", "222"]})


def basic_no_state_no_data(key, pdf_iter, state):
    yield pd.DataFrame({"key": [], "countAsString": []})


def basic_more_data(key, pdf_iter, state):
    state.update((1,))
    yield pd.DataFrame({"key": [key[0], "foo", key[0] + "_2"], "countAsString": ["1", "666", "2"]})


def basic_fewer_data(key, pdf_iter, state):
    state.update((1,))
    yield pd.DataFrame({"key": [], "countAsString": []})


def basic_with_null(key, pdf_iter, state):
    total_len = 0
    for pdf in pdf_iter:
        total_len += len(pdf)
    state.update((total_len,))
    assert state.get[0] == 1
    yield pd.DataFrame({"key": [None], "countAsString": [str(total_len)]})


def null_keys(key, pdf_iter, state):
    """Null grouping keys (not upstream): the key Spark hands over, and a running count."""
    count = state.get[0] if state.exists else 0
    for pdf in pdf_iter:
        count += len(pdf)
    state.update((count,))
    yield pd.DataFrame({"key": [repr(key)], "types": [repr([type(k).__name__ for k in key])], "count": [count]})


def failing_once(marker: str) -> Callable:
    def func(key, pdf_iter, state):
        if key[0] == "c" and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("deterministic worker failure")
        count = state.getOption
        count = 0 if count is None else count[0]
        for pdf in pdf_iter:
            count += len(pdf)
        state.update((count,))
        yield pd.DataFrame({"value": [key[0]], "count": [count]})

    return func


def running_count(key, pdf_iter, state):
    assert state.getCurrentProcessingTimeMs() >= 0
    try:
        state.getCurrentWatermarkMs()
        assert False
    except RuntimeError as e:
        assert "watermark" in str(e)
    count = state.getOption
    count = 0 if count is None else count[0]
    for pdf in pdf_iter:
        count += len(pdf)
        state.update((count,))
    if count >= 3:
        state.remove()
        yield pd.DataFrame()
    else:
        yield pd.DataFrame({"key": [key[0]], "countAsString": [str(count)]})


def multiple_outputs(key, pdf_iter, state):
    prev_count = state.getOption
    prev_count = 0 if prev_count is None else prev_count[0]
    count = prev_count
    for pdf in pdf_iter:
        count += len(pdf)
        yield pdf.assign(valueAsString=lambda x: x.value.apply(str), prevCountAsString=str(prev_count))
    state.update((count,))


def count_then_remove(key, pdf_iter, state):
    count = state.getOption
    count = 0 if count is None else count[0]
    for pdf in pdf_iter:
        count += len(pdf)
    state.update((count,))
    if count >= 3:
        state.remove()
        yield pd.DataFrame({"key": [key[0]], "countAsString": [str(-1)]})
    else:
        yield pd.DataFrame({"key": [key[0]], "countAsString": [str(count)]})


def processing_timeout(key, pdf_iter, state):
    if state.hasTimedOut:
        state.remove()
        yield pd.DataFrame({"key": [key[0]], "countAsString": [str(-1)]})
    else:
        count = state.getOption
        count = 0 if count is None else count[0]
        for pdf in pdf_iter:
            count += len(pdf)
        state.update((count,))
        state.setTimeoutDuration(1)
        yield pd.DataFrame({"key": [key[0]], "countAsString": [str(count)]})


def event_timeout(key, pdf_iter, state):
    import calendar

    assert state.getCurrentWatermarkMs() >= -1
    if state.hasTimedOut:
        state.remove()
        yield pd.DataFrame({"key": [key[0]], "maxEventTimeSec": [-1]})
    else:
        m = state.getOption
        max_event_time_sec = 0 if m is None else m[0]
        for pdf in pdf_iter:
            pser = pdf.eventTime.apply(lambda t: int(calendar.timegm(t.utctimetuple()) + t.microsecond))
            max_event_time_sec = int(max(pser.max(), max_event_time_sec))
        state.update((max_event_time_sec,))
        state.setTimeoutTimestamp((max_event_time_sec + 5) * 1000)
        yield pd.DataFrame({"key": [key[0]], "maxEventTimeSec": [max_event_time_sec]})


def chunk_count(key, pdf_iter, state):
    chunks = 0
    for _ in pdf_iter:
        chunks += 1
    yield pd.DataFrame({"key": [key[0]], "chunkCount": [chunks]})


def partial_consume(key, pdf_iter, state):
    num = state.getOption
    num = 0 if num is None else num[0]
    num += 1
    next(pdf_iter)
    state.update((num,))
    yield pd.DataFrame({"key": [key[0]], "numBatches": [num]})


def two_keys_timeout(key, pdf_iter, state):
    if state.hasTimedOut:
        state.remove()
        yield pd.DataFrame({"key1": [key[0]], "key2": [key[1]], "countAsStr": [str(-1)]})
    else:
        count = state.getOption
        count = 0 if count is None else count[0]
        for pdf in pdf_iter:
            count += len(pdf)
        state.update((count,))
        state.setTimeoutDuration(1)
        yield pd.DataFrame({"key1": [key[0]], "key2": [key[1]], "countAsStr": [str(count)]})


def numpy_state(key, pdf_iter, state):
    """SPARK-41260, plus a second call that reads the stored state back (what state_schema converts)."""
    for _ in pdf_iter:
        pass
    if state.exists:
        yield pd.DataFrame({"key": [key[0]], "state": [repr(tuple(state.get))]})
        return
    pdf = pd.DataFrame(
        {
            "int32": [np.int32(1)],
            "int64": [np.int64(1)],
            "float32": [np.float32(1)],
            "float64": [np.float64(1)],
            "bool": [True],
            "datetime": [dt.datetime(1990, 1, 1, 0, 0, 0)],
        }
    )
    state.update(tuple(pdf.iloc[0]))
    assert state.get == (1, 1, 1.0, 1.0, True, dt.datetime(1990, 1, 1, 0, 0, 0))
    yield pd.DataFrame({"key": [key[0]], "state": ["set"]})


# ---------------------------------------------------------------- scenarios


def _values(*batches: list[str]) -> list[pd.DataFrame]:
    return [pd.DataFrame({"value": list(b)}) for b in batches]


@dataclass
class Scenario:
    name: str
    fn: Callable
    batches: list[pd.DataFrame]
    input_schema: str
    key: list[str]
    output_schema: str
    state_schema: str
    timeout: str = "none"  # none | processing | event
    watermark: Optional[tuple[str, int]] = None  # (event time column, delay ms)
    conf: dict[str, str] = field(default_factory=dict)
    #: Spark-side column additions (as the upstream's withColumn(lit(...))), mirrored in pandas.
    extra_columns: dict[str, str] = field(default_factory=dict)
    select: Optional[list[str]] = None
    #: runner -> the README difference that explains its different output, and that output.
    documented: dict[str, "Documented"] = field(default_factory=dict)
    make_fn: Optional[Callable[[str], Callable]] = None  # for fns that need a per-runner marker file
    #: runner -> a known bug being fixed elsewhere: the test expects the difference and fails once it is gone.
    known_bug: dict[str, str] = field(default_factory=dict)


BASIC = dict(input_schema="value string", key=["value"], output_schema="key string, countAsString string", state_schema="c long")


@dataclass(frozen=True)
class Documented:
    """A difference the README lists, with the exact rows the runner gives instead of Spark's."""

    reason: str
    rows: tuple[tuple, ...]


FRAMES_PER_KEY = "frames per key with a small maxRecordsPerBatch"

SCENARIOS = [
    Scenario("basic", basic, _values(["hello", "this"]), **BASIC),
    Scenario("basic_no_state", basic_no_state, _values(["hello", "this"]), **BASIC),
    Scenario("basic_no_state_no_data", basic_no_state_no_data, _values(["hello", "this"]), **BASIC),
    Scenario("basic_more_data", basic_more_data, _values(["hello", "this"]), **BASIC),
    Scenario("basic_fewer_data", basic_fewer_data, _values(["hello", "this"]), **BASIC),
    Scenario("basic_with_null", basic_with_null, _values(["hello", "this"]), **BASIC),
    Scenario(
        "null_grouping_keys",
        null_keys,
        [
            pd.DataFrame({"k": pd.array([1, None, None, 2], dtype="Int64"), "s": ["a", None, "x", None]}),
            pd.DataFrame({"k": pd.array([None, 1], dtype="Int64"), "s": [None, "a"]}),
        ],
        input_schema="k long, s string",
        key=["k", "s"],
        output_schema="key string, types string, count long",
        state_schema="c long",
    ),
    Scenario(
        "worker_failure",
        failing_once("unused"),
        _values(list("abcab"), list("cabd"), list("dca")),
        input_schema="value string",
        key=["value"],
        output_schema="value string, count long",
        state_schema="cnt long",
        make_fn=failing_once,
    ),
    Scenario("running_count", running_count, _values(["a"], ["a", "b"], ["a", "b"], ["a", "c"]), **BASIC),
    Scenario(
        "multiple_outputs_per_key",
        multiple_outputs,
        [
            pd.DataFrame({"key": ["a"], "value": np.array([1], dtype=np.int32)}),
            pd.DataFrame({"key": ["a", "a", "b"], "value": np.array([2, 3, 1], dtype=np.int32)}),
            pd.DataFrame({"key": ["b", "c", "d", "e"], "value": np.array([2, 1, 1, 1], dtype=np.int32)}),
            pd.DataFrame({"key": ["a"], "value": np.array([4], dtype=np.int32)}),
        ],
        input_schema="key string, value int",
        key=["key"],
        output_schema="key string, value int, valueAsString string, prevCountAsString string",
        state_schema="count long",
    ),
    Scenario("streaming_aggregation", count_then_remove, _values(["a"], ["a", "b"], ["a", "b"], ["a", "c"]), **BASIC),
    Scenario(
        "processing_time_timeout",
        processing_timeout,
        _values(["a"], ["b"], ["b"], ["c"]),
        timeout="processing",
        **BASIC,
    ),
    Scenario(
        "event_time_timeout_watermark",
        event_timeout,
        [
            pd.DataFrame({"key": ["a", "a", "a"], "eventTime": pd.to_datetime([11, 13, 15], unit="s").astype("datetime64[us]")}),
            pd.DataFrame({"key": ["a"], "eventTime": pd.to_datetime([4], unit="s").astype("datetime64[us]")}),
            pd.DataFrame({"key": ["a"], "eventTime": pd.to_datetime([10], unit="s").astype("datetime64[us]")}),
            pd.DataFrame({"key": ["b"], "eventTime": pd.to_datetime([31], unit="s").astype("datetime64[us]")}),
        ],
        input_schema="key string, eventTime timestamp",
        key=["key"],
        output_schema="key string, maxEventTimeSec int",
        state_schema="maxEventTimeSec long",
        timeout="event",
        watermark=("eventTime", 10_000),
    ),
    Scenario(
        "chunking_max_records_2",
        chunk_count,
        [pd.DataFrame({"key": list("aaabbbbb")})],
        input_schema="key string",
        key=["key"],
        output_schema="key string, chunkCount int",
        state_schema="notUsed int",
        conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "2"},
        # Spark hands a's 3 rows and b's 5 in frames of 2 (the passthrough too); opbuffer one frame per key.
        documented={runner: Documented(FRAMES_PER_KEY, (("a", 1), ("b", 1))) for runner in ("run_stream", "local")},
    ),
    Scenario(
        "partial_consume_max_records_1",
        partial_consume,
        [pd.DataFrame({"key": list("aabbc")}), pd.DataFrame({"key": list("aabbc")})],
        input_schema="key string",
        key=["key"],
        output_schema="key string, numBatches int",
        state_schema="numBatches int",
        conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "1"},
    ),
    Scenario(
        "SPARK-40670_non_null_columns",
        two_keys_timeout,
        [pd.DataFrame({"key1": ["a"]}), pd.DataFrame({"key1": ["b"]}), pd.DataFrame({"key1": ["b"]})],
        input_schema="key1 string",
        key=["key1", "key2"],
        output_schema="key1 string, key2 string, countAsStr string",
        state_schema="count long",
        timeout="processing",
        extra_columns={"key2": "__FAKE__", "val1": "__FAKE__", "val2": "__FAKE__"},
    ),
    Scenario(
        "SPARK-41261_key_columns_out_of_place",
        two_keys_timeout,
        [pd.DataFrame({"val1": ["a"]}), pd.DataFrame({"val1": ["b"]})],
        input_schema="val1 string",
        key=["key1", "key2"],
        output_schema="key1 string, key2 string, countAsStr string",
        state_schema="count long",
        timeout="processing",
        extra_columns={"key2": "=val1", "val2": "__FAKE__", "key1": "__FAKE__", "val3": "__FAKE__"},
    ),
    Scenario(
        "SPARK-41260_numpy_state",
        numpy_state,
        _values(["a"], ["a"]),
        input_schema="value string",
        key=["value"],
        output_schema="key string, state string",
        state_schema="int32 int, int64 long, float32 float, float64 double, bool boolean, datetime date",
    ),
]


# ---------------------------------------------------------------- runners


def _spark_frame(spark: Any, scenario: Scenario, directory: str) -> Any:
    from pyspark.sql import functions as F

    df = stream_of(spark, directory, scenario.input_schema)
    for name, value in scenario.extra_columns.items():
        df = df.withColumn(name, F.col(value[1:]) if value.startswith("=") else F.lit(value))
    if scenario.watermark is not None:
        df = df.withWatermark(scenario.watermark[0], f"{scenario.watermark[1] // 1000} seconds")
    return df


def _pandas_frame(scenario: Scenario, frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    for name, value in scenario.extra_columns.items():
        frame[name] = frame[value[1:]] if value.startswith("=") else value
    return frame


_SPARK_TIMEOUTS = {"none": "NoTimeout", "processing": "ProcessingTimeTimeout", "event": "EventTimeTimeout"}


def _fn(scenario: Scenario, workdir: str, runner: str) -> Callable:
    if scenario.make_fn is None:
        return scenario.fn
    return scenario.make_fn(os.path.join(workdir, f"failed-once-{runner}"))


def _local_runner(scenario: Scenario, fn: Callable, clock: list[int]) -> LocalRunner:
    """The scenario's LocalRunner, its clock read from ``clock[0]``."""
    return LocalRunner(
        fn,
        key=scenario.key,
        timeout=scenario.timeout,
        event_time=scenario.watermark[0] if scenario.watermark else None,
        watermark_delay_ms=scenario.watermark[1] if scenario.watermark else 0,
        clock=lambda: clock[0],
        key_types=None,
        state_schema=scenario.state_schema,
    )


@contextlib.contextmanager
def _scenario_conf(spark: Any, scenario: Scenario) -> Iterator[None]:
    """The scenario's Spark confs while the block runs, the session's own restored after it."""
    previous = {k: spark.conf.get(k, None) for k in scenario.conf}
    for k, v in scenario.conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in previous.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def _passthrough(fn: Callable) -> Callable:
    """The decorated function, run by Spark's own applyInPandasWithState."""
    return buffering.mini_batch()(buffering.cached_state(max_entries=4)(fn))


def _writer(df: Any, scenario: Scenario, runner: str, fn: Callable, sink: Callable, workdir: str,
            placement: Optional[str] = None) -> Any:
    """The runner's writeStream (before its trigger): Spark's own operator ("spark", "passthrough"), or
    opbuffer's in Spark's call shape with the same chain ("run_stream"; the watermark from withWatermark)."""
    timeout = _SPARK_TIMEOUTS[scenario.timeout]
    grouped = df.groupBy(*scenario.key)
    if runner in ("spark", "passthrough"):
        out = grouped.applyInPandasWithState(fn, scenario.output_schema, scenario.state_schema, "Update", timeout)
    else:
        extra = {"placement": placement} if placement is not None else {}
        out = applyInPandasWithState(grouped, fn, scenario.output_schema, scenario.state_schema, "Update", timeout, **extra)
    checkpoint = os.path.join(workdir, f"ck-{runner}")
    return out.writeStream.outputMode("update").foreachBatch(sink).option("checkpointLocation", checkpoint)


def run_scenario(
    spark: Any, scenario: Scenario, runner: str, workdir: str, per_file: bool = False, placement: Optional[str] = None
) -> list[pd.DataFrame]:
    """The output frames of ``scenario`` under ``runner`` (one per micro-batch).

    ``per_file``: as a scheduled job runs, one ``availableNow`` query run per arriving
    file (LocalRunner: ``process`` then ``idle``); else one query over all files.
    """
    if per_file:
        return _run_per_file(spark, scenario, runner, workdir, placement)
    directory = os.path.join(workdir, "in")
    if not os.path.isdir(directory):
        write_batches(directory, scenario.batches)
    fn = _fn(scenario, workdir, runner)
    if runner == "local":
        clock = [0]
        runner_ = _local_runner(scenario, fn, clock)
        outputs = []
        for path in sorted(glob.glob(os.path.join(directory, "*.parquet"))):
            frame = _pandas_frame(scenario, pd.read_parquet(path))
            clock[0] += 1_000
            try:
                outputs.append(runner_.process(frame))
            except RuntimeError:
                outputs.append(runner_.process(frame))  # the batch is retried, as Spark retries the task
        if scenario.timeout != "processing":  # availableNow ends with the batch without data Spark runs
            outputs.append(runner_.idle())
        runner_.close()
        return outputs
    out: list = []
    with _scenario_conf(spark, scenario):
        df = _spark_frame(spark, scenario, directory)
        if runner in ("spark", "passthrough"):
            f = _passthrough(fn) if runner == "passthrough" else fn
            collect = collect_sink(out)

            def sink(batch_df, batch_id: int) -> None:
                # The batches without data that a processing-time timeout runs after the files are not
                # kept (see below): not collecting them keeps query.stop() from interrupting a collect.
                if scenario.timeout != "processing" or batch_id < len(scenario.batches):
                    collect(batch_df, batch_id)

            writer = _writer(df, scenario, runner, f, sink, workdir)
            if scenario.timeout == "processing":
                # With a processing-time timeout Spark runs batches without data forever (also under
                # availableNow, and processAllAvailable never returns): stop once every file is processed and keep the data batches (ids
                # 0..files-1, one file each), which is what run_stream and LocalRunner run.
                query = writer.start()
                deadline = time.monotonic() + 120
                while not any(b >= len(scenario.batches) - 1 for b, _ in out) and time.monotonic() < deadline:
                    time.sleep(0.1)
                query.stop()
                return [pdf for b, pdf in sorted(out, key=lambda t: t[0]) if b < len(scenario.batches)]
            query = writer.trigger(availableNow=True).start()
        else:  # Spark's call shape (the watermark from the stream's withWatermark), its writeStream chain
            query = _writer(df, scenario, runner, fn, collect_sink(out), workdir).trigger(availableNow=True).start()
        query.awaitTermination()
    return [pdf for _, pdf in sorted(out, key=lambda t: t[0])]


def _run_per_file(spark: Any, scenario: Scenario, runner: str, workdir: str, placement: Optional[str] = None) -> list[pd.DataFrame]:
    """:func:`run_scenario` with one ``availableNow`` run per file, each file written just before its run."""
    assert scenario.timeout != "processing", "with a processing-time timeout Spark's availableNow never ends"
    directory = os.path.join(workdir, f"in-{runner}")
    fn = _fn(scenario, workdir, runner)
    if runner == "local":
        clock = [0]
        local = _local_runner(scenario, fn, clock)
        outputs = []
        for frame in scenario.batches:
            clock[0] += 1_000
            try:
                outputs.append(local.process(_pandas_frame(scenario, frame)))
            except RuntimeError:
                outputs.append(local.process(_pandas_frame(scenario, frame)))  # retried, as Spark retries the task
            outputs.append(local.idle())
        local.close()
        return outputs
    out: list = []
    with _scenario_conf(spark, scenario):
        for i, frame in enumerate(scenario.batches):
            write_batches(directory, [frame], first=i)
            df = _spark_frame(spark, scenario, directory)
            f = _passthrough(fn) if runner == "passthrough" else fn
            writer = _writer(df, scenario, runner, f, collect_sink(out), workdir, placement)
            writer.trigger(availableNow=True).start().awaitTermination()
    return [pdf for _, pdf in sorted(out, key=lambda t: t[0])]


def _plain(value: Any) -> Any:
    if isinstance(value, (np.generic,)):
        value = value.item()
    if isinstance(value, pd.Timestamp):
        value = value.to_pydatetime()
    if value is None or (isinstance(value, float) and value != value) or value is pd.NaT or value is pd.NA:
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def output_rows(frames: list[pd.DataFrame], columns: list[str]) -> list[tuple]:
    """Every output row of the stream (the multiset, sorted), values as plain Python."""
    rows = []
    for frame in frames:
        if not len(frame):
            continue
        for row in frame[columns].itertuples(index=False, name=None):
            rows.append(tuple(_plain(v) for v in row))
    return sorted(rows, key=repr)


def _columns(scenario: Scenario) -> list[str]:
    return [part.strip().split()[0] for part in scenario.output_schema.split(",")]


@pytest.fixture(scope="module")
def utc(spark):
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    yield spark
    spark.conf.set("spark.sql.session.timeZone", previous)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_runner_gives_spark_answers_or_a_documented_difference(utc, scenario, tmp_path):
    results = compare(utc, scenario, str(tmp_path))
    wrong = {runner: verdict for runner, verdict in results.items() if verdict.startswith("DIFFERENT")}
    fixed = [runner for runner in scenario.known_bug if runner not in wrong]
    assert not fixed, f"{fixed} now give Spark's answers: remove known_bug from {scenario.name}"
    unexpected = {runner: verdict for runner, verdict in wrong.items() if runner not in scenario.known_bug}
    assert not unexpected, unexpected
    if wrong:
        pytest.xfail("; ".join(scenario.known_bug.values()))


#: Per file: the scenarios whose answers batches without data decide (event time), and two that restart a
#: query per file with state (and a task failure). Processing-time timeouts never end an availableNow run in Spark.
PER_FILE = [s for s in SCENARIOS if s.timeout == "event" or s.name in ("running_count", "worker_failure")]


@pytest.mark.parametrize("scenario", PER_FILE, ids=[s.name for s in PER_FILE])
def test_every_runner_gives_spark_answers_with_one_available_now_run_per_file(utc, scenario, tmp_path):
    """As scheduled jobs run: each file's run ends with the batches without data Spark runs."""
    results = compare(utc, scenario, str(tmp_path), per_file=True)
    wrong = {runner: verdict for runner, verdict in results.items() if verdict.startswith("DIFFERENT")}
    assert not wrong, wrong


EVENT_TIME = [s for s in SCENARIOS if s.timeout == "event"]


@pytest.mark.parametrize("scenario", EVENT_TIME, ids=[s.name for s in EVENT_TIME])
def test_run_stream_hosted_on_executors_gives_spark_answers_with_one_available_now_run_per_file(utc, scenario, tmp_path):
    """placement="executor": the hosting operator itself makes Spark run the batches without data."""
    results = compare(utc, scenario, str(tmp_path), per_file=True, placement="executor")
    assert results["run_stream"] == "equal", results["run_stream"]


def compare(spark: Any, scenario: Scenario, workdir: str, per_file: bool = False, placement: Optional[str] = None) -> dict[str, str]:
    """runner -> "equal" / "documented difference: ..." / "DIFFERENT: ..." against plain Spark."""
    columns = _columns(scenario)
    reference = output_rows(run_scenario(spark, scenario, "spark", workdir, per_file), columns)
    verdicts = {"spark": "reference"}
    # Per file, the passthrough is Spark's own operator run the same way as the reference: not run again.
    for runner in RUNNERS[1:] if not per_file else ("run_stream", "local"):
        try:
            got = output_rows(run_scenario(spark, scenario, runner, workdir, per_file, placement), columns)
        except Exception as exc:  # reported as a difference, with the error
            got = [("error", f"{type(exc).__name__}: {str(exc)[:300]}")]
        if got == reference:
            verdicts[runner] = "equal"
        elif runner in scenario.documented and got == sorted(scenario.documented[runner].rows, key=repr):
            verdicts[runner] = f"documented difference: {scenario.documented[runner].reason}"
        else:
            verdicts[runner] = f"DIFFERENT: spark {reference} vs {runner} {got}"
    return verdicts


if __name__ == "__main__":  # the comparison table for the README / report
    import sys
    import tempfile

    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2,4]")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    only = set(sys.argv[1:])
    print("| scenario | " + " | ".join(RUNNERS[1:]) + " |")
    print("|---" * len(RUNNERS) + "|")
    for scenario in SCENARIOS:
        if only and scenario.name not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            verdicts = compare(session, scenario, tmp)
        cells = []
        for r in RUNNERS[1:]:
            verdict = verdicts[r]
            if verdict.startswith("DIFFERENT") and r in scenario.known_bug:
                verdict = f"known bug: {scenario.known_bug[r]}"
            cells.append(verdict if len(verdict) < 400 else verdict[:400] + "...")
        print(f"| {scenario.name} | " + " | ".join(cells) + " |", flush=True)
    session.stop()
