"""The key a function receives has Spark's element types, for date, boolean and binary keys with nulls too."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest

from buffering import LocalRunner

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def describe(key) -> str:
    return repr([(f"{type(k).__module__}.{type(k).__name__}", repr(k)) for k in key])


def test_date_boolean_and_binary_keys_reach_the_function_as_spark_hands_them(spark, tmp_path):
    from pyspark.sql.streaming.state import GroupStateTimeout

    pd.DataFrame({"d": [dt.date(2024, 1, 2), None], "b": [True, None], "y": [b"ab", None], "v": [1, 2]}).to_parquet(
        tmp_path / "x.parquet"
    )
    stream = spark.readStream.schema("d date, b boolean, y binary, v long").parquet(str(tmp_path))

    def via_spark(key, rows, state):
        for _ in rows:
            pass
        yield pd.DataFrame({"desc": [describe(key)]})

    seen_by_spark: list[str] = []
    query = (
        stream.groupBy("d", "b", "y")
        .applyInPandasWithState(via_spark, "desc string", "c long", "Update", GroupStateTimeout.NoTimeout)
        .writeStream.outputMode("update")
        .foreachBatch(lambda batch, _: seen_by_spark.extend(row.desc for row in batch.collect()))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()

    seen_locally: list[str] = []

    def locally(key, rows, state):
        seen_locally.append(describe(key))
        yield pd.DataFrame({"x": [1]})

    LocalRunner(locally, key=["d", "b", "y"], key_types=["date", "boolean", "binary"]).process(
        pd.read_parquet(tmp_path / "x.parquet")
    )
    assert len(seen_by_spark) == 2
    assert sorted(seen_locally) == sorted(seen_by_spark)
