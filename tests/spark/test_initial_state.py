"""run_stream's initial state at scale: its rows reach the tasks through the checkpoint storage, not the driver."""

from __future__ import annotations

import pickle
from typing import Any, Iterator

import pandas as pd
import pytest
from pyspark.sql.streaming import StatefulProcessor

from buffering.spark import run_stream
from buffering.spark._initial_state import INITIAL_STATE_DIR, InitialStateFiles
from checkpoint import CheckpointStorage

from .helpers import collect_sink, stream_of, write_batches

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: Keys of the initial state: far more than any row count the driver may collect in the test.
KEYS = 3_000
ROWS = pd.DataFrame({"id": [0, 7, 7, KEYS - 1, KEYS + 5], "v": [1, 2, 3, 4, 5]})  # key KEYS + 5 has no initial row
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
TWS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class SeededSum(StatefulProcessor):
    """A sum per key, seeded by the key's initial value."""

    def init(self, handle: Any) -> None:
        self.total = handle.getValueState("total", "total long")

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        self.total.update((int(initialState["initVal"].sum()),))

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        total = (self.total.get()[0] if self.total.exists() else 0) + sum(int(pdf["v"].sum()) for pdf in rows)
        self.total.update((total,))
        yield pd.DataFrame({"id": [key[0]], "total": [total]})

    def close(self) -> None:
        pass


def _rows(out: list) -> list[tuple]:
    return sorted(tuple(int(v) for v in row) for _, f in out for row in f[["id", "total"]].itertuples(index=False, name=None))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_the_initial_state_reaches_the_tasks_without_the_driver_collecting_its_rows(spark, tmp_path, monkeypatch, request, where):
    from pyspark.sql.classic.dataframe import DataFrame

    location, options = str(tmp_path / "ck"), {}
    if where == "s3":  # the files go through fsspec (s3fs) like the checkpoint's own
        location, options = request.getfixturevalue("s3_location"), request.getfixturevalue("s3_options")
    source = write_batches(str(tmp_path / "in"), [ROWS])
    initial = spark.range(KEYS).selectExpr("id", "id * 10 as initVal")  # made by Spark: never in the driver
    collected: list[int] = []  # the rows of every collect on the driver
    for name in ("collect", "toPandas", "toArrow"):
        original = getattr(DataFrame, name)

        def counting(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            result = _original(self, *args, **kwargs)
            collected.append(result.num_rows if hasattr(result, "num_rows") else len(result))
            return result

        monkeypatch.setattr(DataFrame, name, counting)
    out: list = []
    query = run_stream(
        stream_of(spark, source, "id long, v long"), SeededSum(), key="id", output_schema="id long, total long",
        checkpoint_location=location, storage_options=options, spark_checkpoint_location=str(tmp_path / "spark"),
        sink=collect_sink(out), trigger={"availableNow": True}, parallelism=3, initial_state=initial,
    )
    query.awaitTermination()
    assert max(collected) <= len(ROWS)  # report rows and the sink's output rows, never the initial state's
    files = query.runner.plan.initial_state
    assert isinstance(files, InitialStateFiles) and files.rows == KEYS
    assert len(pickle.dumps(files)) < 2_000  # the plan says where the rows are, it does not hold them
    storage = CheckpointStorage(location, storage_options=options, create=False)
    assert storage.files_in(INITIAL_STATE_DIR) == sorted(p.path for p in files.parts if p is not None)

    # Spark's own operator, seeded with the same initial state, gives the same output.
    previous = spark.conf.get(PROVIDER_CONF, None)
    spark.conf.set(PROVIDER_CONF, TWS_PROVIDER)  # Spark's transformWithState takes no other
    try:
        expected: list = []
        (
            stream_of(spark, source, "id long, v long").groupBy("id")
            .transformWithStateInPandas(SeededSum(), "id long, total long", "Update", "None", initialState=initial.groupBy("id"))
            .writeStream.outputMode("update").foreachBatch(collect_sink(expected))
            .option("checkpointLocation", str(tmp_path / "ck-spark")).trigger(availableNow=True).start().awaitTermination()
        )
    finally:
        spark.conf.unset(PROVIDER_CONF) if previous is None else spark.conf.set(PROVIDER_CONF, previous)
    assert _rows(out) == _rows(expected) == [(0, 1), (7, 75), (KEYS - 1, 10 * (KEYS - 1) + 4), (KEYS + 5, 5)]
