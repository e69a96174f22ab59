"""Moving a live applyInPandasWithState job's state into opbuffer (import_state) and back out (export_state).

The job: per key, a count and a sum of ``v`` in its state, and an event-time
GroupState timeout 30 s after the key's latest event, which emits ``n = -1`` and
removes the state. The first three files run under Spark's own
applyInPandasWithState; its state is imported; the last two files run under
run_stream (or LocalRunner). The reference runs all five files under Spark.

Timeouts, with a 10 s watermark delay (seconds of event time):

* ``b`` (timeout 130) fires in Spark's own run, before the import (watermark 131);
* ``d`` (timeout 148, set under Spark) fires after the import, in the last
  batch (watermark 150): an imported timer;
* nothing is due at the end, where Spark runs one more batch without data and
  run_stream does not;
* ``g`` (event time 105) comes after the import, late for the watermark 131
  Spark reached before it: dropped only if the watermark came over. (In the
  reference run Spark runs that batch right after the previous one with data
  and drops at or before the watermark before it, 110; see the README's
  documented differences.)
"""

from __future__ import annotations

import os

import pandas as pd
import pytest

from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import StructType

from buffering import LocalRunner, cached_state
from buffering.spark import export_state, import_state, run_stream
from checkpoint import CheckpointStorage, CheckpointTrustError
from checkpoint.export import export_state as export_state_pandas

from .helpers import collect_sink, stream_of, write_batches

pytestmark = [pytest.mark.spark, pytest.mark.slow]

INPUT = "k string, v long, ts timestamp"
OUTPUT = "k string, n long, s double"
STATE = "n long, s double"
DELAY_MS = 10_000
KEY = "import-test-key"


def counts_with_timeout(key, rows, state):
    """Count and sum per key; times out 30 s of event time after the key's latest row."""
    if state.hasTimedOut:
        state.remove()
        yield pd.DataFrame({"k": [key[0]], "n": [-1], "s": [0.0]})
        return
    n, s = state.get if state.exists else (0, 0.0)
    latest = None
    for pdf in rows:
        n += len(pdf)
        s += float(pdf["v"].sum())
        top = int(pd.to_datetime(pdf["ts"]).max().value // 1_000_000)
        latest = top if latest is None else max(latest, top)
    state.update((n, s))
    state.setTimeoutTimestamp(latest + 30_000)
    yield pd.DataFrame({"k": [key[0]], "n": [n], "s": [s]})


def _frame(rows: list[tuple[str, int, int]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "k": [k for k, _, _ in rows],
            "v": [v for _, v, _ in rows],
            "ts": pd.to_datetime([t for _, _, t in rows], unit="s").astype("datetime64[us]"),
        }
    )


FRAMES = [
    _frame([("a", 1, 100), ("b", 2, 100), ("c", 3, 105)]),
    _frame([("a", 4, 120), ("d", 5, 118)]),
    _frame([("c", 6, 141)]),
    # after the import
    _frame([("a", 7, 150), ("e", 8, 150), ("f", 9, 160), ("g", 1, 105)]),  # g: late
    _frame([("e", 10, 170), ("a", 11, 165)]),
]
FIRST = 3


def _spark_query(spark, directory: str, checkpoint: str) -> list[tuple[int, pd.DataFrame]]:
    out: list[tuple[int, pd.DataFrame]] = []
    query = (
        stream_of(spark, directory, INPUT)
        .withWatermark("ts", "10 seconds")
        .groupBy("k")
        .applyInPandasWithState(counts_with_timeout, OUTPUT, STATE, "Update", "EventTimeTimeout")
        .writeStream.outputMode("update")
        .foreachBatch(collect_sink(out))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return out


def _rows(batches) -> list[tuple]:
    frames = [pdf for _, pdf in batches if len(pdf)]
    if not frames:
        return []
    return sorted(tuple(r) for r in pd.concat(frames)[["k", "n", "s"]].itertuples(index=False, name=None))


def _spark_state(spark, checkpoint: str) -> list[tuple]:
    """(k, n, s, timeout) of every key in a Spark checkpoint, read with Spark's state data source."""
    frame = spark.read.format("statestore").load(checkpoint)
    rows = frame.select("key.k", "value.groupState.n", "value.groupState.s", "value.timeoutTimestamp").collect()
    return sorted(tuple(r) for r in rows)


@pytest.fixture(scope="module")
def live_job(spark, tmp_path_factory):
    """The first files run under Spark (its checkpoint and outputs) and the all-Spark reference run."""
    root = tmp_path_factory.mktemp("import-state")
    first = write_batches(str(root / "first"), FRAMES[:FIRST])
    everything = write_batches(str(root / "all"), FRAMES)
    spark_checkpoint = str(root / "spark-first")
    first_out = _spark_query(spark, first, spark_checkpoint)
    reference_checkpoint = str(root / "spark-all")
    reference_out = _spark_query(spark, everything, reference_checkpoint)
    return {
        "spark_checkpoint": spark_checkpoint,
        "first_out": first_out,
        "reference_out": reference_out,
        "reference_state": _spark_state(spark, reference_checkpoint),
        "imported_state": _spark_state(spark, spark_checkpoint),
    }


def _rest_directory(tmp_path) -> str:
    # The remaining files keep their names and times of the reference run.
    directory = str(tmp_path / "rest")
    write_batches(directory, FRAMES)
    for i in range(FIRST):
        os.remove(os.path.join(directory, f"part-{i:05d}.parquet"))
    return directory


def _opbuffer_state(checkpoint: str, **kwargs) -> list[tuple]:
    frame = export_state_pandas(checkpoint, state_schema=STATE, timeout_column="timeout", **kwargs)
    return sorted(tuple(r) for r in frame.itertuples(index=False, name=None))


def test_run_stream_goes_on_from_an_imported_applyinpandaswithstate_job_with_the_same_outputs_and_state(
    spark, live_job, tmp_path
):
    checkpoint = str(tmp_path / "opbuffer")
    manifest = import_state(spark, live_job["spark_checkpoint"], checkpoint, key="k", state_schema=STATE)
    assert manifest.version == 0
    out: list[tuple[int, pd.DataFrame]] = []
    query = run_stream(
        stream_of(spark, _rest_directory(tmp_path), INPUT),
        counts_with_timeout,
        key="k",
        output_schema=OUTPUT,
        checkpoint_location=checkpoint,
        sink=collect_sink(out),
        parallelism=2,
        timeout="event",
        event_time="ts",
        watermark_delay_ms=DELAY_MS,
        state_schema=STATE,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    # Spark's batches 0 and 1 of the new query, then the batch without data that ends the availableNow run
    # (the watermark moved): versions 1 to 3.
    assert [b for b, _ in out] == [1, 2, 3]
    assert ("d", -1, 0.0) in _rows(out)  # the timer imported from Spark's state fired
    assert sorted(_rows(live_job["first_out"]) + _rows(out)) == _rows(live_job["reference_out"])
    assert _opbuffer_state(checkpoint) == live_job["reference_state"]


def test_local_runner_goes_on_from_an_imported_job_with_the_same_outputs_and_state(spark, live_job, tmp_path):
    checkpoint = str(tmp_path / "opbuffer")
    import_state(spark, live_job["spark_checkpoint"], checkpoint, parallelism=3)
    runner = LocalRunner(
        counts_with_timeout,
        key="k",
        checkpoint_location=checkpoint,
        parallelism=2,
        timeout="event",
        event_time="ts",
        watermark_delay_ms=DELAY_MS,
        state_schema=STATE,
    )
    try:
        outputs = [(i, runner.process(frame)) for i, frame in enumerate(FRAMES[FIRST:])]
    finally:
        runner.close()
    assert sorted(_rows(live_job["first_out"]) + _rows(outputs)) == _rows(live_job["reference_out"])
    assert _opbuffer_state(checkpoint) == live_job["reference_state"]


def test_imported_state_reads_back_as_the_function_saw_it_under_spark(spark, live_job, tmp_path):
    checkpoint = str(tmp_path / "opbuffer")
    import_state(spark, live_job["spark_checkpoint"], checkpoint)
    runner = LocalRunner(counts_with_timeout, key="k", checkpoint_location=checkpoint, timeout="event", event_time="ts")
    try:
        states = runner.state()
    finally:
        runner.close()
    assert states == {(k,): (n, s) for k, n, s, _ in live_job["imported_state"]}
    assert all(type(n) is int and type(s) is float for n, s in states.values())


def test_an_import_with_a_checkpoint_key_is_signed(spark, live_job, tmp_path):
    checkpoint = str(tmp_path / "opbuffer")
    import_state(spark, live_job["spark_checkpoint"], checkpoint, checkpoint_key=KEY)
    with pytest.raises(CheckpointTrustError):
        CheckpointStorage(checkpoint, checkpoint_key="another-key").read_manifest(0)
    assert _opbuffer_state(checkpoint, checkpoint_key=KEY) == live_job["imported_state"]


def test_export_gives_back_the_state_and_timeouts_spark_had(spark, live_job, tmp_path):
    checkpoint = str(tmp_path / "opbuffer")
    import_state(spark, live_job["spark_checkpoint"], checkpoint)
    exported = export_state(spark, checkpoint, timeout_column="timeout")  # the import recorded the state schema
    assert exported.schema.simpleString() == "struct<k:string,n:bigint,s:double,timeout:bigint>"
    assert sorted(tuple(r) for r in exported.collect()) == live_job["imported_state"]


def test_import_refuses_a_checkpoint_that_already_has_versions(spark, live_job, tmp_path):
    checkpoint = str(tmp_path / "opbuffer")
    import_state(spark, live_job["spark_checkpoint"], checkpoint)
    with pytest.raises(ValueError, match=r"already holds versions \[0\]"):
        import_state(spark, live_job["spark_checkpoint"], checkpoint)


def test_import_refuses_a_key_other_than_the_spark_query_grouped_by(spark, live_job, tmp_path):
    with pytest.raises(ValueError, match=r"key=\['user'\], but the Spark query grouped by \['k'\]"):
        import_state(spark, live_job["spark_checkpoint"], str(tmp_path / "opbuffer"), key="user")


def test_import_refuses_a_state_schema_other_than_the_one_spark_stored(spark, live_job, tmp_path):
    with pytest.raises(ValueError, match=r"but Spark stored the state as struct<n:bigint,s:double>"):
        import_state(spark, live_job["spark_checkpoint"], str(tmp_path / "opbuffer"), state_schema="n long")


def test_import_names_the_operators_of_a_checkpoint_without_the_one_asked_for(spark, live_job, tmp_path):
    with pytest.raises(ValueError, match=r"no stateful operator 1; it has \[\(0, 'applyInPandasWithState'\)\]"):
        import_state(spark, live_job["spark_checkpoint"], str(tmp_path / "opbuffer"), operator_id=1)


def test_cli_import_spark_writes_version_0_that_export_reads_back(spark, live_job, tmp_path, capsys):
    from checkpoint.__main__ import main

    checkpoint = str(tmp_path / "opbuffer")
    argv = ["import-spark", live_job["spark_checkpoint"], checkpoint, "--key", "k", "--watermark-delay-ms", "10000"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"as version 0 of {checkpoint}: key ['k'] (string), state (n bigint, s double)" in out
    assert CheckpointStorage(checkpoint).read_manifest(0).metadata["max_event_time_ms"] == 131_000 + DELAY_MS
    assert _opbuffer_state(checkpoint) == live_job["imported_state"]


def test_cli_import_spark_of_a_directory_without_a_spark_query_fails_with_a_message(spark, tmp_path, capsys):
    from checkpoint.__main__ import main

    assert main(["import-spark", str(tmp_path / "nothing"), str(tmp_path / "opbuffer")]) == 1
    assert "holds no state of a stateful Spark query" in capsys.readouterr().err


# ---------------------------------------------------------------- a transformWithStateInPandas processor


class CountsListsMaps(StatefulProcessor):
    """A count (ValueState), the values in order (ListState), a count per value (MapState), a 30 s event-time timer."""

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.recent = handle.getListState("recent", "v long")
        self.per_value = handle.getMapState("per_value", "v long", "c long")

    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        latest = None
        for pdf in rows:
            for v in pdf["v"].tolist():
                n += 1
                self.recent.appendValue((v,))
                seen = self.per_value.getValue((v,))
                self.per_value.updateValue((v,), ((seen[0] if seen else 0) + 1,))
            top = int(pd.to_datetime(pdf["ts"]).max().value // 1_000_000)
            latest = top if latest is None else max(latest, top)
        self.count.update((n,))
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        self.handle.registerTimer(latest + 30_000)
        recent = ",".join(str(r[0]) for r in self.recent.get())
        yield pd.DataFrame({"k": [key[0]], "n": [n], "recent": [recent], "kinds": [len(list(self.per_value.keys()))]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        self.count.clear()
        self.recent.clear()
        self.per_value.clear()
        yield pd.DataFrame({"k": [key[0]], "n": [-1], "recent": [""], "kinds": [0]})

    def close(self):
        pass


TWS_OUTPUT = "k string, n long, recent string, kinds long"
TWS_FRAMES = [frame[frame["k"] != "g"].reset_index(drop=True) for frame in FRAMES]  # no late row: see above
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _tws_query(spark, directory: str, checkpoint: str) -> list[tuple[int, pd.DataFrame]]:
    out: list[tuple[int, pd.DataFrame]] = []
    conf = "spark.sql.streaming.stateStore.providerClass"
    before = spark.conf.get(conf)
    spark.conf.set(conf, ROCKSDB)  # transformWithState needs it; the query keeps it in its checkpoint
    try:
        query = (
            stream_of(spark, directory, INPUT)
            .withWatermark("ts", "10 seconds")
            .groupBy("k")
            .transformWithStateInPandas(CountsListsMaps(), TWS_OUTPUT, "Update", "EventTime")
            .writeStream.outputMode("update")
            .foreachBatch(collect_sink(out))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
    finally:
        spark.conf.set(conf, before)
    query.awaitTermination()
    return out


def _tws_rows(batches) -> list[tuple]:
    frames = [pdf for _, pdf in batches if len(pdf)]
    return sorted(tuple(r) for r in pd.concat(frames)[["k", "n", "recent", "kinds"]].itertuples(index=False, name=None))


@pytest.fixture(scope="module")
def tws_job(spark, tmp_path_factory):
    """The first files under Spark's transformWithStateInPandas, and the all-Spark reference run."""
    root = tmp_path_factory.mktemp("import-tws")
    spark_checkpoint = str(root / "spark-first")
    first_out = _tws_query(spark, write_batches(str(root / "first"), TWS_FRAMES[:FIRST]), spark_checkpoint)
    reference_out = _tws_query(spark, write_batches(str(root / "all"), TWS_FRAMES), str(root / "spark-all"))
    return {"spark_checkpoint": spark_checkpoint, "first_out": first_out, "reference_out": reference_out}


def test_run_stream_goes_on_from_an_imported_transformwithstateinpandas_job_with_the_same_outputs(
    spark, tws_job, tmp_path
):
    rest = str(tmp_path / "rest")
    write_batches(rest, TWS_FRAMES)
    for i in range(FIRST):
        os.remove(os.path.join(rest, f"part-{i:05d}.parquet"))
    checkpoint = str(tmp_path / "opbuffer")
    import_state(
        spark, tws_job["spark_checkpoint"], checkpoint, key="k", processor=CountsListsMaps(), watermark_delay_ms=DELAY_MS
    )
    out: list[tuple[int, pd.DataFrame]] = []
    query = run_stream(
        stream_of(spark, rest, INPUT),
        CountsListsMaps(),
        key="k",
        output_schema=TWS_OUTPUT,
        checkpoint_location=checkpoint,
        sink=collect_sink(out),
        parallelism=2,
        time_mode="EventTime",
        event_time="ts",
        watermark_delay_ms=DELAY_MS,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    assert ("d", -1, "", 0) in _tws_rows(out)  # the timer imported from Spark's state fired
    assert ("a", 4, "1,4,7,11", 4) in _tws_rows(out)  # the list and map came over whole, in order
    assert sorted(_tws_rows(tws_job["first_out"]) + _tws_rows(out)) == _tws_rows(tws_job["reference_out"])


def test_local_runner_goes_on_from_an_imported_processor_with_the_same_outputs(spark, tws_job, tmp_path):
    checkpoint = str(tmp_path / "opbuffer")
    import_state(spark, tws_job["spark_checkpoint"], checkpoint, processor=CountsListsMaps(), watermark_delay_ms=DELAY_MS)
    runner = LocalRunner(
        CountsListsMaps(), key="k", checkpoint_location=checkpoint, time_mode="EventTime", event_time="ts",
        watermark_delay_ms=DELAY_MS,
    )
    try:
        outputs = [(i, runner.process(frame)) for i, frame in enumerate(TWS_FRAMES[FIRST:])]
    finally:
        runner.close()
    assert sorted(_tws_rows(tws_job["first_out"]) + _tws_rows(outputs)) == _tws_rows(tws_job["reference_out"])


def test_import_of_a_processors_state_needs_the_processor(spark, tws_job, tmp_path):
    with pytest.raises(ValueError, match=r"give processor= \(the StatefulProcessor the job runs\)"):
        import_state(spark, tws_job["spark_checkpoint"], str(tmp_path / "opbuffer"))


class OnlyACount(StatefulProcessor):
    def init(self, handle):
        self.count = handle.getValueState("count", "n long")
        self.recent = handle.getMapState("recent", "v long", "c long")

    def handleInputRows(self, key, rows, timerValues):
        yield pd.DataFrame()

    def close(self):
        pass


def test_import_refuses_a_processor_whose_variables_are_of_other_kinds(spark, tws_job, tmp_path):
    # Spark lists the variables in no fixed order: either mismatch is named first.
    wanted = r"but the processor's init\(\) creates \{'count': 'value state', 'recent': 'map state'\}"
    with pytest.raises(ValueError, match=wanted):
        import_state(spark, tws_job["spark_checkpoint"], str(tmp_path / "opbuffer"), processor=OnlyACount())


def test_cli_import_spark_of_a_processors_state_takes_the_processor_class(spark, tws_job, tmp_path, capsys):
    from checkpoint.__main__ import main

    checkpoint = str(tmp_path / "opbuffer")
    processor = "tests.spark.test_import_state:CountsListsMaps"
    assert main(["import-spark", tws_job["spark_checkpoint"], checkpoint, "--processor", processor]) == 0
    assert f"as version 0 of {checkpoint}: key ['k'] (string), " in capsys.readouterr().out
    assert CheckpointStorage(checkpoint).read_manifest(0).tables  # the processor's tables were written


def test_export_of_an_imported_processor_gives_back_each_variable_spark_had(spark, tws_job, tmp_path):
    checkpoint = str(tmp_path / "opbuffer")
    import_state(spark, tws_job["spark_checkpoint"], checkpoint, processor=CountsListsMaps())
    exported = export_state(spark, checkpoint, processor=CountsListsMaps())
    assert sorted(exported) == ["$timers", "count", "per_value", "recent"]

    def spark_rows(**options):
        reader = spark.read.format("statestore")
        for name, value in options.items():
            reader = reader.option(name, value)
        frame = reader.load(tws_job["spark_checkpoint"])
        return sorted(tuple(r) for r in frame.drop("partition_id").select("key.k", *[
            c + ".*" if isinstance(frame.schema[c].dataType, StructType) else c for c in frame.columns[1:-1]
        ]).collect())

    assert sorted(tuple(r) for r in exported["count"].collect()) == spark_rows(stateVarName="count")
    assert sorted(tuple(r) for r in exported["per_value"].collect()) == spark_rows(stateVarName="per_value")
    assert sorted(tuple(r) for r in exported["$timers"].collect()) == spark_rows(readRegisteredTimers="true")
    assert exported["recent"].schema.simpleString() == "struct<k:string,v:bigint>"


def count_and_sum(key, rows, state):
    n, s = state.get if state.exists else (0, 0.0)
    for pdf in rows:
        n += len(pdf)
        s += float(pdf["v"].sum())
    state.update((n, s))
    yield pd.DataFrame({"k": [key[0]], "n": [n], "s": [s]})


def _state_after_one_batch_at(spark, live_job, tmp_path, since_import_ms: int) -> dict:
    """Import with ttl_ms=60 s, then one LocalRunner batch (a row of key a) ``since_import_ms`` after the import."""
    checkpoint = str(tmp_path / "opbuffer")
    import_state(spark, live_job["spark_checkpoint"], checkpoint, ttl_ms=60_000)
    imported_at = CheckpointStorage(checkpoint).read_manifest(0).metadata["processing_time_ms"]
    runner = LocalRunner(
        cached_state(ttl_ms=60_000)(count_and_sum), key="k", checkpoint_location=checkpoint,
        clock=lambda: imported_at + since_import_ms,
    )
    try:
        runner.process(pd.DataFrame({"k": ["a"], "v": [7], "ts": pd.to_datetime([150], unit="s")}))
        return runner.state()
    finally:
        runner.close()


def test_imported_keys_expire_ttl_ms_after_the_import(spark, live_job, tmp_path):
    # Spark's rule: expired once the processing time reaches the expiry. a starts anew; c and d are gone.
    assert _state_after_one_batch_at(spark, live_job, tmp_path, 60_000) == {("a",): (1, 7.0)}


def test_imported_keys_live_until_ttl_ms_after_the_import(spark, live_job, tmp_path):
    assert _state_after_one_batch_at(spark, live_job, tmp_path, 59_999) == {
        ("a",): (3, 12.0),
        ("c",): (2, 9.0),
        ("d",): (1, 5.0),
    }
